"""Rollout groups between the wire and the trainer, for every role that sends or trains on them.

Owns: a trainer node's own groups as a gossip ``RolloutBatch`` (``rollout_batch``) and an
admitted peer group re-tokenized as a ``ScoredGroup`` (``to_scored``; ``trained_texts`` is the
renderer admission scores with); a worker's groups as a batch with token ids and per-token
log-probs (``worker_batch``: the learner trains on the worker's behaviour log-probs and
spot-checks them) and the learner's conversion of an admitted worker group (``from_worker``),
refusing any completion whose tokens do not decode to its text.
Must not: judge rewards (admission re-scores) or decide staleness (``admit.staleness``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from swarmnode.admit import RejectReason
from swarmnode.admit.verdict import AdmittedGroup, TrainedText
from swarmnode.policy import Policy
from swarmnode.train.batch import ScoredGroup
from swarmnode.wire import Completion, RolloutBatch, RolloutGroup
from swarmnode.wire.messages import TaskId as WireTaskId


class WorkerDataError(ValueError):
    """A worker's group cannot be trained on as sent (names the group and what is wrong)."""


def worker_batch(
    groups: Sequence[ScoredGroup],
    model_id: str,
    version: int,
    round_index: int,
    *,
    system_prompt_sha256: bytes = b"",
) -> RolloutBatch:
    """A worker's groups as one batch, with token ids and behaviour log-probs per completion."""
    rewards = [r for g in groups for r in g.rewards] or [0.0]
    mean = sum(rewards) / len(rewards)
    return RolloutBatch(
        groups=tuple(
            RolloutGroup(
                task=WireTaskId(
                    g.task.id.dataset,
                    g.task.id.config,
                    g.task.id.seed,
                    g.task.id.index,
                    g.task.id.prompt_format,
                ),
                prompt=g.task.prompt,
                completions=tuple(
                    Completion(
                        text=text,
                        token_count=len(ids),
                        mean_logprob=min(0.0, sum(lps) / len(lps)) if lps else 0.0,
                        claimed_reward_informational=reward,
                        token_ids=tuple(ids),
                        token_logprobs=tuple(lps),
                    )
                    for text, ids, lps, reward in zip(
                        g.texts, g.completion_ids, g.behaviour_logprobs, g.rewards, strict=True
                    )
                ),
                model_id=model_id,
                policy_version=version,
                round=round_index,
                batch_reward_mean=mean,
                system_prompt_sha256=system_prompt_sha256,
            )
            for g in groups
        )
    )


