"""The gossip driver: performs the sans-IO ``GossipCore``'s actions over hivemind.

Owns: the DHT keys of announcements, the pull stream's framing, and the I/O of
intake: handing every pulled payload to the admission thread, and admitted groups
to the external pool. Must not: decide what to pull or serve (the core does),
judge a payload (the admission pipeline does), or hold a rule of its own about
what follows a verdict, an own envelope or a failed store (``gossip.intake`` and
``gossip.records`` do, for the simulator too).

Wire details (protocol/SPEC.md "Gossip transport"):
- announcement record: DHT key ``swarmnode/<swarm>/round/<r>`` (with announcement buckets,
  ``swarmnode/<swarm>/round/<r>/bucket/<b>``), subkey ``part<k>``,
  value = an encoded ``Announce`` payload; records are owned (signed by the
  writer's libp2p key), so no peer can overwrite another's.
- pull: stream handler ``swarmnode.pull.v1``; request = concatenated 32-byte
  envelope ids; response = for each item found, a 4-byte big-endian length and
  the envelope bytes.
"""

from __future__ import annotations

import asyncio
import logging
import random
import struct
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

from swarmnode.admit import AdmissionPipeline, Rejected, RejectReason
from swarmnode.admit.intake import Intake
from swarmnode.gossip.census import AnnouncerCensus
from swarmnode.gossip.core import (
    ITEM_PREFIX_BYTES,
    RELAY_PART,
    Admit,
    Announce,
    Announced,
    CancelPull,
    GossipConfig,
    GossipCore,
    Pull,
    PullFailed,
    PullRequest,
    PullSucceeded,
    ReadAnnouncements,
    Retire,
    Serve,
    max_pull_response,
)
from swarmnode.gossip.intake import (
    DecodedEnvelopes,
    ExternalPool,
    SenderTallies,
    decode_pulled,
    publication,
    verdict_events,
)
from swarmnode.gossip.records import AnnouncementStores
from swarmnode.net.errors import CallFailure, NetError, PeerCallError
from swarmnode.net.framing import ReadProgress
from swarmnode.net.hivemind_runtime import HivemindRuntime
from swarmnode.ops.faults import fault_point
from swarmnode.ops.metrics import Metrics
from swarmnode.ops.supervise import TaskSet
from swarmnode.train.batch import ScoredGroup
from swarmnode.wire import Announce as AnnounceMessage
from swarmnode.wire import Envelope, Kind, WireError, decode_envelope, decode_payload, encode_payload

log = logging.getLogger(__name__)

