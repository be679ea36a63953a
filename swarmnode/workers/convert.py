"""Rollouts between a learner and its workers: groups to wire batches and back.

Owns: the worker's encoding of its groups (token ids and per-token log-probs travel
with the text, because the learner trains on the worker's behaviour log-probs and
spot-checks them) and the learner's conversion of an admitted group into a
``ScoredGroup``, refusing any completion whose tokens do not decode to its text.
Must not: judge rewards (admission re-scores) or decide staleness (``core.staleness``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from swarmnode.admit.verdict import AdmittedGroup
from swarmnode.policy import Policy
from swarmnode.train.batch import ScoredGroup
from swarmnode.wire import Completion, RolloutBatch, RolloutGroup
from swarmnode.wire.messages import TaskId as WireTaskId


class WorkerDataError(ValueError):
    """A worker's group cannot be trained on as sent (names the group and what is wrong)."""


def worker_batch(
    groups: Sequence[ScoredGroup], model_id: str, version: int, round_index: int
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
            )
            for g in groups
        )
    )


def from_worker(admitted: AdmittedGroup, policy: Policy, max_new_tokens: int) -> ScoredGroup:
    """An admitted worker group as the learner trains on it: the worker's tokens and log-probs.

    The worker runs our model (same ``model_id``, so the same tokenizer): its token ids
    must decode to the text admission scored, and every token needs a finite log-prob <= 0.
    """
    group = admitted.group
    if group.model_id != policy.model_id:
        raise WorkerDataError(f"group of model {group.model_id!r}; this learner trains {policy.model_id!r}")
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
