"""Worker rollouts on the wire: the learner trains on exactly the worker's tokens and log-probs,
and refuses a group whose tokens do not match its text."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

from swarmnode.admit import AdmissionConfig, AdmissionPipeline, task_families
from swarmnode.admit.verdict import Accepted
from swarmnode.identity import NodeIdentity
from swarmnode.policy import Policy, build_tiny_policy
from swarmnode.roles.convert import WorkerDataError, from_worker, worker_batch
from swarmnode.rollout import SamplingParams, make_engine
from swarmnode.tasks import default_mixture, score_completion
from swarmnode.train import ScoredGroup
from swarmnode.wire import encode_envelope, seal, to_ms


@pytest.fixture(scope="module")
def policy() -> Policy:
    torch.set_num_threads(1)
    return build_tiny_policy(0)


def worker_groups(policy: Policy) -> list[ScoredGroup]:
    tasks = default_mixture(0).sample(1, 3)
    result = make_engine("torch", policy).generate(
        [t.prompt for t in tasks], 4, SamplingParams(max_new_tokens=6), torch.Generator().manual_seed(0)
    )
    return [
        ScoredGroup(
            task=t,
            prompt_ids=list(p),
            completion_ids=[list(c.token_ids) for c in cs],
            behaviour_logprobs=[list(c.logprobs) for c in cs],
            texts=[c.text for c in cs],
            rewards=[score_completion(t, c.text) for c in cs],
            policy_version=policy.version,
        )
        for t, p, cs in zip(tasks, result.prompt_ids, result.completions, strict=True)
    ]


def admitted(batch: object, worker: NodeIdentity) -> Accepted:
    now = time.time()
    pipeline = AdmissionPipeline(
        AdmissionConfig(allowed_tasks=task_families(default_mixture(0)), local_peer_id="learner"), now=now
    )
    verdict = pipeline.admit(encode_envelope(seal(worker, batch, to_ms(now))), now)  # type: ignore[arg-type]
    assert isinstance(verdict, Accepted), verdict
    return verdict


def test_the_learner_trains_on_the_workers_own_tokens_and_logprobs(policy: Policy) -> None:
    groups = worker_groups(policy)
    verdict = admitted(worker_batch(groups, policy.model_id, policy.version, 1), NodeIdentity.generate())
    back = [from_worker(a, policy, max_new_tokens=6) for a in verdict.groups]
    for sent, got in zip(groups, back, strict=True):
        assert got.completion_ids == sent.completion_ids
        assert got.rewards == sent.rewards  # re-scored by admission, equal for honest text
        assert got.source == verdict.sender
        for a, b in zip(got.behaviour_logprobs, sent.behaviour_logprobs, strict=True):
            assert a == pytest.approx(b, abs=1e-6)  # float32 on the wire


def _with_group(batch: object, index: int, **changes: object) -> object:
    groups = list(batch.groups)  # type: ignore[attr-defined]
    groups[index] = dataclasses.replace(groups[index], **changes)
    return dataclasses.replace(batch, groups=tuple(groups))  # type: ignore[type-var]


def test_tokens_that_do_not_decode_to_the_text_are_refused(policy: Policy) -> None:
    groups = worker_groups(policy)
    batch = worker_batch(groups, policy.model_id, policy.version, 1)
    group = batch.groups[0]
    first = group.completions[0]
    ids = list(first.token_ids)
    ids[0] = (ids[0] + 1) % len(policy.tokenizer)  # the worker trains the learner on other tokens
    forged = dataclasses.replace(first, token_ids=tuple(ids))
    verdict = admitted(
        _with_group(batch, 0, completions=(forged, *group.completions[1:])), NodeIdentity.generate()
    )
    with pytest.raises(WorkerDataError, match="do not decode"):
        from_worker(verdict.groups[0], policy, max_new_tokens=6)


def test_a_group_without_per_token_logprobs_is_refused(policy: Policy) -> None:
    groups = worker_groups(policy)
    batch = worker_batch(groups, policy.model_id, policy.version, 1)
    group = batch.groups[0]
    bare = tuple(dataclasses.replace(c, token_ids=(), token_logprobs=()) for c in group.completions)
    verdict = admitted(_with_group(batch, 0, completions=bare), NodeIdentity.generate())
    with pytest.raises(WorkerDataError, match="must send both"):
        from_worker(verdict.groups[0], policy, max_new_tokens=6)


def test_a_completion_cut_short_of_eos_and_the_cap_is_refused(policy: Policy) -> None:
    # Red team of #20: under keyed sampling every prefix of an honest completion passes the token
    # checks, so a worker could cut completions to one token and be paid for each as a whole one.
    groups = worker_groups(policy)
    batch = worker_batch(groups, policy.model_id, policy.version, 1)
    group = batch.groups[0]
    first = group.completions[0]
    assert len(first.token_ids) >= 2
    cut = dataclasses.replace(
        first,
        token_ids=first.token_ids[:1],
        token_logprobs=first.token_logprobs[:1],
        text=policy.decode_completion(list(first.token_ids[:1])),
        token_count=1,
    )
    verdict = admitted(
        _with_group(batch, 0, completions=(cut, *group.completions[1:])), NodeIdentity.generate()
    )
    with pytest.raises(WorkerDataError, match="without EOS"):
        from_worker(verdict.groups[0], policy, max_new_tokens=6)


def test_a_group_of_fewer_completions_than_the_learners_group_size_is_refused(policy: Policy) -> None:
    # Red team of #20: the first k completions of a group already sent are "new" content that
    # passes every check; a learner's group has exactly rollout.group_size completions.
    groups = worker_groups(policy)
    batch = worker_batch(groups, policy.model_id, policy.version, 1)
    group = batch.groups[0]
    verdict = admitted(_with_group(batch, 0, completions=group.completions[:1]), NodeIdentity.generate())
    with pytest.raises(WorkerDataError, match="1 completions; this learner's groups have 4"):
        from_worker(verdict.groups[0], policy, max_new_tokens=6, group_size=4)
    whole = admitted(batch, NodeIdentity.generate())
    assert len(from_worker(whole.groups[0], policy, max_new_tokens=6, group_size=4).completion_ids) == 4
