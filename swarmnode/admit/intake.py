"""Admission off the event loop: one thread runs the pipeline, and each admit is charged its CPU.

Owns: the admission thread (the pipeline is single-threaded state: every call
into it goes through this thread), its per-peer queues served fairly by CPU, the bounds
on admits waiting for it and on how long each waits,
and measuring what each admit cost (this thread's CPU plus the verifier's) to
charge the signer and the delivering peer. Must not: judge anything itself.

Regeneration, rendering and scoring can take milliseconds per group (and the
verifier's time limits are seconds); run on the loop they stalled ``/healthz``
for as long as a scorer ran (25 s measured). Here the loop only awaits.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from swarmnode.admit.pipeline import AdmissionPipeline
from swarmnode.admit.reasons import RejectReason
from swarmnode.admit.verdict import Rejected, Verdict
from swarmnode.wire.envelope import Envelope
from swarmnode.wire.messages import Message

T = TypeVar("T")
log = logging.getLogger(__name__)

#: Admits queued or running at once; past this the newest is refused (nobody charged) rather than
#: queued: the gossip core bounds pulls in flight, so only a flood gets here.
MAX_PENDING = 256
MAX_PENDING_PER_PEER = 32  # so one delivering peer cannot take every place in the queue
#: Delivering peers whose admission CPU is remembered while they have nothing queued, so that
#: emptying its queue between envelopes does not give a peer a fresh start (``Intake._used``).
MAX_REMEMBERED_PEERS = 4096


@dataclass(frozen=True)
class Judged:
    """A verdict and, for a rejection, until when the peer it charged (or names) is banned."""

    verdict: Verdict
    banned_until: float | None = None
    #: Refused unjudged because this node's admission queue was full (``cpu_budget``): our own
    #: load, not anything the bytes or their deliverer did.
    busy: bool = False
    #: (With ``busy``.) Full with every peer's work while the deliverer's own share was not: its
    #: share full means its envelopes outlast the gossip core's wait, and it wasted our download.
    overloaded: bool = False
    #: Its own judging took most of ``Intake.max_wait``: no verdict, as if admission never answered
    #: (the gossip core's admission timeout follows). Reported as our overload, the item was
    #: pulled again from its server, which kept its standing, and every pull paused (red team
    #: rt83 F2: proven ids whose junk took 54 s to judge held their rounds' places for good).
    timed_out: bool = False


class GaveUp(TimeoutError):
    """A caller stopped waiting for its job (``Intake.max_wait``); ``ran``: for how long the job had
    run by then (0.0: it never started)."""

    def __init__(self, *, ran: float) -> None:
        super().__init__("gave up waiting for admission")
        self.ran = ran


class Intake:
    """Runs ``pipeline`` in its own thread; ``await intake.admit(...)`` from the loop.

    Work waits in one queue per delivering peer (the node's own work, ``call``/``submit``,
    first). The next envelope is from the peer whose envelopes have cost the least admission
    CPU so far (fair queuing by CPU, not by envelope): served one envelope per peer in turn, a
    peer whose envelopes cost 24x an honest one's took 24x its CPU, and 16 such peers cut an
    honest peer's judged items to 8% (red team rt34 F1). A peer that starts queuing starts at the
    level of the peer served last, or where it stood if more (remembered: ``MAX_REMEMBERED_PEERS``).

    ``max_wait``: how long ``judge`` waits for a verdict before it gives up (the gossip core's
    admission timeout, a little less): past it the core no longer counts the item, so the queue
    must not either, or it fills behind the core's back (rt34 F1)."""

    def __init__(
        self,
        pipeline: AdmissionPipeline,
        *,
        max_pending: int = MAX_PENDING,
        max_pending_per_peer: int = MAX_PENDING_PER_PEER,
        max_wait: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.pipeline = pipeline
        self.clock = clock  # the time admission judges by (wall time; a test may hold it still)
        self.max_pending = max_pending
        self.max_pending_per_peer = max_pending_per_peer
        self.max_wait = max_wait
        self.pending = 0
        self.gave_up = 0  # judges that waited past max_wait
        self._pending_by: dict[str, int] = {}  # per delivering peer: queued or running judges
        # Admission CPU each delivering peer used (queued peers, and the most recent others).
        self._used: OrderedDict[str | None, float] = OrderedDict()
        # The usage level of the peer served last (its CPU before that job): a peer that starts
        # queuing starts here, or where it stood if more. Starting at the least queued peer's level
        # (or 0) let fresh ids run ahead of a peer with an hour of history until they had used as
        # much CPU as it ever had (red team rt35 F1: its judged items fell from 92 to 6).
        self._vtime = 0.0
        self._job_cost: float | None = None  # set by an admit, read by the thread after the job
        self.overloaded = 0
        self.cpu_seconds = 0.0  # admission CPU charged so far (thread + verifier)
        self._queues: OrderedDict[str | None, deque[Callable[[], None]]] = OrderedDict()
        self._ready = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="admission", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the admission thread

    def _serve(self) -> None:
        while True:
            with self._ready:
                while not self._queues and not self._closed:
                    self._ready.wait()
                if not self._queues:
                    return  # closed and drained
                # Our own work first; then the least served peer (ties: the longest waiting).
                key = None if None in self._queues else min(self._queues, key=lambda k: self._used[k])
                if key is not None:
                    self._vtime = max(self._vtime, self._used[key])
                queue = self._queues[key]
                job = queue.popleft()
                if queue:
                    self._queues.move_to_end(key)  # behind peers it ties with
                else:
                    del self._queues[key]
            self._job_cost = None
            started = time.thread_time()
            job()
            cost = self._job_cost if self._job_cost is not None else time.thread_time() - started
            if key is not None:
                with self._ready:
                    if key in self._used:
                        self._used[key] += cost

    def _dequeue(self, key: str | None, job: Callable[[], None]) -> None:
        """Drop ``job`` if it still waits (its caller gave up): a dead job held its payload, up to
        2 MiB, until its peer's turn, while the core pulled more (red team rt35 F1)."""
        with self._ready:
            queue = self._queues.get(key)
            if queue is None:
                return
            try:
                queue.remove(job)
            except ValueError:
                return  # running or done
            if not queue:
                del self._queues[key]

    def _enqueue(self, key: str | None, job: Callable[[], None]) -> None:
        with self._ready:
            if self._closed:
                raise RuntimeError("the admission intake is closed")
            if key is not None and key not in self._queues:
                self._used[key] = max(self._used.get(key, self._vtime), self._vtime)
                self._used.move_to_end(key)
                while len(self._used) > MAX_REMEMBERED_PEERS:
                    idle = next((k for k in self._used if k not in self._queues), None)
                    if idle is None:
                        break  # every one queued (at most max_pending of them)
                    del self._used[idle]
            self._queues.setdefault(key, deque()).append(job)
            self._ready.notify()

    async def _run(self, key: str | None, fn: Callable[[], T], max_wait: float | None = None) -> T:
        """``fn``'s result from the admission thread; past ``max_wait`` seconds, TimeoutError, and
        ``fn`` is skipped if it has not started."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        given_up = threading.Event()
        started: list[float] = []  # when the thread began the job (appended there, read here)

        def job() -> None:
            if given_up.is_set():
                return  # its caller stopped waiting: nobody reads the result
            started.append(time.monotonic())
            try:
                outcome: tuple[T | None, BaseException | None] = (fn(), None)
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task, which re-raises
                outcome = (None, exc)
            if given_up.is_set():
                return  # gave up while it ran
            try:
                loop.call_soon_threadsafe(_settle, future, *outcome)
            except RuntimeError:  # the loop closed meanwhile: nobody waits, the thread serves on
                log.debug("admission result dropped: its event loop is closed")

        self._enqueue(key, job)
        if max_wait is None:
            return await future
        try:
            return await asyncio.wait_for(asyncio.shield(future), max_wait)
        except TimeoutError:
            given_up.set()
            self._dequeue(key, job)
            raise GaveUp(ran=time.monotonic() - started[0] if started else 0.0) from None

    def _admit_here(
        self,
        data: bytes,
        via: str | None,
        solicited: bool,
        envelope: Envelope | None,
        message: Message | None,
    ) -> Judged:
        now = self.clock()
        started = time.thread_time()
        verdict = self.pipeline.admit(
            data, now, via=via, solicited=solicited, envelope=envelope, message=message
        )
        cost = time.thread_time() - started + self.pipeline.last_scoring_cpu_s
        self.cpu_seconds += cost
        self._job_cost = cost  # what the fair queue charges its deliverer
        # The deliverer pays for every envelope it hands us, the signer for every envelope of its own
        # that gets past the checks anyone could fail it on (replay, age, signature: those verdicts
        # name no sender). Each envelope is judged past them once (its id is remembered), so the
        # signer pays at most once per envelope it signed, whoever delivers it.
        self.pipeline.charge_cpu(verdict.sender, via, cost, now)
        # Read now, in order: asked later, a ban earned by a *later* envelope would show here too.
        return Judged(verdict, self.pipeline.ban_left_by(verdict, via, now))

    # ------------------------------------------------------------------ the loop's side

    async def judge(
        self,
        data: bytes,
        *,
        via: str | None,
        solicited: bool,
        envelope: Envelope | None = None,
        message: Message | None = None,
    ) -> Judged:
        """The verdict on ``data``, computed in the admission thread, with the ban it left.

        ``envelope``: the caller's ``decode_envelope(data)``, and ``message`` its decoded payload,
        passed along so that admission does not decode the same bytes again (``AdmissionPipeline.admit``)."""
        key = via or ""
        waiting = self._pending_by.get(key, 0)
        own_share_full = waiting >= self.max_pending_per_peer
        if self.pending >= self.max_pending or own_share_full:
            self.overloaded += 1
            detail = f"{self.pending} admissions waiting, {waiting} from {via}"
            return Judged(Rejected(RejectReason.CPU_BUDGET, detail), busy=True, overloaded=not own_share_full)
        self.pending += 1
        self._pending_by[key] = waiting + 1
        try:
            return await self._run(
                key, lambda: self._admit_here(data, via, solicited, envelope, message), self.max_wait
            )
        except GaveUp as gave:
            self.gave_up += 1
            if self.max_wait is not None and gave.ran >= self.max_wait / 2:
                # Its own judging took most of the wait (``Judged.timed_out``). Judged by having
                # started at all, a job that waited behind others' work and began just before the
                # wait ended was the item's fault: fresh ids' jobs timed to end then made honest
                # items lose their servers' standing (red team rt84 F1: 8 of 8).
                detail = f"its judging ran {gave.ran:.1f} s of the {self.max_wait} s wait"
                return Judged(Rejected(RejectReason.CPU_BUDGET, detail), busy=True, timed_out=True)
            # It waited behind others' work most of the time: our load, as a full queue (pulled again).
            detail = f"no verdict within {self.max_wait} s"
            return Judged(Rejected(RejectReason.CPU_BUDGET, detail), busy=True, overloaded=True)
        finally:
            self.pending -= 1
            left = self._pending_by[key] - 1
            if left:
                self._pending_by[key] = left
            else:
                del self._pending_by[key]

    async def judge_unreadable(self, data: bytes, *, via: str) -> Judged:
        """The verdict on bytes a pull delivered that decode as no envelope (charged to ``via``),
        judged first in line and outside the queue's count: they fail at decode, so each costs next
        to nothing. Counted, they filled the queue that the gossip core sizes its pulls to, and
        honest envelopes behind them were refused as overloaded (red team rt32 F2). Only for such
        bytes: an envelope judged here would skip the queue's per-peer share."""
        return await self._run(None, lambda: self._admit_here(data, via, True, None, None))

    async def admit(
        self,
        data: bytes,
        *,
        via: str | None,
        solicited: bool,
        envelope: Envelope | None = None,
        message: Message | None = None,
    ) -> Verdict:
        """The verdict on ``data`` (``envelope``, ``message``: its decode, if known), from the admission
        thread."""
        verdict = await self.judge(data, via=via, solicited=solicited, envelope=envelope, message=message)
        return verdict.verdict

    async def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` (anything touching the pipeline's state) in the admission thread, first in line."""
        return await self._run(None, fn)

    async def call_as(self, fn: Callable[[], T], *, signer: str | None, via: str | None) -> T:
        """Run ``fn`` in the admission thread as work an envelope of ``signer`` delivered by ``via``
        made us do after its verdict: queued with ``via``'s envelopes (fair queuing by CPU), its
        thread CPU charged to both as an admit's. Rendering and tokenizing an admitted batch's
        groups for training ran first in line and charged to no one: 4.7x the admit's own CPU on
        the chat model, 11.8x under a 4,096-character system prompt (red team rt63 F2)."""

        def charged() -> T:
            started = time.thread_time()
            try:
                return fn()
            finally:
                cost = time.thread_time() - started
                self.cpu_seconds += cost
                self._job_cost = cost  # what the fair queue charges ``via``
                self.pipeline.charge_cpu(signer, via, cost, self.clock())

        return await self._run(via or "", charged)

    def submit(self, fn: Callable[[], object]) -> None:
        """Queue ``fn`` in the admission thread without waiting (before any peer's work still queued)."""

        def job() -> None:
            try:
                fn()
            except Exception:  # a bug in the node's own job: say so, keep the thread serving peers
                log.exception("admission-thread job %r failed", fn)

        self._enqueue(None, job)

    def close(self) -> None:
        """Finish what is queued, then stop the thread."""
        with self._ready:
            self._closed = True
            self._ready.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join()


def _settle(future: asyncio.Future[T], result: T | None, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)  # type: ignore[arg-type]


__all__ = ["MAX_PENDING", "Intake", "Judged"]
