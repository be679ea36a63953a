"""Supervision: failures are counted and restarted with backoff; a persistent failure stops loudly."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import pytest

from swarmnode.ops.metrics import Metrics
from swarmnode.ops.supervise import JobFailed, SupervisionPolicy, TaskSet, stop_on_signals, supervise

FAST = SupervisionPolicy(max_failures=3, backoff_initial=0.001, backoff_max=0.002, healthy_after=60)


def test_a_job_that_fails_then_recovers_is_restarted_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics()
    calls = []

    async def job() -> None:
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("transient")

    with caplog.at_level(logging.ERROR):
        asyncio.run(supervise("generate", job, metrics, FAST))
    assert len(calls) == 3
    assert metrics.value("task_restarts", job="generate") == 2
    assert "job generate failed (1/3 in a row)" in caplog.text
    assert "RuntimeError: transient" in caplog.text  # the traceback is logged, not swallowed


def test_a_persistent_failure_stops_with_a_message_naming_the_job_and_cause() -> None:
    async def job() -> None:
        raise ValueError("disk full")

    with pytest.raises(
        JobFailed, match=r"job 'train' failed 3 times in a row; last error: ValueError\('disk full'\)"
    ):
        asyncio.run(supervise("train", job, Metrics(), FAST))


def test_cancellation_is_not_treated_as_a_failure() -> None:
    metrics = Metrics()

    async def job() -> None:
        await asyncio.sleep(10)

    async def main() -> None:
        task = asyncio.create_task(supervise("serve", job, metrics, FAST))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert metrics.value("task_restarts", job="serve") == 0


def test_prometheus_rendering() -> None:
    metrics = Metrics()
    metrics.inc("groups_rejected", "Rejected groups", reason="bad_signature")
    metrics.inc("groups_rejected", "Rejected groups", 2, reason="replay")
    metrics.set("reward", "Mean reward", 0.5)
    text = metrics.render()
    assert "# TYPE swarmnode_groups_rejected_total counter" in text
    assert 'swarmnode_groups_rejected_total{reason="bad_signature"} 1' in text
    assert 'swarmnode_groups_rejected_total{reason="replay"} 2' in text
    assert "swarmnode_reward 0.5" in text
    with pytest.raises(ValueError):
        metrics.inc("reward", "x")


def test_a_first_signal_asks_a_role_to_stop_and_a_second_aborts_it() -> None:
    """``stop_on_signals``: SIGINT sets the stop event and the role keeps running to finish its
    step; a second SIGINT cancels the task that installed the rule; ``max_seconds`` stops it too."""

    async def role(stop: asyncio.Event, seen: list[str]) -> None:
        stop_on_signals(stop)
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.wait_for(stop.wait(), timeout=10)
        seen.append("stop set, still running")
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.sleep(30)  # the second signal cancels this
        seen.append("not cancelled")

    async def timed(stop: asyncio.Event) -> float:
        loop = asyncio.get_running_loop()
        started = loop.time()
        stop_on_signals(stop, max_seconds=0.2)
        await asyncio.wait_for(stop.wait(), timeout=10)
        return loop.time() - started

    seen: list[str] = []
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(role(asyncio.Event(), seen))
    assert seen == ["stop set, still running"]
    assert 0.15 <= asyncio.run(timed(asyncio.Event())) < 10


def test_a_task_set_reports_a_failure_and_close_ends_every_other(caplog: pytest.LogCaptureFixture) -> None:
    """``TaskSet``: one failure is logged and reported, not dropped, and does not cancel its
    siblings (a TaskGroup would); ``close`` cancels and awaits whatever still runs."""
    failures: list[tuple[str, str]] = []
    tasks = TaskSet("test", lambda name, exc: failures.append((name, repr(exc))))

    async def fails() -> None:
        raise RuntimeError("bug")

    async def main() -> tuple[bool, int]:
        sibling = tasks.spawn(asyncio.sleep(30), "sibling")
        failing = tasks.spawn(fails(), "failing")
        await asyncio.wait([failing])
        await asyncio.sleep(0)  # the done callbacks run
        running = not sibling.done()
        left = len(tasks)
        await tasks.close()
        assert sibling.cancelled() and len(tasks) == 0
        return running, left

    with caplog.at_level(logging.ERROR):
        running, left = asyncio.run(main())
    assert running and left == 1
    assert failures == [("failing", "RuntimeError('bug')")]
    assert "test task failing failed" in caplog.text and "RuntimeError: bug" in caplog.text
