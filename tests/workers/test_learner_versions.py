"""A worker's batch naming a policy version whose weights the learner does not hold is refused
before its spot check: such a group can never be checked. Red team: a worker that claimed
``newest published + 1`` for fabricated groups had them queued unchecked and trained on at lag 0
once the learner stepped (76 of 78 trained groups, no check, never deactivated, all paid)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from swarmnode.admit.spotcheck import SpotCheckConfig, SpotChecker
from swarmnode.admit.verdict import Accepted, AdmittedGroup
from swarmnode.identity import load_or_create_identity
from swarmnode.roles.convert import worker_batch
from swarmnode.roles.learner import LearnerNode
from swarmnode.train import ScoredGroup
from swarmnode.wire import seal, to_ms

from .test_role_engine import built

WORKER = "12D3KooWWorkerForVersionTests"


class Publisher:
    """The learner's publisher as ``_on_rollouts`` reads it: the versions it holds."""

    def __init__(self, held: list[int]) -> None:
        self.published = {v: object() for v in held}
        self.scans: list[int] = []
        self.told: list[str] = []

    def weights_of(self, version: int) -> Any:
        return ("blob", ()) if version in self.published else None

    def tell(self, record: Any) -> None:
        self.told.append(record.peer_id)


def learner(tmp_path: Path, held: list[int]) -> LearnerNode:
    node = built("learner", tmp_path)
    assert isinstance(node, LearnerNode)
    node.publisher = Publisher(held)  # type: ignore[assignment]
    node.spot = SpotChecker(SpotCheckConfig(sample_rate=1.0, seed=1))
    events: list[Any] = []
    node.activation = SimpleNamespace(  # type: ignore[assignment]
        active=lambda: {WORKER}, handle_all=lambda evs, now: events.extend(evs) or []
    )
    node._plan_gauges = lambda: None  # type: ignore[method-assign]
    node.events = events  # type: ignore[attr-defined]
    return node


def stub_intake(verdict: Accepted) -> tuple[Any, list[tuple[str | None, str | None]]]:
    """An intake that accepts with ``verdict``, runs ``call_as`` work at once, and notes whom
    each such job was charged to (signer, deliverer)."""
    charged: list[tuple[str | None, str | None]] = []

    async def judge(*args: Any, **kwargs: Any) -> Any:
        return SimpleNamespace(verdict=verdict, banned_until=None)

    async def call_as(fn: Any, *, signer: str | None, via: str | None) -> Any:
        charged.append((signer, via))
        return fn()

    return SimpleNamespace(judge=judge, call_as=call_as), charged


def batch_from(node: LearnerNode, version: int) -> Accepted:
    """A one-group batch, as admission accepts it: one EOS-ended completion per slot."""
    policy = node.trainer.policy
    task = node.mixture.sample(0, 1)[0]
    size = node.config.rollout.group_size
    eos = policy.eos_token_id
    g = ScoredGroup(
        task,
        policy.encode_prompt(task.prompt),
        [[eos]] * size,
        [[-0.1]] * size,
        [policy.decode_completion([eos])] * size,
        [0.0] * size,
        policy_version=version,
    )
    wire = worker_batch([g], policy.model_id, version, 1)
    admitted = AdmittedGroup(wire.groups[0], task, (0.0,) * size, WORKER)
    return Accepted(envelope=SimpleNamespace(), sender=WORKER, message=wire, groups=(admitted,))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("held", "claimed", "reason"), [([0], 1, "from_future"), ([5, 6], 2, "stale_policy")]
)
def test_a_group_of_a_version_the_learner_does_not_hold_is_refused_unchecked_and_unpaid(
    tmp_path: Path, held: list[int], claimed: int, reason: str
) -> None:
    node = learner(tmp_path, held)
    node.offers[WORKER] = SimpleNamespace(peer_id=WORKER)  # type: ignore[assignment]
    accepted = batch_from(node, claimed)
    node.intake, charged = stub_intake(accepted)
    envelope = seal(load_or_create_identity(tmp_path / "worker.key"), accepted.message, to_ms(time.time()))
    asyncio.run(node._on_rollouts(WORKER, envelope, accepted.message))
    # Its tokens were checked and decoded as the worker's work, charged to it (red team rt67 F2:
    # on the event loop, charged to no one).
    assert charged == [(WORKER, WORKER)]
    assert not node.queue  # never trained on
    assert node.completions_by_worker[WORKER] == 0 and node.cost_paid == 0.0  # nor paid
    assert not node.events  # nor counted as delivered (RolloutsReceived)
    assert node.metrics.snapshot()["worker_batches_refused"] == {f"reason={reason}": 1.0}
    assert node.spot.stats.fails == 0  # no strike: an honest worker's batch may arrive late
    # A worker on weights we retired is pointed at the newest at once (not at the next step).
    assert node.publisher.told == ([WORKER] if reason == "stale_policy" else [])  # type: ignore[attr-defined]


