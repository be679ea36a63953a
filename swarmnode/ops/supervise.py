"""Supervision of the node's long-running jobs.

A job that raises is logged with its traceback, counted in metrics and
restarted with exponential backoff. After ``max_failures`` consecutive failures
(a run that stayed up for ``healthy_after`` seconds resets the count) the job
raises ``JobFailed`` naming itself and the cause, which ends the node's
TaskGroup: a persistent failure stops the node loudly instead of looping forever.

``stop_on_signals`` is the one SIGINT/SIGTERM rule of every asyncio role; ``TaskSet`` the one
owner of a driver's background tasks.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from swarmnode.errors import SwarmError
from swarmnode.ops.metrics import Metrics

log = logging.getLogger(__name__)
T = TypeVar("T")


class JobFailed(SwarmError):
    def __init__(self, job: str, cause: BaseException, failures: int) -> None:
        super().__init__(f"job '{job}' failed {failures} times in a row; last error: {cause!r}")
        self.job = job
        self.cause = cause


@dataclass(frozen=True)
class SupervisionPolicy:
    max_failures: int = 5
    backoff_initial: float = 0.5
    backoff_max: float = 30.0
    healthy_after: float = 60.0


async def supervise(
    name: str,
    job: Callable[[], Awaitable[None]],
    metrics: Metrics,
    policy: SupervisionPolicy = SupervisionPolicy(),
) -> None:
    """Run ``job`` until it returns; restart it on failure as described in the module docstring."""
    failures = 0
    backoff = policy.backoff_initial
    while True:
        started = time.monotonic()
        try:
            await job()
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the supervision boundary: log, count, restart or stop loudly
            if time.monotonic() - started >= policy.healthy_after:
                failures, backoff = 0, policy.backoff_initial
            failures += 1
            metrics.inc(
                "task_restarts", "Supervised job failures (each followed by a restart or a stop)", job=name
            )
            log.error("job %s failed (%d/%d in a row)", name, failures, policy.max_failures, exc_info=exc)
            if failures >= policy.max_failures:
                raise JobFailed(name, exc, failures) from exc
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, policy.backoff_max)


async def run_jobs(
    jobs: Mapping[str, Callable[[], Awaitable[None]]], metrics: Metrics, stop: asyncio.Event
) -> None:
    """Run every job supervised in one TaskGroup until ``stop`` is set (then cancel them all).

    A job that fails persistently raises its ``JobFailed`` as itself (the CLI prints it)."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [
                group.create_task(supervise(name, job, metrics), name=name) for name, job in jobs.items()
            ]

            async def stop_when_asked() -> None:
                await stop.wait()
                for task in tasks:
                    task.cancel()

            group.create_task(stop_when_asked())
    except* JobFailed as failed:
        raise failed.exceptions[0] from None


def stop_on_signals(stop: asyncio.Event, *, max_seconds: float | None = None) -> None:
    """The one signal rule of the asyncio roles (trainer, learner, worker, bootstrap), installed in
    the running loop: a first SIGINT/SIGTERM sets ``stop`` (the role finishes the step in progress
    and stops cleanly), a second cancels the task that called this (abort now; the last checkpoint
    stays the resume point). ``max_seconds`` sets ``stop`` after that long."""
    loop = asyncio.get_running_loop()
    current = asyncio.current_task()

    def on_signal() -> None:
        if stop.is_set() and current is not None:
            current.cancel()
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    if max_seconds is not None:
        loop.call_later(max_seconds, stop.set)


class TaskSet:
    """The tasks a driver runs beside its own loop (a pull, a send, a chunk upload): the one helper for
    background work below a role's TaskGroup.

    Not a TaskGroup, deliberately: one failed send must not cancel every other send and the driver
    with them. But nothing is dropped either: a task that raises is logged with its traceback and
    handed to ``on_failure`` (a metric), and ``close`` cancels and awaits every task still running,
    so none outlives its driver."""

    def __init__(self, owner: str, on_failure: Callable[[str, BaseException], None] | None = None) -> None:
        self.owner = owner
        self.on_failure = on_failure
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled() or (exc := task.exception()) is None:
            return
        log.error("%s task %s failed", self.owner, task.get_name(), exc_info=exc)
        if self.on_failure is not None:
            self.on_failure(task.get_name(), exc)

    def cancel(self) -> list[asyncio.Task[Any]]:
        """Cancel every running task; returns them (to await)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        return tasks

    async def close(self) -> None:
        """Cancel every running task and wait until each has ended."""
        await asyncio.gather(*self.cancel(), return_exceptions=True)
