"""The simulator's runtime: trio with a virtual clock, and a calendar of timed callbacks.

Owns
    Virtual time and the order in which things happen. The simulation runs inside ``trio.run``
    with ``trio.testing.MockClock(autojump_threshold=0)``; ``trio.current_time()`` is the
    simulated clock everywhere. Message deliveries and timers are entries of one calendar (a
    heap) run by a single trio task, which advances the MockClock to each entry's time: a trio
    task per message would cost ~50 µs of scheduler work per wake-up (measured: trio 0.35,
    ``await trio.sleep`` under MockClock), 30x the cost of a calendar entry, and a 1,000-node
    broadcast has millions of messages. Long-lived behaviours (churn, publishing workloads, the
    activation planner) are ordinary trio tasks that sleep on the virtual clock with
    ``await sim.sleep_until(t)``.

    Determinism: entries at equal times run in the order they were scheduled, and a process task
    woken by the calendar runs alone until it sleeps again (trio shuffles the order of tasks
    runnable in the same batch; waking one at a time keeps a run a pure function of its seed).

Must not
    Know anything about networks or protocols; block on real I/O; read the wall clock.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Awaitable, Callable
from typing import Any

from swarmnode.sim import sim_extra_missing

try:
    import trio
    import trio.testing
except ImportError as exc:  # installed without the simulator's extra
    raise sim_extra_missing("trio") from exc

# Yield to trio's scheduler at least this often even when no process task is due, so that
# cancellation (Ctrl-C) and trio's own housekeeping are never starved by a long calendar run.
_CHECKPOINT_EVERY = 4096


class Simulation:
    """A calendar on a trio MockClock. Create, schedule, ``run(until)``."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.clock = trio.testing.MockClock(autojump_threshold=0)
        self._heap: list[tuple[float, int, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = itertools.count()
        self._now = 0.0
        self._awake = 0  # process tasks running (woken, not yet asleep again)
        self._nursery: trio.Nursery | None = None
        self._processes: list[tuple[Callable[..., Awaitable[None]], tuple[Any, ...]]] = []
        self._stop = False
        self.events_run = 0

    # -- time -----------------------------------------------------------------------------------

    @property
    def now(self) -> float:
        """The current virtual time (the calendar entry's exact time; trio's clock agrees)."""
        return self._now

    def at(self, t: float, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` at virtual time ``t`` (now, if ``t`` is in the past)."""
        if not math.isfinite(t):
            raise ValueError(f"cannot schedule at a non-finite time {t!r}")
        heapq.heappush(self._heap, (max(t, self._now), next(self._seq), fn, args))

    def after(self, delay: float, fn: Callable[..., Any], *args: Any) -> None:
        self.at(self._now + delay, fn, *args)

    def stop(self) -> None:
        """End the run after the current entry (e.g. every broadcast receiver completed)."""
        self._stop = True

    # -- process tasks ----------------------------------------------------------------------------

    def process(self, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        """Run ``await fn(*args)`` as a trio task; it must only wait with ``sim.sleep_until``."""
        if self._nursery is None:
            self._processes.append((fn, args))
        else:
            self._start_process(fn, args)

    async def sleep_until(self, t: float) -> None:
        event = trio.Event()
        self.at(t, self._wake, event)
        self._awake -= 1
        await event.wait()

    async def sleep(self, delay: float) -> None:
        await self.sleep_until(self._now + delay)

    def _wake(self, event: trio.Event) -> None:
        self._awake += 1
        event.set()

    def _start_process(self, fn: Callable[..., Awaitable[None]], args: tuple[Any, ...]) -> None:
        async def wrapper() -> None:
            try:
                await fn(*args)
            finally:
                self._awake -= 1

        assert self._nursery is not None
        self._awake += 1
        self._nursery.start_soon(wrapper)

    async def _settle(self) -> None:
        """Let woken process tasks run until every one of them sleeps again (one at a time)."""
        while self._awake > 0:
            await trio.lowlevel.checkpoint()

    # -- running --------------------------------------------------------------------------------

    def run(self, until: float) -> None:
        """Run the calendar up to virtual time ``until`` (or until ``stop()``)."""
        trio.run(self._main, until, clock=self.clock)

    async def _main(self, until: float) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for fn, args in self._processes:
                self._start_process(fn, args)
                await self._settle()  # one at a time, in the order they were added
            self._processes.clear()
            await self._loop(until)
            nursery.cancel_scope.cancel()
        self._nursery = None

    async def _loop(self, until: float) -> None:
        # The hot loop of every run (millions of entries): locals instead of attribute lookups,
        # one pop per entry (an entry past ``until`` is pushed back once, at the end).
        heap = self._heap
        heappop = heapq.heappop
        clock = self.clock
        since_checkpoint = 0
        while heap and not self._stop:
            entry = heappop(heap)
            t = entry[0]
            if t > until:
                heapq.heappush(heap, entry)
                break
            if t > self._now:
                self._now = t
                clock.jump(max(0.0, t - clock.current_time()))
            entry[2](*entry[3])
            self.events_run += 1
            since_checkpoint += 1
            if self._awake > 0:
                await self._settle()
                since_checkpoint = 0
            elif since_checkpoint >= _CHECKPOINT_EVERY:
                await trio.lowlevel.checkpoint()
                since_checkpoint = 0
        if not self._stop and until > self._now:
            self._now = until
            self.clock.jump(max(0.0, until - trio.current_time()))