def from_worker(
    admitted: AdmittedGroup, policy: Policy, max_new_tokens: int, group_size: int | None = None
) -> ScoredGroup:
    """An admitted worker group as the learner trains on it: the worker's tokens and log-probs.

    The worker runs our model (same ``model_id``, so the same tokenizer): its token ids
    must decode to the text admission scored, and every token needs a finite log-prob <= 0.
    A group has exactly ``group_size`` completions (when given), each ending at EOS or at the cap:
    keyed sampling fixes every (task, completion index) output, so a prefix of an honest
    completion, or the first k completions of a group already sent, would pass every token check
    and be paid as new work (red team of #20).
    """
    group = admitted.group
    if group.model_id != policy.model_id:
        raise WorkerDataError(f"group of model {group.model_id!r}; this learner trains {policy.model_id!r}")
    if group_size is not None and len(group.completions) != group_size:
        raise WorkerDataError(
            f"task {admitted.task.id.key()}: {len(group.completions)} completions; this learner's groups "
            f"have {group_size} (rollout.group_size)"
        )
    vocab = len(policy.tokenizer)
    completion_ids: list[list[int]] = []
    logprobs: list[list[float]] = []
    for i, c in enumerate(group.completions):
        where = f"task {admitted.task.id.key()} completion {i}"
        if not c.token_ids or len(c.token_ids) != len(c.token_logprobs):
            raise WorkerDataError(
                f"{where}: {len(c.token_ids)} token ids and {len(c.token_logprobs)} log-probs "
                "(a worker must send both, one per token)"
            )
        if len(c.token_ids) > max_new_tokens:
            raise WorkerDataError(f"{where}: {len(c.token_ids)} tokens; the cap is {max_new_tokens}")
        # A sampler stops at EOS or at the cap, nowhere else: a completion cut short passes every
        # token check (each token is still the rule's) yet is paid as a whole one (red team, #20);
        # a worker whose rollout.max_new_tokens differs from ours is refused here, with the reason.
        if c.token_ids[-1] != policy.eos_token_id and len(c.token_ids) != max_new_tokens:
            raise WorkerDataError(
                f"{where}: {len(c.token_ids)} tokens without EOS (a completion ends at EOS or at "
                f"the cap of {max_new_tokens})"
            )
        if policy.eos_token_id in c.token_ids[:-1]:
            raise WorkerDataError(f"{where}: EOS before the last token")
        if any(not 0 <= t < vocab for t in c.token_ids):
            raise WorkerDataError(f"{where}: a token id is outside the vocabulary (size {vocab})")
        if any(not (math.isfinite(lp) and lp <= 0.0) for lp in c.token_logprobs):
            raise WorkerDataError(f"{where}: a log-prob is not a finite value <= 0")
        if policy.decode_completion(list(c.token_ids)) != c.text:
            raise WorkerDataError(f"{where}: token ids do not decode to the completion text")
        completion_ids.append(list(c.token_ids))
        logprobs.append(list(c.token_logprobs))
    return ScoredGroup(
        task=admitted.task,
        prompt_ids=policy.encode_prompt(admitted.task.prompt),
        completion_ids=completion_ids,
        behaviour_logprobs=logprobs,
        texts=[c.text for c in group.completions],
        rewards=list(admitted.rewards),
        policy_version=group.policy_version,
        source=admitted.sender,
    )


# ------------------------------------------------------------------ trainer nodes (gossip)


def rollout_batch(
    groups: list[ScoredGroup],
    model_id: str,
    version: int,
    swarm_round: int,
    *,
    system_prompt_sha256: bytes = b"",
) -> RolloutBatch:
    """Own groups as the wire's RolloutBatch (text, token counts, mean log-probs, claimed rewards)."""
    rewards = [r for g in groups for r in g.rewards]
    batch_mean = sum(rewards) / len(rewards) if rewards else 0.0
    out = []
    for g in groups:
        t = g.task.id
        completions = tuple(
            Completion(
                text=text,
                token_count=len(ids),
                mean_logprob=min(0.0, sum(lp) / len(lp)) if lp else 0.0,
                claimed_reward_informational=reward,
            )
            for text, ids, lp, reward in zip(
                g.texts, g.completion_ids, g.behaviour_logprobs, g.rewards, strict=True
            )
        )
        out.append(
            RolloutGroup(
                task=WireTaskId(t.dataset, t.config, t.seed, t.index, t.prompt_format),
                prompt=g.task.prompt,
                completions=completions,
                model_id=model_id,
                policy_version=version,
                round=swarm_round,
                batch_reward_mean=batch_mean,
                system_prompt_sha256=system_prompt_sha256,
            )
        )
    return RolloutBatch(groups=tuple(out))


def _tokenizer_facts(policy: Policy) -> tuple[int, frozenset[int]]:
    """``policy``'s longest token in characters and ``untrainable_ids``, computed once and kept on
    the policy (its tokenizer never changes; the vocabulary walk is not for every batch)."""
    facts: tuple[int, frozenset[int]] | None = getattr(policy, "_swarmnode_tokenizer_facts", None)
    if facts is None:
        tokenizer = policy.tokenizer
        longest = max((len(token) for token in tokenizer.get_vocab()), default=1)
        added = getattr(tokenizer, "added_tokens_decoder", {})
        specials = set(tokenizer.all_special_ids) | {i for i, token in added.items() if token.special}
        facts = (longest, frozenset(specials - {policy.eos_token_id}))
        policy._swarmnode_tokenizer_facts = facts  # type: ignore[attr-defined]
    return facts


def _longest_token_chars(policy: Policy) -> int:
    """The most characters one token of ``policy``'s vocabulary spells (special tokens included)."""
    return _tokenizer_facts(policy)[0]


