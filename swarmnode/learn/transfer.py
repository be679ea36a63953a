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

    memory      = every completion our verifier gave full reward that ends (EOS) and whose
                  answer is the task's own answer character for character, from our groups
                  and our peers' (one per prompt and sender, the first), kept across rounds
                  (``per_family`` a family)
    replay:     external and own as anchored, plus K entries drawn from the memory without
                replacement, a family f with probability proportional to 1 - b_f, then a sender
                uniformly, then one of its entries (a prompt at most once a round, a peer
                at most ceil(K / peers in the memory) entries a round); each entry is a
                one-completion external group with S = 1, so A = 1 - b_f
                (receiver_baseline's advantage, at replay)

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
cut at the token cap, replayed, is taught to us), one per prompt and sender; a family's memory
full, the oldest entry of the sender holding the most goes first, and each draw takes a sender
first, within a per-round quota (``DemoMemory``), so no identity gets more than one sender's
share of the rows, however early or distinctly it answers. Measured
(simulations/specialists.py, 1,000 rounds, seeds 0-2, J = K = 8 / 64, beside anchored on the same
warm starts): peers' families 0.030 -> 0.603 +- 0.012 (anchored 0.362), 0.795 on the 1-digit
ones; own family 0.995 -> 0.911 +- 0.024 (anchored 0.783); 1.9x anchored's CPU a round. The same
supervised loop with perfect answers reaches 0.744 (simulations/imitation_bound.py).

