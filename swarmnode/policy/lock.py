"""The one lock on a node's model: torch work on it runs in a thread, one job at a time.

Owns: the order in which a role's torch jobs (generate, train, evaluate, spot-check recompute,
installing received weights, checkpointing) touch the model. Must not: decide what those jobs do.

Two locks, each for a reason. Callers queue on an ``asyncio.Lock`` in the event loop, so a waiting
job holds no executor thread. The job itself runs in ``asyncio.to_thread`` under a
``threading.Lock``, because cancelling the awaiting task does not stop its thread: without the
second lock the next job could start while a cancelled one is still running torch on the model.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

T = TypeVar("T")

HELD_POLL_SECONDS = 0.01


class ModelLock:
    """``await lock.run(fn, *args)``: ``fn(*args)`` in a thread, never concurrently with another job."""

    def __init__(self) -> None:
        self._queue = asyncio.Lock()
        self._held = threading.Lock()

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        async with self._queue:
            return await asyncio.to_thread(self._locked, fn, args, kwargs)

    def _locked(self, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
        with self._held:  # a cancelled caller's job may still be running: wait for it here
            return fn(*args, **kwargs)

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """``async with lock.held():`` the model is ours for a block run in the event loop (a swap of
        weights that must be decided and done in one go). Waits, without blocking the loop, for a
        cancelled caller's job that is still running in its thread."""
        async with self._queue:
            while not self._held.acquire(blocking=False):
                await asyncio.sleep(HELD_POLL_SECONDS)  # rare: only behind a cancelled caller's job
            try:
                yield
            finally:
                self._held.release()

    def busy(self) -> bool:
        """Whether a job is queued or running (for status pages; racy by nature)."""
        return self._queue.locked() or self._held.locked()


__all__ = ["ModelLock"]
