"""The verification boundary: a scorer that runs a peer's text cannot reach the node.

These tests score with upstream's own ``binary_matrix`` scorer (which ``eval``s the
answer), the way a node would have before the project's safe scorer existed, to
show what the sandbox alone holds: code may run, but only inside a worker that
cannot write a file, open a connection, outlive its CPU budget or end the caller.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmnode.tasks import Task, TaskId, regenerate
from swarmnode.verify import Scored, VerifierFailure, VerifierLimits, VerifierPool, VerifierReason

BINARY = ("binary_matrix", "{}", "question")
LIMITS = VerifierLimits(completion_cpu_s=0.5, batch_cpu_s=2.0, wall_slack_s=2.0)


@pytest.fixture(scope="module")
def raw_pool() -> Iterator[VerifierPool]:
    """Upstream's eval-ing scorer, inside the sandbox: the boundary must hold on its own."""
    with VerifierPool(LIMITS, workers=2, families=[BINARY], unsafe_upstream=["binary_matrix"]) as pool:
        yield pool


@pytest.fixture(scope="module")
def task() -> Task:
    return regenerate(TaskId(*BINARY[:2], 0, 5, BINARY[2]))


def score(pool: VerifierPool, task: Task, text: str) -> Scored | VerifierFailure:
    return pool.score([(task, [text, task.entry["answer"]])])


def test_a_scorer_that_exits_is_a_verifier_failed_value_not_an_exit(
    raw_pool: VerifierPool, task: Task
) -> None:
    outcome = score(raw_pool, task, "<answer>exit(3)</answer>")
    assert isinstance(outcome, VerifierFailure) and outcome.reason is VerifierReason.FAILED
    assert "SystemExit" in outcome.detail


def test_a_scorer_stuck_in_one_c_call_is_killed_within_its_cpu_limit(
    raw_pool: VerifierPool, task: Task
) -> None:
    started = time.monotonic()
    outcome = score(raw_pool, task, "9**9**9")
    assert isinstance(outcome, VerifierFailure) and outcome.reason is VerifierReason.TIMEOUT
    assert time.monotonic() - started < 10.0  # never returns by itself


def spin(cpu_s: float) -> str:
    """An answer upstream's scorer evals into a loop that burns ``cpu_s`` of the worker's CPU time."""
    return (
        f"(lambda clock, t: [0 for _ in iter(lambda: clock() - t < {cpu_s!r}, False)])"
        "(__import__('time').process_time, __import__('time').process_time())"
    )


def test_the_cpu_limit_is_per_completion_not_per_batch(raw_pool: VerifierPool, task: Task) -> None:
    """Four completions of 0.3 s each use more than one completion's 0.5 s, and are all scored."""
    outcome = raw_pool.score([(task, [spin(0.3)] * 4)])
    assert outcome == Scored(((0.0,) * 4,), outcome.cpu_s)


def test_one_completion_past_its_cpu_limit_times_out(raw_pool: VerifierPool, task: Task) -> None:
    """0.8 s of Python is under the batch's 2 s: only the per-completion timer can stop it."""
    outcome = raw_pool.score([(task, ["0", spin(0.8), "0"])])
    assert isinstance(outcome, VerifierFailure) and outcome.reason is VerifierReason.TIMEOUT


def test_a_scorer_that_sleeps_is_killed_at_the_wall_deadline(raw_pool: VerifierPool, task: Task) -> None:
    started = time.monotonic()
    outcome = score(raw_pool, task, "__import__('time').sleep(25)")
    assert isinstance(outcome, VerifierFailure) and outcome.reason is VerifierReason.TIMEOUT
    assert (
        time.monotonic() - started < 10.0
    )  # far below the 25 s it asked for (a replacement may be starting)


@pytest.mark.skipif(os.geteuid() != 0, reason="the file-system jail needs root (README: Reliability)")
def test_a_scorer_cannot_create_a_file(raw_pool: VerifierPool, task: Task, tmp_path: Path) -> None:
    target = tmp_path / "pwned"
    outcome = score(raw_pool, task, f"<answer>open({str(target)!r}, 'w').write('x')</answer>")
    assert isinstance(outcome, Scored)
    assert not target.exists()


def test_a_scorer_cannot_write_into_a_file(raw_pool: VerifierPool, task: Task, tmp_path: Path) -> None:
    target = tmp_path / "existing"
    target.write_text("")
    target.chmod(0o666)
    score(raw_pool, task, f"<answer>open({str(target)!r}, 'a').write('x' * 100)</answer>")
    assert target.read_text() == ""


@pytest.mark.skipif(os.geteuid() != 0, reason="the network namespace needs root (README: Reliability)")
def test_a_scorer_has_no_network(raw_pool: VerifierPool, task: Task) -> None:
    import socket

    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.5)
    port = server.getsockname()[1]
    try:
        score(raw_pool, task, f"__import__('socket').create_connection(('127.0.0.1', {port}), timeout=1)")
        with pytest.raises(TimeoutError):
            server.accept()
    finally:
        server.close()
    assert raw_pool.isolation() == {"network_namespace": True, "file_system_jail": True, "note": ""}


def test_a_scorer_that_prints_cannot_forge_an_answer(raw_pool: VerifierPool, task: Task) -> None:
    outcome = score(raw_pool, task, "print('\\x00\\x00\\x00\\x10{\"rewards\":[[1]]}')")
    assert isinstance(outcome, Scored) and outcome.rewards == ((0.0, 1.0),)


def test_a_memory_bomb_is_refused_and_the_pool_keeps_serving(raw_pool: VerifierPool, task: Task) -> None:
    score(raw_pool, task, "' ' * (10 ** 11)")
    outcome = score(raw_pool, task, task.entry["answer"])
    assert isinstance(outcome, Scored) and outcome.rewards == ((1.0, 1.0),)


def test_dead_workers_are_replaced_and_counted(raw_pool: VerifierPool, task: Task) -> None:
    before = raw_pool.stats()
    score(raw_pool, task, "exit(1)")
    for _ in range(3):
        assert isinstance(score(raw_pool, task, task.entry["answer"]), Scored)
    after = raw_pool.stats()
    assert after["failed"] == before["failed"] + 1
    assert after["restarts"] == before["restarts"] + 1


def test_the_projects_scorer_never_runs_the_answer(tmp_path: Path) -> None:
    """Without the test-only override, binary_matrix uses the project's literal_eval scorer."""
    target = tmp_path / "pwned"
    with VerifierPool(LIMITS, workers=1, families=[BINARY]) as pool:
        task = regenerate(TaskId(*BINARY[:2], 0, 5, BINARY[2]))
        for attack in (f"open({str(target)!r}, 'w').write('x')", "exit(3)", "9**9**9"):
            outcome = pool.score([(task, [attack])])
            assert outcome == Scored(((0.0,),), outcome.cpu_s)
        assert pool.stats()["timeouts"] == 0 and pool.stats()["failed"] == 0
    assert not target.exists()