def test_a_version_retired_while_an_earlier_check_of_the_batch_ran_refuses_the_batch(tmp_path: Path) -> None:
    """Red team #20b: a checked batch has several group checks (one per prompts_per_round), with
    awaits between them; the learner may step and retire the batch's oldest version meanwhile. A
    later check then found no weights and passed the group unchecked: the batch was paid and
    queued with fabricated groups never checked (a cheater puts them at the end: the indices are
    checked in ascending order)."""
    import collections

    import torch

    from swarmnode.admit.recompute import GroupScan
    from swarmnode.admit.spotcheck import SpotCheckRequest

    node = learner(tmp_path, [4, 5])
    node.spot = SpotChecker(SpotCheckConfig(sample_rate=1.0, groups_per_check=1, seed=1))
    node.sampling_seeds[WORKER] = collections.deque([b"s" * 32], maxlen=2)
    one = batch_from(node, 4)
    wire = one.message
    two = Accepted(  # the same group twice (two checks: groups_per_check=1)
        envelope=one.envelope,
        sender=WORKER,
        message=type(wire)(groups=wire.groups * 2),
        groups=one.groups * 2,
    )
    scans: list[int] = []

    async def timed(run: Any, work: Any, *args: Any) -> Any:
        if getattr(work, "__name__", "") == "check":  # the keyed token check: run it
            return work()
        scans.append(args[0])
        node.publisher.published.pop(4, None)  # the learner stepped meanwhile: v4 retired
        request = args[2]
        return GroupScan([-0.1] * len(request.tokens), SpotCheckRequest(WORKER, "g", ()), torch.zeros(0, 1))

    node._timed = timed  # type: ignore[method-assign]

    node.intake, _ = stub_intake(two)
    envelope = seal(load_or_create_identity(tmp_path / "worker.key"), two.message, to_ms(time.time()))
    asyncio.run(node._on_rollouts(WORKER, envelope, two.message))
    assert scans == [4]  # the first group was checked; the second could no longer be
    assert not node.queue and node.completions_by_worker[WORKER] == 0 and node.cost_paid == 0.0
    assert node.metrics.snapshot()["worker_batches_refused"] == {"reason=stale_policy": 1.0}
    assert node.spot.stats.fails == 0  # no strike


def test_a_worker_banned_at_intake_is_taken_off_the_plan_at_once(tmp_path: Path) -> None:
    """A replaying worker (its groups duplicates of ones it sent before) was banned at intake but
    stayed activated, its lease renewed, for 600 batches refused as banned: the ban now goes to
    the activation core as it happens."""
    from swarmnode.activation import core as act
    from swarmnode.admit import Rejected, RejectReason

    node = learner(tmp_path, [0])
    accepted = batch_from(node, 0)
    until = time.time() + 600

    async def judge(*args: Any, **kwargs: Any) -> Any:
        verdict = Rejected(
            RejectReason.DUPLICATE, "groups[0] already received", sender=WORKER, charged=WORKER
        )
        return SimpleNamespace(verdict=verdict, banned_until=until)

    node.intake = SimpleNamespace(judge=judge)  # type: ignore[assignment]
    envelope = seal(load_or_create_identity(tmp_path / "worker.key"), accepted.message, to_ms(time.time()))
    asyncio.run(node._on_rollouts(WORKER, envelope, accepted.message))
    assert node.events == [act.PeerBanned(WORKER, until)]  # type: ignore[attr-defined]
    assert not node.queue and node.cost_paid == 0.0
