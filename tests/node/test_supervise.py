"""Supervision: failures are counted and restarted with backoff; a persistent failure stops loudly."""

from __future__ import annotations

import asyncio
import logging

import pytest

from swarmnode.ops.metrics import Metrics
from swarmnode.ops.supervise import JobFailed, SupervisionPolicy, supervise

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
