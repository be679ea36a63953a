"""The pool's frames: what a worker is sent, and what the parent accepts back from it.

A worker is the untrusted side: its answer is read with a size cap and an exact shape
(one float64 per completion, each in [0, 1]) and nothing else. The request carries the
parent's regenerated entry only when marshal keeps it exactly; otherwise the worker
regenerates the task, and either way the rewards are the in-process ones.
"""

from __future__ import annotations

import enum
import marshal
import struct
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import replace

import pytest

from swarmnode.tasks import Task, default_mixture, regenerate
from swarmnode.verify import Scored, VerifierFailure, VerifierPool, VerifierReason, score_in_process
from swarmnode.verify.pool import _marshal_exact, _request
from swarmnode.verify.worker import REWARDS

CHAIN_SUM = default_mixture(0).sample(0, 1)[0].id


class Level(enum.IntEnum):
    LOW = 1


@pytest.fixture(scope="module")
def pool() -> Iterator[VerifierPool]:
    family = (CHAIN_SUM.dataset, CHAIN_SUM.config, CHAIN_SUM.prompt_format)
    with VerifierPool(workers=1, families=[family]) as p:
        yield p


def chain_sum(index: int) -> Task:
    return regenerate(replace(CHAIN_SUM, index=index))


@pytest.mark.parametrize(
    "value",
    [
        {"a": (1, 2), "b": [1.5, None, True], "c": {"d": b"x", 3: frozenset({1})}},
        (float("inf"), float("nan"), -0.0, 10**40),
        {(1, "k"): {"nested": [[()]]}},
    ],
)
def test_plain_values_travel_exactly(value: object) -> None:
    assert _marshal_exact(value)
    assert repr(marshal.loads(marshal.dumps(value))) == repr(value)  # types included, NaN too


@pytest.mark.parametrize(
    "value",
    [
        {"level": Level.LOW},  # an int subclass: the worker would get a plain int
        {"rows": bytearray(b"01")},  # bytes-like: marshal would turn it into bytes
        {"counts": defaultdict(int)},  # a dict subclass: missing keys would raise instead
        {"x": object()},
        [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]],  # deeper than we walk
    ],
)
def test_values_marshal_would_change_are_not_sent(value: object) -> None:
    assert not _marshal_exact(value)


def test_the_sandbox_scores_exactly_as_in_process(pool: VerifierPool) -> None:
    groups = [
        (task, [task.entry["answer"], f"<answer>{task.entry['answer']}</answer>", "12", "", "1e999"])
        for task in (chain_sum(i) for i in range(40))
    ]
    outcome = pool.score(groups)
    assert isinstance(outcome, Scored)
    assert outcome.rewards == score_in_process(groups).rewards  # type: ignore[union-attr]


def test_a_task_whose_entry_cannot_travel_is_regenerated_by_the_worker(pool: VerifierPool) -> None:
    task = chain_sum(7)
    odd = Task(task.id, task.prompt, {**task.entry, "answer": "-1", "extra": bytearray(b"x")})
    body = marshal.loads(_request([(odd, ["x"])]))
    assert body[0][1] is None  # no entry sent: the worker regenerates the task from its id
    outcome = pool.score([(odd, [task.entry["answer"]])])
    assert outcome == Scored(((1.0,),), outcome.cpu_s)  # scored against the regenerated entry


class _Stub:
    """A parent's view of one worker answer, without a process."""

    def __init__(self, pool: VerifierPool, groups: list[tuple[Task, list[str]]]) -> None:
        self.pool, self.groups = pool, groups
        self.n = sum(len(texts) for _, texts in groups)

    def judge(self, body: bytes) -> Scored | VerifierFailure:
        return self.pool._judge(body, self.groups, self.n, 0.0)  # type: ignore[return-value]


@pytest.fixture
def stub() -> _Stub:
    task = chain_sum(1)
    return _Stub(VerifierPool(workers=1), [(task, ["a", "b"]), (task, ["c"])])


def test_packed_rewards_are_split_into_the_groups_asked(stub: _Stub) -> None:
    assert stub.judge(REWARDS + struct.pack("<3d", 1.0, 0.0, 0.5)).rewards == ((1.0, 0.0), (0.5,))  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (REWARDS + struct.pack("<2d", 1.0, 0.0), "wrong shape"),  # a completion short
        (REWARDS + struct.pack("<4d", 1.0, 0.0, 0.0, 0.0), "wrong shape"),
        (REWARDS + struct.pack("<3d", 1.0, 0.0, 0.5) + b"\x00", "wrong shape"),
        (REWARDS + struct.pack("<3d", 1.0, float("nan"), 0.5), "outside"),
        (REWARDS + struct.pack("<3d", 1.0, 2.0, 0.5), "outside"),
        (REWARDS + struct.pack("<3d", -0.1, 0.0, 0.5), "outside"),
        (REWARDS + struct.pack("<3d", float("inf"), float("-inf"), 0.5), "outside"),
        (b'{"rewards": [[1, 0], [1]]}', "wrong shape"),  # the old JSON answer is not one
        (b"\xff\xfe garbage", "wrong shape"),
        (b'{"failed": "verifier_failed", "detail": "chain_sum scorer raised SystemExit"}', "SystemExit"),
    ],
)
def test_a_malformed_answer_is_a_verifier_failure(stub: _Stub, body: bytes, why: str) -> None:
    outcome = stub.judge(body)
    assert isinstance(outcome, VerifierFailure) and outcome.reason is VerifierReason.FAILED
    assert why in outcome.detail