Selection (every baseline rule, i.e. all but joint): the J external groups with the largest
*teaching value* ``sum_y max(A(y), 0)`` (ties in a random order from the trainer's rng), among
those with value > 0, at most one per prompt and at most ceil(J / senders) from each sender while
others have any (``select_teaching``); every external group counts for at most our own group size
(the trainer clips it). Values come from rewards our verifier gave, so a sender cannot inflate them;
what it can do is send correct answers on families we are weak at, which is what we want from it.

The joint rule needs the prompts the receiver answered itself (``learning.shared_tasks``, or a
node that answers the prompts it receives); an external group on a prompt we did not answer keeps
its own group's advantage, as SAPO. Its J external groups are drawn uniformly among those whose
joint rewards are not all equal; our groups on the same prompts come first among the I own ones.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Hashable, Mapping, Sequence
from typing import Generic, TypeVar

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


class _SenderPool:
    """One family's undrawn entries during a ``DemoMemory.sample`` call: senders in a list (a
    uniform pick and a removal are O(1)), each with its undrawn prompts."""

    def __init__(self, held: Mapping[Hashable, deque[Hashable]]) -> None:
        self.senders: list[Hashable] = list(held)
        self.index: dict[Hashable, int] = {who: i for i, who in enumerate(self.senders)}
        self.prompts: dict[Hashable, list[Hashable]] = {who: list(prompts) for who, prompts in held.items()}

    def draw(self, rng: random.Random) -> tuple[Hashable, Hashable]:
        """A sender uniformly, then one of its undrawn prompts uniformly (taken out)."""
        who = self.senders[rng.randrange(len(self.senders))]
        prompts = self.prompts[who]
        i = rng.randrange(len(prompts))
        prompts[i], prompts[-1] = prompts[-1], prompts[i]
        prompt = prompts.pop()
        if not prompts:
            self.remove(who)
        return who, prompt

    def remove(self, who: Hashable) -> None:
        i = self.index.pop(who, None)
        if i is None:
            return
        last = self.senders.pop()
        if last != who:
            self.senders[i] = last
            self.index[last] = i
        del self.prompts[who]


class DemoMemory(Generic[T]):
    """Verified demonstrations kept across rounds for ``replay``: at most one per prompt and
    sender (the first it sent) and at most ``per_family`` per family. A family full, the oldest
    entry of the sender holding the most of it goes. A draw takes a sender uniformly, then one of
    its entries; a prompt at most once a call, and a sender (``own`` apart) at most
    ceil(n / senders) entries a call. Families are bounded by the caller (the node's own mixture:
    admission refuses others).

    Task ids are public, so one sender can answer every prompt: replaced by the newest answer, one
    identity re-answering the honest peers' prompts took 192 of 256 entries and 47 of 64 draws
    (red team rt50 F1); kept first per prompt, one identity answering the round's prompts before
    anyone else (a round's prompts follow from the public seed) held all 256 entries and every
    draw (rt51 F1); kept per prompt and sender, one identity answering distinct prompts while the
    honest peers answered the same few took 34-40% of the rows, the draws of honest copies of a
    prompt already drawn being dropped (rt52 F1). With the quota an identity gets at most one
    sender's share of the rows, however early, often or distinctly it answers. Signers are free,
    so many identities still get many shares (rt50 F2, open: a quota for senders without
    standing needs the peer book here)."""

    def __init__(self, per_family: int) -> None:
        if per_family < 1:
            raise ValueError(f"per_family must be >= 1, got {per_family}")
        self.per_family = per_family
        self._families: dict[str, dict[tuple[Hashable, Hashable], T]] = {}  # (prompt, sender) -> item
        # family -> sender -> its prompts, oldest first (kept up to date: no recount per add, rt50 F4)
        self._by_sender: dict[str, dict[Hashable, deque[Hashable]]] = {}

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._families.values())

    def families(self) -> dict[str, int]:
        """Entries per family."""
        return {family: len(entries) for family, entries in self._families.items()}

    def senders(self, family: str) -> dict[Hashable, int]:
        """Entries per sender in ``family``."""
        return {who: len(prompts) for who, prompts in self._by_sender.get(family, {}).items()}

    def add(self, item: T, family: str, prompt: Hashable, sender: Hashable) -> None:
        """Remember ``item`` (a verified success) for ``prompt`` from ``sender``, unless that sender
        has an entry for the prompt already. O(senders of the family) when it is full."""
        entries = self._families.setdefault(family, {})
        if (prompt, sender) in entries:
            return
        senders = self._by_sender.setdefault(family, {})
        if len(entries) >= self.per_family:
            top = max(senders, key=lambda who: len(senders[who]))  # first-come among equals
            del entries[(senders[top].popleft(), top)]
            if not senders[top]:
                del senders[top]
        entries[(prompt, sender)] = item
        senders.setdefault(sender, deque()).append(prompt)

    def sample(
        self, n: int, weights: Mapping[str, float], rng: random.Random, own: Hashable = None
    ) -> list[tuple[T, str]]:
        """Up to ``n`` entries of distinct prompts as ``(item, family)``: each draw picks a family
        with probability proportional to ``weights[family]`` (absent or <= 0: never) among those
        with entries left, then a sender uniformly, then one of its entries uniformly; an entry
        for a prompt already drawn is dropped and the draw taken again. Each sender but ``own``
        (our own successes) gives at most ceil(n / its peers with entries) of them. O(entries)."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        pools = {
            family: _SenderPool(held)
            for family, held in self._by_sender.items()
            if held and weights.get(family, 0.0) > 0
        }
        peers = {who for pool in pools.values() for who in pool.senders if who != own}
        quota = math.ceil(n / len(peers)) if peers else n
        given: dict[Hashable, int] = {}
        chosen: list[tuple[T, str]] = []
        drawn: set[tuple[str, Hashable]] = set()
        while len(chosen) < n and pools:
            names = sorted(pools)
            family = rng.choices(names, weights=[weights[f] for f in names])[0]
            who, prompt = pools[family].draw(rng)
            if (family, prompt) not in drawn:
                drawn.add((family, prompt))
                chosen.append((self._families[family][(prompt, who)], family))
                given[who] = given.get(who, 0) + 1
                if who != own and given[who] >= quota:
                    for pool in pools.values():
                        pool.remove(who)
            for name in [f for f, pool in pools.items() if not pool.senders]:
                del pools[name]
        return chosen


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
