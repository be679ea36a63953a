"""Sharing rules meant to transfer skill between peers: which external groups a node trains on, and
the advantage each external completion gets.

Owns: the per-family success baseline of the receiver, the receiver-baseline and positive-only
advantages, teaching-value selection, the joint-group advantage, the own-demonstration anchor and
``replay``'s memory of verified demonstrations (``DemoMemory``).
Must not: score, tokenize, run a model or do I/O (the trainer feeds in rewards our own verifier
gave and family keys).

Why (ALGORITHMS.md §10, #14's first probe): a specialist's groups on its own family are mostly all
correct, so SAPO's zero-advantage filter discards exactly its demonstrations, and GRPO's per-group
baseline gives an all-correct group advantage 0 even when it is on a family the receiver never gets
right. What a foreign completion teaches the receiver depends on the *receiver's* competence on
that prompt's family, not on the sender's other completions.

Rules (``swarm.mixing``; own groups with signal get the usual GRPO advantage in every one,
external rows are scored under the receiver's own policy as SAPO does: ``pi_old`` is ours, no
importance correction toward the sender)::

    S(y)           = 1 if our verifier gave y full reward, else 0 (``success``)
    b_f            = receiver's success rate on family f: EWMA (weight ``alpha``) of the share of
                     full rewards among its *own* groups' completions of f, one sample per round
                     (``FamilyBaseline``)
    receiver_baseline:  A(y) = S(y) - b_f                 every external completion
    positive_only:      A(y) = max(S(y) - b_f, 0)         only foreign successes beyond our own rate
    joint:              A(y) = (R(y) - mean(R_u)) / (std(R_u) + eps)
                        over the union u of our completions and the peers' on the same prompt
                        (the probe's joint groups; HACPO's joint baseline without its ratio band)
    anchored:           external as receiver_baseline, plus up to I own *demonstrations* (own groups
                        whose every completion is correct, which the zero-advantage filter drops):
                        A(y) = R(y) = 1                   our own verified successes, replayed
    replay:             anchored, plus K remembered verified successes a round (below):
                        A(y) = 1 - b_f                    each one a one-completion group

``receiver_baseline`` is advantage-weighted regression (Peng et al., arXiv 1910.00177) toward the
peers' completions with the receiver's own value estimate as the baseline: a correct foreign answer
on a family we solve 10% of the time gets +0.9, a wrong one -0.1; on a family we solve 95% of the
time a peer's correct answer gets +0.05 and its error -0.95, which protects our own skill from its
mistakes. ``positive_only`` drops the negative half (rejection-sampling fine-tuning on foreign
successes: RAFT, arXiv 2304.06767; ReST, arXiv 2308.08998): a peer's error says little about our
policy, whose probability of it may be tiny. A family we have never answered has ``b_f = 0``.

Success, not reward: some reasoning-gym scorers give partial credit to a wrong answer that contains
the right one (``len(answer) / len(completion)``: "130" for 13 scores 0.67). With A = R - b_f such
an answer is a lesson (+0.6 where we are weak), and a peer sending 59 wrong variants per group took
every external slot and cost its receivers their own skill (red team rt33 F2: own family 0.77 ->
0.07). A foreign completion teaches only when it is right.

The own-skill anchor (``anchored``): a specialist's groups on its own family are all
correct, so under the rules above nothing in an update speaks for that family while the J foreign
demonstrations pull the shared weights elsewhere (plausibly the tiny specialist never needed to
read the operator, so learning another one moves every answer). Replaying our own verified successes is
rehearsal against catastrophic forgetting (Robins 1995; experience replay, Rolnick et al., arXiv
1811.11682) with data we already have: each update becomes multi-task imitation over our family
and the ones peers teach. Its gradient, ``grad log pi(y)`` for a correct y, grows as our own
probability of the right answer falls: a restoring force, small while the skill is intact.
On-policy it is REINFORCE without a baseline on the rows SAPO throws away (RAFT on our own samples).
Measured (simulations/specialists.py --reduced, 200 rounds, 2 seeds, the same warm starts): own
family 0.978 -> 0.707 +- 0.053 against receiver_baseline's 0.597 +- 0.045, peers' families 0.107
against 0.108: it keeps 11 points of own skill and transfers no more; the goal (own within 5
points) is not met, since most of the loss comes in the first 60 rounds, while our probability of
the right answer is still near 1 and the anchor's gradient near 0.

Tried and not kept (simulations/specialists.py, 200 rounds, 2 seeds): a separate imitation step
on the same demonstrations, ``-1/N sum_i w_i * mean_t log pi(y_i,t)`` with its own AdamW at the
warm start's supervised lr (1e-3; the RL step moves at 1e-4, and with Adam only the step size,
not the loss's scale, speeds learning). Every agent collapsed to a near-constant answer within 20
rounds (own family 0.98 -> 0.08, peers' families 0.08): a fresh AdamW moves every weight by about
its lr on its first steps, whatever the gradient.

The demonstration replay (``replay``): ``anchored``, plus K replayed demonstrations a round from a
memory of verified successes (``DemoMemory``), so that an update sees many distinct prompts of the
families it is weak at instead of the few the swarm answered this round::

    memory      = per family, up to ``per_family`` prompts, each with the first answers of
                  up to 8 senders (ours and our peers'): completions our verifier gave full
                  reward that end (EOS) and spell the task's answer character for character;
                  a sender owns 1/k of a prompt with k answers, and a full family drops the
                  oldest answer of the sender owning the most
    replay:     external and own as anchored, plus K rows from the memory: each row goes to a
                family f with probability proportional to 1 - b_f (empty if f has no answer
                left), then a family's rows are drawn round its senders in turn (a sender in
                several families drawn: its part of f's rows, at most its answers there, over
                its parts of all of them, as its turn in f, from a random phase), each giving
                its answer to one of its prompts (one not drawn yet while it has any); each row is a
                one-completion external group with S = 1, so A = 1 - b_f (receiver_baseline's
                advantage, at replay)

Why: with the same prompts answered by every agent (or a few prompts a round), the J external
groups hold at most J distinct prompts, about 6 of them on the families a specialist lacks, and
their 8 completions say the same thing 8 times. Plain supervised training of a specialist on 64
distinct tasks a step, at the RL step's lr (1e-4), learnt its peers' 1-digit families in about
800 steps (the add specialist: sub 0.05 -> 0.89, mul 0.12 -> 0.99; the 1-decimal sums not:
0.03 -> 0.06 at 1,000 steps; simulations/imitation_bound.py); the baseline rules reached about
0.39 in 1,000 rounds. Replay is experience replay (Lin 1992; for
forgetting, Rolnick et al., arXiv 1811.11682) of verified successes, as ReST grows its dataset
(arXiv 2308.08998), restricted to what our own verifier accepts. The weight 1 - b_f spends the
rows on families we are weak at and stops replaying one we have learnt; if we forget it, b_f
falls and replay resumes. A sender can only add completions our verifier accepted, spelling the
task's answer exactly as the task does, with no space around it, and ending (a scorer also
accepts "07", "+7", "7.0" or "   7": red team rt51 F3, rt52 F3; such a spelling, or a completion
cut at the token cap, replayed, is taught to us). Ownership by share and the round robin are
what keeps an identity to one sender's part of the rows, however early, often or distinctly it
answers, while a family's one teacher still fills its rows (``DemoMemory`` has the attacks). Measured
(simulations/specialists.py, 1,000 rounds, seeds 0-2, J = K = 8 / 64, every rule on the same
warm starts): peers' families 0.030 -> 0.591 +- 0.022 (positive_only 0.409, anchored 0.362; the
first memory, kept first per prompt, 0.603); own family 0.995 -> 0.877 +- 0.008 (anchored 0.783);
1.9x anchored's CPU a round. The same supervised loop with perfect answers reaches 0.744
(simulations/imitation_bound.py).

Selection (every baseline rule, i.e. all but joint): the J external groups with the largest
*teaching value* ``sum_y max(A(y), 0)`` (ties in a random order from the trainer's rng), among
those with value > 0, at most one per prompt and at most ceil(J / senders) from each sender while
others have any (``select_teaching``); every external group counts for at most our own group size
(the trainer clips it). Values come from rewards our verifier gave, so a sender cannot inflate them;
what it can do is send correct answers on families we are weak at, which is what we want from it.

The joint rule needs the prompts the receiver answered itself (``learning.shared_tasks``, or a
node that answers the prompts it receives); an external group on a prompt we did not answer keeps
its own group's advantage, as SAPO. Its J external groups are drawn among those whose joint
rewards are not all equal, fairly over their senders as SAPO's (``learn.sapo.fair_sample``); our
groups on the same prompts come first among the I own ones.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import torch

from swarmnode.learn.advantages import Scale, group_advantages, zero_advantage
from swarmnode.tasks.scoring import solved

KeyT = TypeVar("KeyT", bound=Hashable)
T = TypeVar("T")


class FamilyBaseline:
    """The receiver's success rate per task family: an EWMA of its own groups' mean reward.

    Bounded by the number of families in the node's own mixture (only own groups update it)."""

    def __init__(self, alpha: float = 0.1) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.alpha = alpha
        self._rate: dict[str, float] = {}

    def update(self, samples: Mapping[str, Sequence[float]]) -> None:
        """One round's own rewards per family (the share of full rewards is one EWMA sample)."""
        for family, rewards in samples.items():
            if not rewards:
                continue
            if not all(math.isfinite(r) for r in rewards):
                raise ValueError(f"rewards of family {family!r} must be finite")
            mean = sum(success(r) for r in rewards) / len(rewards)
            old = self._rate.get(family)
            self._rate[family] = mean if old is None else (1 - self.alpha) * old + self.alpha * mean

    def rate(self, family: str) -> float:
        """b_f (0.0 for a family never answered: a foreign success there teaches the most)."""
        return self._rate.get(family, 0.0)

    def state_dict(self) -> dict[str, float]:
        return dict(self._rate)

    def load_state_dict(self, state: Mapping[str, float]) -> None:
        self._rate = {str(k): float(v) for k, v in state.items()}