def untrainable_ids(policy: Policy) -> frozenset[int]:
    """Every special token of ``policy``'s tokenizer but EOS: the ids decoding skips, so a
    completion holding one would be scored on text without it and trained with it.

    Both the special-tokens map (``all_special_ids``: pad, bos, unk, ...) and every added token
    marked special: a tokenizer whose config does not list ``<|im_start|>`` in that map (the
    built-in chat model's) still skips it when decoding, and it passed as a trainable token, a
    fake turn the node then learnt to write into its own answers (red team rt90 F1)."""
    return _tokenizer_facts(policy)[1]


def completion_token_rows(
    policy: Policy, texts: Sequence[str], max_new_tokens: int
) -> list[list[int] | RejectReason]:
    """The token ids this node trains for each received completion, or why it cannot train it.

    Our own tokenization (one batched call), cut at an EOS the text itself spells (a peer's
    ``<eos>`` is parsed as the special token), then EOS appended unless the completion fills
    ``max_new_tokens`` (a completion that hit the cap has no EOS, as our own engine's do).
    Refused: more tokens than we generate (``completion_too_long``: decided from the length
    alone when no tokenization could be that short), or any other special token or ``<unk>``
    in the ids (``completion_untrainable``: decoding drops those, so the reward would not have
    seen tokens we would train on)."""
    eos = policy.eos_token_id
    specials = untrainable_ids(policy)
    longest = _longest_token_chars(policy)
    rows: list[list[int] | RejectReason] = [RejectReason.COMPLETION_TOO_LONG] * len(texts)
    todo = [i for i, text in enumerate(texts) if len(text) <= max_new_tokens * longest]
    encoded = (
        policy.tokenizer([texts[i] for i in todo], add_special_tokens=False)["input_ids"] if todo else []
    )
    for i, raw in zip(todo, encoded, strict=True):
        ids = list(raw)
        if eos in ids:
            ids = ids[: ids.index(eos)]
        if len(ids) > max_new_tokens:
            continue
        if any(t in specials for t in ids):
            rows[i] = RejectReason.COMPLETION_UNTRAINABLE
            continue
        rows[i] = ids if len(ids) == max_new_tokens else [*ids, eos]
    return rows


def trained_texts(
    policy: Policy, texts: Sequence[str], max_new_tokens: int
) -> list[TrainedText | RejectReason]:
    """What admission scores for received completions: the decoding of exactly the ids we train."""
    rows = completion_token_rows(policy, texts, max_new_tokens)
    trained = [row for row in rows if not isinstance(row, RejectReason)]
    decoded = iter(policy.decode_completions(trained))
    return [row if isinstance(row, RejectReason) else TrainedText(next(decoded), tuple(row)) for row in rows]


def to_scored(admitted: AdmittedGroup, policy: Policy, max_new_tokens: int) -> ScoredGroup:
    """An admitted external group, re-tokenized with our tokenizer (SAPO §2 step 5).

    Admission rendered each completion with ``trained_texts`` (when it was given this node's
    renderer) and scored the text of these ids, so the reward belongs to exactly them; they
    travel with the group, and are only computed here where no renderer ran (the simulator)."""
    if admitted.token_ids:
        rows: list[list[int] | RejectReason] = [list(ids) for ids in admitted.token_ids]
    else:
        rows = completion_token_rows(policy, [c.text for c in admitted.group.completions], max_new_tokens)
    completion_id_rows = []
    for i, row in enumerate(rows):
        if isinstance(row, RejectReason):  # admission refused these; reaching here is a bug
            raise ValueError(f"completion {i} of {admitted.task.id.key()}: {row.value}")
        completion_id_rows.append(row)
    return ScoredGroup(
        task=admitted.task,
        prompt_ids=policy.encode_prompt(admitted.task.prompt),
        completion_ids=completion_id_rows,
        behaviour_logprobs=[],  # computed under our own policy at update time
        texts=list(admitted.texts) if admitted.texts else [c.text for c in admitted.group.completions],
        rewards=list(admitted.rewards),
        policy_version=admitted.group.policy_version,
        source=admitted.sender,
        source_mean_logprobs=[c.mean_logprob for c in admitted.group.completions],
        source_reward_mean=admitted.group.batch_reward_mean,
    )