PULL_HANDLER = "swarmnode.pull.v1"
DIGEST_BYTES = 32
MAX_PULL_REQUEST = 64 * DIGEST_BYTES
MAX_PULL_RESPONSE = max_pull_response(GossipConfig(), MAX_PULL_REQUEST // DIGEST_BYTES)
DHT_TIMEOUT = 10.0
_SHUFFLE = random.SystemRandom()


#: Failures of a pull that only the server's own bytes cause: an honest server's answer fits
#: ``max_pull_response`` and keeps the stream's framing (SPEC 1.4a).
_SERVERS_BYTES = frozenset({CallFailure.TOO_LARGE, CallFailure.PROTOCOL})


#: A pull that times out, or whose stream ends, after this much of its answer arrived is charged:
#: a server that sends most of a full answer and then stalls or hangs up chose to (red team rt27:
#: 16 MiB per pull, uncharged, 88 MiB a minute per identity, 1.3 GiB with 16). Below it a slow or
#: lost peer only backs off: a reset connection ends an honest answer too, and each counted as a
#: rejection shunned honest demo peers from each other for 10 minutes after three.
STALLED_ANSWER_BYTES = 1024 * 1024
#: Failures a lost connection causes as well as the server: charged only past STALLED_ANSWER_BYTES.
_LOST_OR_STALLED = frozenset({CallFailure.TIMEOUT, CallFailure.CLOSED})
#: Of the core's admission timeout, how long the admission queue waits for a verdict.
INTAKE_WAIT_SHARE = 0.9


def pull_failure_charged(exc: BaseException) -> bool:
    """Whether a failed pull is the server's fault (``PullFailed.charged``): an answer too large,
    with broken framing (stream or items), or stalled or cut off after ``STALLED_ANSWER_BYTES``.
    Not a plain timeout, a stream that ended early (the network may have lost it), an unreachable
    peer, or the server's refusal (an error frame costs us a few bytes, and an honest server's
    handler can fail)."""
    if isinstance(exc, PeerCallError):
        if exc.reason in _LOST_OR_STALLED:
            return exc.received >= STALLED_ANSWER_BYTES
        return exc.reason in _SERVERS_BYTES
    return isinstance(exc, ValueError)  # decode_items: the items' framing is broken


def is_relay_part(subkey: bytes) -> bool:
    """Whether an announcement record's subkey names a relay part (``part<N>``, N >= RELAY_PART)."""
    number = subkey.removeprefix(b"part")
    return number != subkey and number.isdigit() and int(number) >= RELAY_PART


def announcement_key(swarm: str, round_index: int, bucket: int | None = None) -> str:
    """The DHT key of a round's announcement records; with buckets (``gossip.announce_buckets``
    > 1), of one bucket of them."""
    if bucket is None:
        return f"swarmnode/{swarm}/round/{round_index}"
    return f"swarmnode/{swarm}/round/{round_index}/bucket/{bucket}"


def encode_items(items: Sequence[bytes]) -> bytes:
    return b"".join(struct.pack(">I", len(item)) + item for item in items)  # ITEM_PREFIX_BYTES


def decode_items(data: bytes, max_items: int) -> list[bytes]:
    """Inverse of ``encode_items``; raises ValueError on a broken frame."""
    items: list[bytes] = []
    offset = 0
    while offset < len(data):
        if len(items) >= max_items or offset + 4 > len(data):
            raise ValueError("pull response: too many items or a cut length prefix")
        (size,) = struct.unpack_from(">I", data, offset)
        offset += 4
        if offset + size > len(data):
            raise ValueError("pull response: item longer than the response")
        items.append(data[offset : offset + size])
        offset += size
    return items


class GossipDriver:
    """Runs one node's gossip over a started ``HivemindRuntime``."""

    def __init__(
        self,
        core: GossipCore,
        runtime: HivemindRuntime,
        admission: AdmissionPipeline,
        pool: ExternalPool,
        convert: Callable[..., ScoredGroup],
        metrics: Metrics,
        swarm: str,
        intake: Intake | None = None,
    ) -> None:
        self.core = core
        self.runtime = runtime
        self.admission = admission
        # Admission runs in its own thread (it regenerates, renders and scores): the loop only awaits.
        # Its queue holds all the core may hand it, in all and per peer: items past either limit
        # would be refused unjudged, lost, and held against their server (red team rt31 F3).
        c = core.config
        # It gives up a little before the core does, so that it never counts what the core no
        # longer does (red team rt34 F1).
        self.intake = intake or Intake(
            admission,
            max_pending=c.max_pending_admissions,
            max_pending_per_peer=c.max_pending_admissions_per_peer,
            max_wait=INTAKE_WAIT_SHARE * c.admission_timeout,
        )
        self.pool = pool
        self.convert = convert
        self.metrics = metrics
        self.swarm = swarm
        self.own_payloads: dict[bytes, bytes] = {}
        self._wake = asyncio.Event()
        self._pending: list[object] = []
        self._pulls: dict[int, asyncio.Task[None]] = {}
        self._background = TaskSet(
            "gossip",
            lambda name, exc: self.metrics.inc(
                "task_restarts", "Supervised job failures", job=f"gossip:{name}"
            ),
        )
        self._senders = SenderTallies()
        self._stores = AnnouncementStores()
        self._decoded = DecodedEnvelopes()  # pulled payloads' decodes, until their Admit
        # Warns once when a round's announcers outgrow small-swarm settings (README, "In a large swarm").
        self._census = AnnouncerCensus(c.round_demand, c.announce_buckets)

    # ------------------------------------------------------------------ entry points

    async def start(self) -> None:
        await self.runtime.add_stream_handler(
            PULL_HANDLER, self._serve_pull, max_request_bytes=MAX_PULL_REQUEST, timeout=30.0
        )

    def publish(self, envelope_bytes: bytes) -> bytes:
        envelope = decode_envelope(envelope_bytes)
        if isinstance(envelope, WireError):
            raise ValueError(f"refusing to publish bytes that are not an envelope: {envelope.detail}")
        event = publication(envelope, envelope_bytes)
        admission = self.admission
        # In the admission thread, which owns the replay cache: handed back, it is a replay.
        self.intake.submit(lambda: admission.remember_own(envelope, time.time()))
        self.own_payloads[event.digest] = envelope_bytes
        self._feed(event)
        self.metrics.inc("groups_published_batches", "Rollout batches published")
        return event.digest

    async def run(self) -> None:
        """The exchange job: wait for the next deadline or event, perform the resulting actions."""
        try:
            while True:
                deadline = self.core.next_deadline()
                timeout = None if deadline is None else max(0.0, deadline - time.time())
                if not self._pending:
                    self._wake.clear()
                    try:
                        await asyncio.wait_for(self._wake.wait(), timeout=timeout)
                    except TimeoutError:
                        pass
                now = time.time()
                events, self._pending = self._pending, []
                # One scheduling pass a wake: handle_all polls too (red team rt29 F2).
                actions = self.core.handle_all(events, now) if events else self.core.poll(now)  # type: ignore[arg-type]
                for action in actions:
                    self._perform(action)
                # Every Admit of these pull results was just performed; the rest the core dropped.
                self._decoded.clear()
        finally:
            self._background.cancel()  # the pulls are among them
            self.intake.close()

    # ------------------------------------------------------------------ internals

    def _feed(self, event: object) -> None:
        self._pending.append(event)
        self._wake.set()

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        # Each helper task handles its expected failures; anything else is a bug worth seeing (TaskSet).
        return self._background.spawn(coro, name)

    def _task_failed(self, name: str, exc: BaseException) -> None:
        self.metrics.inc("task_restarts", "Supervised job failures", job=f"gossip:{name}")

    def _perform(self, action: object) -> None:
        if isinstance(action, Announce):
            self._spawn(self._announce(action), "announce")
        elif isinstance(action, ReadAnnouncements):
            self._spawn(self._read(action), "read")
        elif isinstance(action, Pull):
            self._pulls[action.request_id] = self._spawn(self._pull(action), "pull")
        elif isinstance(action, CancelPull):
            task = self._pulls.pop(action.request_id, None)
            if task is not None:
                task.cancel()
        elif isinstance(action, Admit):
            self._spawn(self._admit(action, self._decoded.take(action.payload)), "admit")
        elif isinstance(action, Retire):
            self.own_payloads.pop(action.digest, None)
        elif isinstance(action, Serve):
            pass  # answered inline by _serve_pull
        else:
            log.warning("gossip driver: unknown action %r", action)

    async def _announce(self, action: Announce) -> None:
        """Store the record; when and with which expiry to store it again is ``gossip.records``'s rule
        (the core never re-announces a part on its own: a lost store would lose every item in it)."""
        value = encode_payload(AnnounceMessage(round=action.round, rollout_digests=tuple(action.digests)))
        stores = self._stores
        stores.prune(time.time())
        attempt = 0
        while (expires_at := stores.expiry_for(action, time.time())) is not None:
            try:
                if await self.runtime.dht_store(
                    announcement_key(self.swarm, action.round, action.bucket),
                    f"part{action.part}".encode(),
                    value,
                    expires_at,
                    timeout=DHT_TIMEOUT,
                    await_all_replicas=False,
                ):
                    return
                failure = "no replica accepted it"
            except (NetError, OSError) as exc:
                failure = str(exc)
            except ValueError as exc:  # not storable at all: retrying cannot help
                log.warning("announcement for round %d not storable: %s", action.round, exc)
                return
            log.info(
                "announcement for round %d not stored (attempt %d): %s", action.round, attempt + 1, failure
            )
            delay = stores.retry_delay(attempt)
            if delay is None:
                return
            await asyncio.sleep(delay)
            if stores.superseded(action, expires_at):
                return
            attempt += 1

    async def _read(self, action: ReadAnnouncements) -> None:
        keys: list[tuple[int, int | None]] = (
            [(r, b) for r, buckets in zip(action.rounds, action.buckets, strict=True) for b in buckets]
            if action.buckets
            else [(r, None) for r in action.rounds]
        )
        for round_index, bucket in keys:
            try:
                records = await self.runtime.dht_get(
                    announcement_key(self.swarm, round_index, bucket), timeout=DHT_TIMEOUT
                )
            except (NetError, OSError) as exc:  # retried at the next read interval
                log.info("reading announcements of round %d failed: %r", round_index, exc)
                continue
            events = []
            for record in records:
                if record.owner == self.runtime.peer_id:
                    continue
                message = decode_payload(Kind.ANNOUNCE, record.value)
                if isinstance(message, WireError):
                    self.metrics.inc("announcements_invalid", "Unreadable announcement records")
                    log.debug("bad announcement from %s: %s", record.owner, message)
                    continue
                if isinstance(message, AnnounceMessage):
                    if message.round != round_index:  # SPEC 1.4: the same r as its key (rt69 F7)
                        self.metrics.inc("announcements_invalid", "Unreadable announcement records")
                        continue
                    digests = tuple(message.rollout_digests)
                    relayed = is_relay_part(record.subkey)
                    events.append(Announced(record.owner, message.round, digests, bucket, relayed))
            # In no order a peer can choose: the DHT returns records by owner, and peers choose
            # their ids, so free ids sorted first had their digests in the table first (red team rt24 F1).
            _SHUFFLE.shuffle(events)
            for event in events:
                self._feed(event)
            self._census.count(events)
        if (warning := self._census.warning()) is not None:
            log.warning(warning)

    async def _pull(self, action: Pull) -> None:
        limit = action.max_bytes  # a probe's; else what an honest answer may hold
        most = max_pull_response(self.core.config, len(action.digests)) if limit is None else limit
        progress = ReadProgress()
        try:
            response = await self.runtime.call_stream(
                action.peer,
                PULL_HANDLER,
                b"".join(action.digests),
                timeout=action.timeout,
                max_response_bytes=most,
                progress=progress,
            )
        except asyncio.CancelledError:
            # CancelPull (a ban): the core waits for what the bytes read so far cost (red team
            # rt30 F1: a server that got itself banned mid-answer read 16 MiB for nothing).
            self._feed(PullFailed(action.request_id, action.peer, "cancelled", received=progress.received))
            raise
        except (PeerCallError, NetError, OSError) as exc:
            self._pulls.pop(action.request_id, None)
            reason = exc.reason.value if isinstance(exc, PeerCallError) else type(exc).__name__
            received = exc.received if isinstance(exc, PeerCallError) else 0  # else: failed here, not there
            # The core forgives an answer over a cut-short limit (Pull.max_bytes), not the driver.
            charged = pull_failure_charged(exc)
            failed = PullFailed(action.request_id, action.peer, reason, charged=charged, received=received)
            self._feed(failed)
            return
        try:
            payloads = decode_items(response, len(action.digests))
        except ValueError as exc:  # the items' framing is broken
            self._pulls.pop(action.request_id, None)
            charged, got = pull_failure_charged(exc), len(response)
            self._feed(PullFailed(action.request_id, action.peer, "bad_items", charged=charged, received=got))
            return
        self._pulls.pop(action.request_id, None)
        pulled = decode_pulled(payloads, self._decoded)
        for payload in pulled.not_envelopes:
            self._spawn(self._refuse_non_envelope(action.peer, payload), "refuse")
        self.metrics.inc("groups_received_batches", "Rollout batches received from peers", len(pulled.items))
        answer = PullSucceeded(action.request_id, action.peer, pulled.items, pulled.unreadable, len(response))
        self._feed(answer)

    async def _admit(self, action: Admit, envelope: Envelope | None = None) -> None:
        # Pulled by id, so solicited: the per-sender rate bucket is for unsolicited pushes; the CPU
        # it costs is charged to the signer and to the peer that announced and served it (via).
        # ``envelope``: the decode of these bytes made at the pull, so admission does not redo it.
        fault_point("receive", may_pause=False)  # on the event loop: a pause would stall the node
        judged = await self.intake.judge(action.payload, via=action.peer, solicited=True, envelope=envelope)
        if judged.timed_out:
            # Its own judging outlasted the wait: left to the core's admission timeout, which comes
            # a little later (``INTAKE_WAIT_SHARE``): its server unproven, the id not pulled again.
            self.metrics.inc("admissions_timed_out", "Pulled items whose judging outlasted the wait")
            return
        verdict, now = judged.verdict, time.time()
        busy, overloaded = judged.busy, judged.overloaded
        if self.core.config.relay and not isinstance(verdict, Rejected):
            # Kept before the core hears of the verdict: it serves the item as a relay, or retires it.
            self.own_payloads[action.digest] = action.payload
        for event in verdict_events(
            action.peer,
            action.digest,
            verdict,
            judged.banned_until,
            busy=busy,
            overloaded=overloaded,
            max_age_s=self.admission.config.max_age_s,
        ):
            self._feed(event)
        if isinstance(verdict, Rejected):
            self._rejected(verdict, judged.banned_until)
            if verdict.sender is not None:
                self._senders.refused(verdict.sender, now)
            return
        groups = verdict.groups
        # Re-tokenizing peer text is work too: off the loop, in the admission thread, charged to the
        # envelope's signer and deliverer as its admit was.
        converted = await self.intake.call_as(
            lambda: [self.convert(admitted) for admitted in groups], signer=verdict.sender, via=action.peer
        )
        # The round it joins the pool in is the one it is ready in: it waited in its deliverer's
        # turn of the queue (red team rt64 F2).
        round_index = self.core.current_round(time.time())
        for admitted, scored in zip(groups, converted, strict=True):
            self.metrics.inc("groups_accepted", "External groups admitted")
            self.pool.add(scored, round_index)
            self._senders.add(admitted.sender, scored.rewards, admitted.group, now)

    async def _refuse_non_envelope(self, peer: str, payload: bytes) -> None:
        judged = await self.intake.judge_unreadable(payload, via=peer)
        for event in verdict_events(peer, None, judged.verdict, judged.banned_until):
            self._feed(event)  # the ban it left, if any: the bytes never had a digest to admit
        if isinstance(judged.verdict, Rejected):  # always: the bytes do not decode as an envelope
            self._rejected(judged.verdict, judged.banned_until)

    def _rejected(self, verdict: Rejected, until: float | None) -> None:
        """Count a rejection; ``until``: the ban it left (``AdmissionPipeline.ban_left_by``)."""
        self.metrics.inc("groups_rejected", "Rejected rollout batches by reason", reason=verdict.reason.value)
        if until is not None and verdict.reason is not RejectReason.BANNED:  # it crossed the threshold
            self.metrics.inc("bans", "Peers banned")

    def sender_tallies(self) -> dict[str, dict[str, float]]:
        """Per signer (Ed25519 peer id): admitted groups and their rewards, ours and claimed."""
        return self._senders.as_dict()

    def count_used(self, by_sender: Mapping[str, int], replayed: Mapping[str, int]) -> None:
        """Groups the trainer's sharing rule trained on, and remembered answers ``replay`` trained
        on again, per signer (the dashboard's "used" and "replayed")."""
        self._senders.used(by_sender, replayed)

    async def _serve_pull(self, peer_id: str, request: bytes) -> bytes:
        if len(request) % DIGEST_BYTES:
            raise ValueError("pull request is not a whole number of 32-byte digests")
        digests = tuple(request[i : i + DIGEST_BYTES] for i in range(0, len(request), DIGEST_BYTES))
        actions = self.core.handle(PullRequest(peer_id, digests), time.time())
        served: list[bytes] = []
        for action in actions:
            if isinstance(action, Serve):
                served = [self.own_payloads[d] for d in action.digests if d in self.own_payloads]
            else:
                self._perform(action)
        self.metrics.inc("groups_served_batches", "Rollout batches served to peers", len(served))
        return encode_items(served)


__all__ = [
    "DHT_TIMEOUT",
    "DIGEST_BYTES",
    "ITEM_PREFIX_BYTES",
    "MAX_PULL_REQUEST",
    "MAX_PULL_RESPONSE",
    "PULL_HANDLER",
    "STALLED_ANSWER_BYTES",
    "GossipDriver",
    "announcement_key",
    "decode_items",
    "encode_items",
    "max_pull_response",
    "pull_failure_charged",
]