def success(reward: float) -> float:
    """S(y): 1.0 for a full reward, else 0.0 (partial credit is no success: ``solved``)."""
    return 1.0 if solved(reward) else 0.0


def receiver_advantages(rewards: Sequence[float], baseline: float, *, positive_only: bool) -> list[float]:
    """A(y) = S(y) - b (or max(S(y) - b, 0)) for each external completion of one group."""
    if positive_only:
        return [max(success(r) - baseline, 0.0) for r in rewards]
    return [success(r) - baseline for r in rewards]


def is_demonstration(rewards: Sequence[float]) -> bool:
    """An own group whose every completion earned full reward (an anchor of ``anchored``)."""
    return bool(rewards) and all(solved(r) for r in rewards)


def anchor_advantages(rewards: Sequence[float]) -> list[float]:
    """A(y) = R(y): our own verified successes, no baseline (b_f would make them ~0 where we are strong)."""
    return [float(r) for r in rewards]


def teaching_value(advantages: Sequence[float]) -> float:
    """How much a group can teach: the sum of its positive advantages."""
    return sum(a for a in advantages if a > 0)


def select_teaching(
    candidates: Sequence[tuple[T, float, Hashable, Hashable]], n: int, rng: random.Random
) -> list[T]:
    """The ``n`` items of largest value (> 0) among ``(item, value, sender, prompt)``: at most one
    per prompt, and at most a fair share (ceil(n / senders with any)) from each sender while
    others' remain; ties in ``rng``'s order.

    Values come from our own verifier, but one sender may still hold every group of the largest
    value (it sends more, or better): ranked alone, one peer's groups took all J places and the
    honest peers' none (red team rt33 F1). Signers are free, so one group sent by ten of them,
    each copy a character apart, took every place as well (rt36 F2): a prompt teaches once. What
    no one else fills is filled by value."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    order = list(range(len(candidates)))
    rng.shuffle(order)
    order.sort(key=lambda i: -candidates[i][1])  # stable: equal values keep the shuffled order
    valued = [i for i in order if candidates[i][1] > 0]
    senders = {candidates[i][2] for i in valued}
    share = -(-n // len(senders)) if senders else 0
    taken: dict[Hashable, int] = {}
    prompts: set[Hashable] = set()
    chosen: set[int] = set()
    for fair in (True, False):  # within each sender's share first, then by value alone
        for i in valued:
            _, _, sender, prompt = candidates[i]
            if len(chosen) >= n or prompt in prompts or (fair and taken.get(sender, 0) >= share):
                continue
            taken[sender] = taken.get(sender, 0) + 1
            prompts.add(prompt)
            chosen.add(i)
    return [candidates[i][0] for i in valued if i in chosen]


class _Family:
    """One family of a ``DemoMemory``: its prompts (oldest first), each with its answers by
    sender, and each sender's prompts (oldest first) and share of them."""

    def __init__(self) -> None:
        self.answers: dict[Hashable, dict[Hashable, Any]] = {}  # prompt -> sender -> item
        self.prompts_of: dict[Hashable, deque[Hashable]] = {}  # sender -> its prompts, oldest first
        self.share: dict[Hashable, float] = {}  # sender -> sum over its prompts of 1 / their answers

    def add(self, prompt: Hashable, sender: Hashable, item: Any) -> None:
        answers = self.answers.setdefault(prompt, {})
        self._own(answers, -1.0)
        answers[sender] = item
        self.prompts_of.setdefault(sender, deque()).append(prompt)
        self.share.setdefault(sender, 0.0)
        self._own(answers, +1.0)

    def drop_answer(self, sender: Hashable) -> None:
        """Drop the answer of ``sender`` to its oldest prompt (and the prompt with its last answer)."""
        prompt = self.prompts_of[sender].popleft()
        answers = self.answers[prompt]
        self._own(answers, -1.0)
        del answers[sender]
        self._own(answers, +1.0)
        if not self.prompts_of[sender]:
            del self.prompts_of[sender], self.share[sender]
        if not answers:
            del self.answers[prompt]

    def _own(self, answers: dict[Hashable, Any], sign: float) -> None:
        """Give (+1) or take back (-1) each answerer's 1/k of a prompt with k answers."""
        for who in answers:
            self.share[who] += sign / len(answers)


