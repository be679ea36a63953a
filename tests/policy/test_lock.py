"""The model lock: torch jobs never overlap, even when the task awaiting one is cancelled."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from swarmnode.policy.lock import ModelLock


def test_jobs_run_one_at_a_time_in_threads() -> None:
    lock = ModelLock()
    running = 0
    most = 0
    guard = threading.Lock()

    def job(seconds: float) -> int:
        nonlocal running, most
        with guard:
            running += 1
            most = max(most, running)
        time.sleep(seconds)
        with guard:
            running -= 1
        return threading.get_ident()

    async def main() -> list[int]:
        return await asyncio.gather(*(lock.run(job, 0.02) for _ in range(5)))

    idents = asyncio.run(main())
    assert most == 1
    assert threading.get_ident() not in idents  # never on the event loop's thread


def slow_job(log: list[str], release: threading.Event) -> Callable[[], None]:
    """A torch job that runs until ``release`` is set, logging its start and end."""

    def slow() -> None:
        log.append("slow start")
        release.wait(10)
        log.append("slow end")

    return slow


def test_a_cancelled_callers_job_still_holds_the_model_until_it_ends() -> None:
    lock, log, release = ModelLock(), [], threading.Event()
    slow = slow_job(log, release)

    def fast() -> None:
        log.append("fast")

    async def main() -> None:
        first = asyncio.create_task(lock.run(slow))
        while "slow start" not in log:
            await asyncio.sleep(0.001)
        first.cancel()  # the awaiting task goes; its thread keeps running torch
        second = asyncio.create_task(lock.run(fast))
        await asyncio.sleep(0.05)
        assert log == ["slow start"]  # the next job waits for the running one, not for the task
        assert lock.busy()
        release.set()
        await second

    asyncio.run(main())
    assert log == ["slow start", "slow end", "fast"]


def test_a_block_held_in_the_loop_excludes_thread_jobs_and_waits_out_a_cancelled_one() -> None:
    lock, log, release = ModelLock(), [], threading.Event()
    slow = slow_job(log, release)

    async def main() -> None:
        first = asyncio.create_task(lock.run(slow))
        while "slow start" not in log:
            await asyncio.sleep(0.001)
        first.cancel()

        async def swap() -> None:
            async with lock.held():
                log.append("swap")

        swapping = asyncio.create_task(swap())
        await asyncio.sleep(0.05)
        assert log == ["slow start"]  # the swap waits for the cancelled caller's job, loop free
        release.set()
        await swapping
        async with lock.held():
            job = asyncio.create_task(lock.run(log.append, "job"))
            await asyncio.sleep(0.05)
            assert log[-1] == "swap"  # no job runs while the block holds the model
        await job

    asyncio.run(main())
    assert log == ["slow start", "slow end", "swap", "job"]