class DemoMemory(Generic[T]):
    """Verified demonstrations kept across rounds for ``replay``: at most ``per_family`` prompts a
    family, each with the answers of at most ``answers_per_prompt`` senders (each sender's first).
    A sender owns 1/k of each prompt it is one of k answerers of; a family full, the sender owning
    the most drops its answer to its oldest prompt until a prompt has no answer left. A draw of n
    rows gives each to a family by weight (left empty if the family has no answer left), then,
    family by family, goes round the senders in a random order, each giving its answer to one of
    its prompts, one not drawn yet while it has any, until the family's rows are drawn: every
    sender gives as many rows as any other while it has answers (max-min fair), and a sender
    answering several of the families drawn has, in each, its part of the rows it can give in
    all of them (a family's rows, at most its answers there) as its turn, from a random phase:
    a part of a turn is given in expectation however few rows a family has (red team rt57 F1:
    from 0, the node's own answers in 16 families got 0.6 rows a sample against a specialist's
    3.7), and one lucky answer elsewhere costs a specialist no turn at home (rt57 F2). Turns are
    measured against the largest turn among the senders with answers left: with "no whole turn,
    every sender gives a row a pass", a specialist with one stray answer elsewhere had no whole
    turn at home, and an identity answering every family gave as many rows as each specialist, in
    every family (3.5x a specialist's rows: rt58 F1). Open (rt59 F2, low): an identity answering
    only the families that have no specialist (where an every-family sender's part of a turn
    is small) is the top turn there and gets about 1.3x an honest every-family sender's rows;
    specialists keep theirs. A max-min split of the rows over every family drawn at once would
    close it.
    Families are bounded by the caller (the node's own mixture: admission refuses others).

    Task ids are public, so one sender can answer every prompt. Replaced by the newest answer,
    one identity re-answering the honest peers' prompts took 192 of 256 entries and 47 of 64
    draws (red team rt50 F1); kept first per prompt, one answering the round's prompts before
    anyone (they follow from the public seed) held all 256 entries and every draw (rt51 F1);
    entries per (prompt, sender), one answering distinct prompts while the honest peers answered
    the same ones took 34-40% of the rows (rt52 F1), and a quota per sender against it starved
    a family's one teacher (rt53 F1, F2). Owned by share, an identity's distinct prompts cost it
    as much as every answerer of a shared one pays together, and the round robin gives it one
    sender's rows, also while the memory is young (rt54 F1: honest senders kept their turns only
    while they had prompts not drawn yet). Signers are free, so many identities still get many
    shares (rt50 F2, open: a quota for senders without standing needs the peer book here). An
    identity adding its answer to every prompt owns half of each, so it stores about twice the
    answers of an honest sender (32% of them with 7 honest peers: rt54 F2, open, low: rows stay
    one share, and the memory's total is bounded)."""

    def __init__(self, per_family: int, answers_per_prompt: int = 8) -> None:
        if per_family < 1:
            raise ValueError(f"per_family must be >= 1, got {per_family}")
        if answers_per_prompt < 1:
            raise ValueError(f"answers_per_prompt must be >= 1, got {answers_per_prompt}")
        self.per_family = per_family
        self.answers_per_prompt = answers_per_prompt
        self._families: dict[str, _Family] = {}

    def __len__(self) -> int:
        """Prompts remembered, all families together."""
        return sum(len(family.answers) for family in self._families.values())

    def families(self) -> dict[str, int]:
        """Prompts per family."""
        return {name: len(family.answers) for name, family in self._families.items()}

    def senders(self, family: str) -> dict[Hashable, int]:
        """Answers per sender in ``family``."""
        held = self._families.get(family)
        return {} if held is None else {who: len(prompts) for who, prompts in held.prompts_of.items()}

    def shares(self, family: str) -> dict[Hashable, float]:
        """Each sender's ownership of ``family``'s prompts (they sum to its prompts)."""
        held = self._families.get(family)
        return {} if held is None else dict(held.share)

    def add(self, item: T, family: str, prompt: Hashable, sender: Hashable) -> None:
        """Remember ``item`` (a verified success) as ``sender``'s answer to ``prompt``, unless it
        answered it already or the prompt has its answers. A drop costs O(senders of the family),
        and a new prompt may take up to per_family drops (an identity answering every prompt)."""
        held = self._families.setdefault(family, _Family())
        answers = held.answers.get(prompt)
        if answers is not None and (sender in answers or len(answers) >= self.answers_per_prompt):
            return
        while answers is None and len(held.answers) >= self.per_family:
            top = max(held.share, key=held.share.__getitem__)  # first-come among equals
            held.drop_answer(top)
        held.add(prompt, sender, item)

    def sample(self, n: int, weights: Mapping[str, float], rng: random.Random) -> list[tuple[T, str]]:
        """Up to ``n`` answers as ``(item, family)``: each of the n rows goes to a family drawn
        with probability proportional to ``weights[family]`` (absent or <= 0: never), and is left
        empty if that family has no answer left for it; then each family's rows are drawn round
        its senders (class docstring). O(answers) at most.

        Rows left empty are not given to another family: spilt, 60 of 64 went to a family of
        weight 0.01 (A = 0.01, each diluting the useful rows' gradient) while the one of weight
        1 had 4 prompts (red team rt55 N2)."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        held = {f: h for f, h in self._families.items() if h.answers and weights.get(f, 0.0) > 0}
        names = sorted(held)
        room = {f: sum(len(answers) for answers in held[f].answers.values()) for f in names}
        rows = dict.fromkeys(names, 0)
        for family in rng.choices(names, weights=[weights[f] for f in names], k=n) if names else []:
            if rows[family] < room[family]:
                rows[family] += 1
        # A sender's turn in a family is the family's part of the rows of every family it answers:
        # one identity that answered every family got a full turn in each, half of the rows in a
        # swarm of four specialists (red team rt55 N1); with 1/m of a turn per family instead, one
        # answering only the heaviest family got 2-3x an honest sender's rows (rt56 F1).
        # A sender's part of a family is the rows it can give there, at most its answers: one lucky
        # answer in another family cost a specialist most of its turn at home (red team rt57 F2).
        load: dict[Hashable, int] = {}
        for f in names:
            for who, prompts in held[f].prompts_of.items():
                load[who] = load.get(who, 0) + min(rows[f], len(prompts))
        chosen: list[tuple[T, str]] = []
        for family in names:
            if rows[family]:
                turns = {
                    who: min(rows[family], len(p)) / load[who] for who, p in held[family].prompts_of.items()
                }
                drawn = self._round_robin(held[family], rows[family], rng, turns)
                chosen += [(item, family) for item in drawn]
        return chosen

    @staticmethod
    def _round_robin(held: _Family, n: int, rng: random.Random, turns: Mapping[Hashable, float]) -> list[T]:
        """``n`` answers of ``held``, the senders in turn (a new random order each turn; a sender
        has ``turns[who]`` over the largest turn of the senders with answers left), each
        its answer to a random prompt of its own,
        one not drawn yet while it has any, else one another sender's answer was drawn for.
        Rows to honest peers who answer the same prompts would otherwise run out while an
        identity's own prompts do not, and it took 31-69% of the rows until a family held about
        K prompts (red team rt54 F1)."""
        unused = {who: list(prompts) for who, prompts in held.prompts_of.items()}
        taken: dict[Hashable, list[Hashable]] = {}  # a sender's prompts drawn with another's answer
        # A random phase: a part-timer's credit starts uniform in [0, 1), so it gives turns[who] rows a
        # pass in expectation however few passes a family's rows take (from 0, one with 1/16 of a turn
        # gave nothing in a family of 4 rows, and 16 one-family identities took 98% of the rows).
        # Turns are relative to the largest turn among the senders with answers left (rt58 F1: with
        # "no whole turn: everyone gives a row a pass", a specialist with one stray answer elsewhere
        # was a part-timer at home and an every-family identity gave as many rows as it, everywhere).
        top0 = max(turns[who] for who in unused) if unused else 1.0
        credit = {who: rng.random() if turns[who] < top0 * (1.0 - 1e-9) else 0.0 for who in unused}
        drawn: set[Hashable] = set()
        out: list[T] = []
        while len(out) < n and unused:
            order = list(unused)
            rng.shuffle(order)
            top = max(turns[who] for who in unused)
            for who in order:
                credit[who] += turns[who] / top
                if credit[who] < 1.0 - 1e-9:
                    continue
                credit[who] = max(0.0, credit[who] - 1.0)
                prompts, spare = unused[who], taken.setdefault(who, [])
                pick = None
                while prompts and pick is None:
                    prompt = _swap_pop(prompts, rng)
                    if prompt in drawn:
                        spare.append(prompt)
                    else:
                        pick = prompt
                if pick is None:
                    pick = _swap_pop(spare, rng)
                drawn.add(pick)
                out.append(held.answers[pick][who])
                if not prompts and not spare:
                    del unused[who]
                if len(out) >= n:
                    break
        return out


def _swap_pop(items: list[Hashable], rng: random.Random) -> Hashable:
    """Remove and return a random element of ``items`` (not empty) in O(1)."""
    i = rng.randrange(len(items))
    items[i], items[-1] = items[-1], items[i]
    return items.pop()


def joint_advantages(
    rewards: Sequence[Sequence[float]], keys: Sequence[KeyT], *, scale: Scale = "group", eps: float = 1e-6
) -> list[list[float]]:
    """Per group, the advantages of its completions over the union of every group with its key.

    ``rewards[i]`` are group i's rewards, ``keys[i]`` its prompt; groups sharing a key are one
    joint group (GRPO's normalisation over all their completions); a key of one group is plain GRPO."""
    if len(rewards) != len(keys):
        raise ValueError(f"{len(rewards)} groups but {len(keys)} keys")
    members: dict[KeyT, list[int]] = {}
    for i, key in enumerate(keys):
        members.setdefault(key, []).append(i)
    out: list[list[float]] = [[] for _ in rewards]
    for indices in members.values():
        union = [r for i in indices for r in rewards[i]]
        if zero_advantage(union):
            values = [0.0] * len(union)
        else:
            row = torch.tensor([union], dtype=torch.float32)
            values = group_advantages(row, scale=scale, eps=eps)[0].tolist()
        offset = 0
        for i in indices:
            out[i] = values[offset : offset + len(rewards[i])]
            offset += len(rewards[i])
    return out
