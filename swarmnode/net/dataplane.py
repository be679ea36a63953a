"""Direct TCP data plane: signed request/response between peers, with an upload rate limit.

Owns
    A TCP server and a pool of client connections (asyncio streams, no libp2p), the
    request/response exchange over them, and this node's upload token bucket. Every message is
    one encoded, signed ``Envelope`` carried as one message of ``net/framing.py`` frames; the
    peer of an exchange is the envelope's signer. Used by the weight broadcast (ChunkRequest,
    ChunkHave) and by worker mode (RolloutBatch, Activate, Deactivate, Heartbeat).

Must not
    Judge payloads beyond their wire form (handlers and ``swarmnode.admit`` do), keep messages,
    or let one bad frame, envelope or handler take the server down.

Usage
    ``dp = DataPlane(identity, host="127.0.0.1", port=0, upload_rate=8e6)``;
    ``dp.register(Kind.CHUNK_REQUEST, handler)``; ``await dp.start()``; ``dp.address`` is
    ``"host:port"``; ``reply = await dp.request(address, message, timeout=5.0)``;
    ``await dp.close()``.

    A handler is ``async handler(sender_peer_id, envelope, message)`` and returns a ``Message``
    (signed by this node), an ``Envelope`` (sent as is), ``None`` (an empty answer: ``request``
    returns ``None``), or a ``Reply(answer, after)`` whose ``after(sent_ok)`` runs once the
    answer is written (or failed): how the broadcast learns that an upload slot is free again.
    Raising ``RefuseRequest(reason, detail)`` answers with a signed ``Refusal``; ``request`` raises
    ``PeerRefused`` for it. Any other exception is logged with its traceback and answered with
    an ERROR frame (``RemoteError``).

    The upload token bucket (``upload_rate`` bytes/s, ``None`` = unlimited) paces every byte
    this node writes, requests and answers alike, in frames of ``PACE_FRAME`` bytes taken in
    FIFO order, so concurrent uploads share it fairly and a bandwidth bound means something
    on one machine.

Hivemind fallback (issue #5: for a peer with no reachable direct address)
    ``await dp.attach_fallback(runtime)`` (a running ``HivemindRuntime``) serves the same
    handlers on the libp2p stream ``FALLBACK_STREAM``: one stream per request, carrying the
    same bytes as TCP (one encoded signed Envelope each way, framed by ``net/framing.py``,
    requests capped at ``MAX_ENVELOPE_BYTES``, answers at the caller's ``max_response_bytes``).
    Addresses name the path: ``"host:port"`` is direct TCP (a PeerRecord's ``addresses``),
    ``"p2p:<libp2p peer id>"`` is the fallback (a PeerRecord's ``libp2p_peer_id``), so
    ``request`` and everything built on it (broadcast, workers) take either.
    ``await dp.request_peer(record.addresses, record.libp2p_peer_id, message, ...)`` tries the
    direct addresses first and the fallback when they are unreachable, and remembers for
    ``PATH_MEMORY`` seconds which addresses were unreachable (tried last meanwhile). Errors are
    the same classes on both paths; a "busy" from the runtime's serving slots is a
    ``PeerRefused("busy")``. Answers sent over the fallback take their bytes from the same
    upload bucket, paid before the runtime writes them (so a ``Reply.after`` there runs with
    ``True`` once the answer is handed to the runtime, not once written). ``close`` makes the
    fallback handler answer "closed" (the runtime cannot unregister a handler); stop the
    runtime to remove it.

Errors (all ``DataPlaneError``): ``RequestTimeout``, ``PeerUnreachable``, ``PeerRefused``
(a signed Refusal: ``reason``, ``detail``), ``RemoteError`` (an ERROR frame), ``BadResponse``
(bad frame, envelope, signature, kind or signer; ``AnswerTooLarge`` when the answer exceeded
``max_response_bytes``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from swarmnode.core.limits import ExpiringMap
from swarmnode.errors import SwarmError
from swarmnode.net.errors import CallFailure, NetError, PeerCallError
from swarmnode.net.framing import (
    FramingError,
    MessageTooLarge,
    RemoteRefused,
    read_message,
    write_error,
    write_message,
)
from swarmnode.wire import limits
from swarmnode.wire.envelope import Envelope, Signer, decode_envelope, encode_envelope, seal, to_ms
from swarmnode.wire.kinds import Kind
from swarmnode.wire.messages import Message, Refusal, decode_payload
from swarmnode.wire.reasons import WireError

if TYPE_CHECKING:
    from swarmnode.net.hivemind_runtime import HivemindRuntime

log = logging.getLogger(__name__)

PACE_FRAME = 64 * 1024  # bytes per paced frame: small enough to interleave uploads fairly
DEFAULT_TIMEOUT = 30.0
IDLE_TIMEOUT = 60.0  # a server connection with no request this long is closed
POOL_IDLE = 30.0  # a pooled client connection unused this long is closed instead of reused
MAX_POOLED_PER_ADDRESS = 16
MAX_CONNECTIONS = 512
# Connection hoarding (issue 19: 520 connections sending a bare END every 20 s held every slot):
MAX_PER_ADDRESS = 64  # server connections from one remote IP address
MAX_PER_IDENTITY = 16  # server connections whose requests one signer sent
HANDSHAKE_TIMEOUT = 10.0  # a new connection must deliver one valid signed request this soon
MAX_BAD_REQUESTS = 3  # empty, undecodable or unsigned requests before a connection is closed
CONNECT_RETRY = 1  # a pooled connection that died while idle is replaced once
P2P_PREFIX = "p2p:"  # an address "p2p:<libp2p peer id>" goes over the hivemind fallback
FALLBACK_STREAM = "swarmnode.dataplane.v1"  # the fallback's hivemind stream handler name
FALLBACK_MAX_CONCURRENT = 64  # hivemind exchanges served at once (a quarter of them per peer)
FALLBACK_WRITE_SLACK = 60.0  # seconds a fallback exchange may take beyond handler_timeout
DIRECT_CONNECT_TIMEOUT = 5.0  # request_peer: a direct dial slower than this tries the next path
PATH_MEMORY = 60.0  # request_peer tries an address found unreachable last for this long
MAX_REMEMBERED_PATHS = 4096

# Where the request a handler is serving came from (``request_source``): set around each handler.
_REQUEST_SOURCE: contextvars.ContextVar[str] = contextvars.ContextVar("dataplane_request_source", default="")


def request_source() -> str:
    """Inside a handler: the remote IP address of the TCP connection its request came on, or
    ``"p2p:<libp2p id>"`` for one that came over the hivemind fallback; ``""`` elsewhere.

    A TCP peer cannot choose this address (the handshake proves it can receive there), unlike
    its identity, which costs nothing: so it is what a handler may ration by network."""
    return _REQUEST_SOURCE.get()


def _activity(conn: _ServerConn) -> float:
    return conn.last_valid_at if conn.last_valid_at is not None else conn.opened_at


def _loop_time(monotonic_deadline: float) -> float:
    """A ``time.monotonic()`` deadline on the running loop's clock (for ``asyncio.timeout_at``)."""
    return asyncio.get_running_loop().time() + (monotonic_deadline - time.monotonic())


class DataPlaneError(SwarmError):
    """A data-plane request failed; the subclass says how."""


class RequestTimeout(DataPlaneError):
    pass


class PeerUnreachable(DataPlaneError):
    pass


class RemoteError(DataPlaneError):
    """The peer answered with an ERROR frame (it could not read or handle the request)."""


class BadResponse(DataPlaneError):
    """The answer broke the framing, did not decode, was not signed, or came from the wrong peer."""


class AnswerTooLarge(BadResponse):
    """The answer exceeded the caller's ``max_response_bytes`` (refused before it was buffered)."""


class PeerRefused(DataPlaneError):
    """The peer answered with a signed Refusal."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"refused: {reason}" + (f" ({detail})" if detail else ""))
        self.reason = reason
        self.detail = detail


class RefuseRequest(Exception):
    """Raised by a handler to answer with a signed Refusal."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Reply:
    """A handler's answer with a callback run once it is written (``True``) or failed (``False``)."""

    answer: Message | Envelope | None
    after: Callable[[bool], None]


Answer: TypeAlias = Message | Envelope | Reply | None
# The message argument is typed Any so a handler may name the one message type it serves.
Handler: TypeAlias = Callable[[str, Envelope, Any], Awaitable[Answer]]


class UploadLimiter:
    """An asyncio token bucket: ``rate`` bytes/s, ``burst`` bytes banked, FIFO among waiters."""

    def __init__(self, rate: float, burst: float = PACE_FRAME * 2) -> None:
        if not rate > 0:
            raise ValueError(f"upload rate must be > 0, got {rate!r}")
        self.rate = rate
        self.burst = max(burst, PACE_FRAME)
        self._tokens = self.burst
        self._updated = time.monotonic()
        self._lock = asyncio.Lock()
        self.bytes_paced = 0

    async def take(self, amount: int) -> None:
        async with self._lock:
            while True:
                now = time.monotonic()
                self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.rate)
                self._updated = now
                if self._tokens >= amount:
                    self._tokens -= amount
                    self.bytes_paced += amount
                    return
                await asyncio.sleep((amount - self._tokens) / self.rate)


@dataclass(frozen=True)
class _Handled:
    """What ``_dispatch`` made of one request: the encoded answer, or the text of an ERROR answer."""

    out: bytes = b""
    error: str | None = None
    after: Callable[[bool], None] | None = None
    bad: bool = False  # the request itself was malformed (a strike against its connection)
    sender: str | None = None  # the verified signer, when the envelope verified
    refused: bool = False  # admission refused it before any handler ran (the connection closes)


@dataclass
class _ServerConn:
    """One inbound connection, as the admission rules see it."""

    address: str  # remote IP address
    writer: asyncio.StreamWriter
    opened_at: float
    last_valid_at: float | None = None  # when its last valid request was answered
    identity: str | None = None  # the signer of its first valid request
    busy: bool = False  # a request is being handled or answered: never evicted then
    bad_requests: int = 0


@dataclass
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    used_at: float


@dataclass
class DataPlaneStats:
    requests_served: int = 0
    requests_sent: int = 0
    bad_requests: int = 0
    handler_failures: int = 0
    refusals_sent: int = 0
    bytes_sent: int = 0
    connections_refused: int = 0  # inbound connections closed at once (no slot, even by eviction)
    connections_evicted: int = 0  # idle inbound connections closed to make room for a new one
    connections_timed_out: int = 0  # handshake deadline or idle timer expired
    connections_struck_out: int = 0  # closed after MAX_BAD_REQUESTS bad requests
    fallback_requests_sent: int = 0  # of requests_sent, those over hivemind ("p2p:" addresses)
    fallback_requests_served: int = 0  # requests that arrived over hivemind (also in requests_served)


class DataPlane:
    """Signed request/response over direct TCP; see the module docstring."""

    def __init__(
        self,
        identity: Signer,
        host: str = "127.0.0.1",
        port: int = 0,
        upload_rate: float | None = None,
        *,
        handler_timeout: float = 120.0,
        max_connections: int = MAX_CONNECTIONS,
        source_host: str | None = None,
    ) -> None:
        self.identity = identity
        self.host = host
        # The local address outgoing connections bind to (a multi-homed host picks its source
        # network this way); None lets the OS choose.
        self.source_host = source_host
        self.port = port
        self.limiter = UploadLimiter(upload_rate) if upload_rate else None
        self.handler_timeout = handler_timeout
        self.stats = DataPlaneStats()
        self._handlers: dict[Kind, Handler] = {}
        self._senders: dict[Kind, Callable[[str], bool]] = {}  # kind -> who may send it
        self._server: asyncio.Server | None = None
        self._pool: dict[str, list[_Conn]] = {}
        self._serving: set[asyncio.Task[None]] = set()
        self.max_connections = max_connections
        self.max_per_address = MAX_PER_ADDRESS
        self.max_per_identity = MAX_PER_IDENTITY
        self.handshake_timeout = HANDSHAKE_TIMEOUT
        self.idle_timeout = IDLE_TIMEOUT
        self._conns: dict[asyncio.Task[None], _ServerConn] = {}
        self._closed = False
        self._fallback: HivemindRuntime | None = None
        # Addresses request_peer found unreachable lately; tried last until they expire.
        self._unreachable: ExpiringMap[str, None] = ExpiringMap(MAX_REMEMBERED_PATHS)

    # ------------------------------------------------------------------ server

    def register(self, kind: Kind, handler: Handler, *, senders: Callable[[str], bool] | None = None) -> None:
        """Answer requests of ``kind`` with ``handler`` (one handler per kind).

        ``senders``: who may send this kind at all (the learner: its active workers). A request from
        anyone else is a bad request, refused on the sender id its envelope *claims*, before the
        signature is checked and the payload parsed: a stranger's 1 MiB batch then costs us a
        lookup, not a verification and a parse (measured: ~59 ms of CPU each). Refusing on a claim
        is safe: it grants nothing, and a forger claiming an allowed id still meets the signature."""
        if kind in self._handlers:
            raise ValueError(f"a handler for {kind.label} is already registered")
        self._handlers[kind] = handler
        if senders is not None:
            self._senders[kind] = senders

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port, limit=2**16)
        sock = self._server.sockets[0].getsockname()
        self.port = sock[1]

    @property
    def address(self) -> str:
        if self._server is None:
            raise DataPlaneError("data plane not started")
        return f"{self.host}:{self.port}"

    async def close(self) -> None:
        self._closed = True
        if self._server is not None:
            self._server.close()
        for task in list(self._serving):
            task.cancel()
        if self._serving:
            await asyncio.gather(*self._serving, return_exceptions=True)
        for conns in self._pool.values():
            for conn in conns:
                conn.writer.close()
        self._pool.clear()
        if self._server is not None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await self._server.wait_closed()

    async def _pace(self, n: int) -> None:
        self.stats.bytes_sent += n
        if self.limiter is not None:
            await self.limiter.take(n)

    async def _write(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        size = PACE_FRAME if self.limiter is not None else 256 * 1024
        await write_message(writer, data, chunk_size=size, pace=self._pace)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        peer = writer.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        if self._closed or not self._admit_connection(address):
            self.stats.connections_refused += 1
            writer.close()
            return
        conn = _ServerConn(address, writer, time.monotonic())
        self._conns[task] = conn
        self._serving.add(task)
        try:
            while not self._closed:
                # The deadline runs from the handshake or the last *valid* request: junk does
                # not reset it.
                if conn.last_valid_at is None:
                    deadline = conn.opened_at + self.handshake_timeout
                else:
                    deadline = conn.last_valid_at + self.idle_timeout
                try:
                    async with asyncio.timeout_at(_loop_time(deadline)):
                        data = await read_message(reader, limits.MAX_ENVELOPE_BYTES)
                except TimeoutError:
                    self.stats.connections_timed_out += 1
                    return
                except (FramingError, ConnectionError):
                    return  # closed, broken or evicted: nothing to answer
                except MessageTooLarge as e:
                    self.stats.bad_requests += 1
                    await write_error(writer, str(e))
                    return  # the rest of that message is still on the stream
                conn.busy = True
                try:
                    if not await self._answer(data, writer, conn):
                        return
                finally:
                    conn.busy = False
        except (ConnectionError, RemoteRefused) as e:
            log.debug("data-plane connection ended: %s", e)
        except asyncio.CancelledError:
            # Only close() cancels a connection task. Python 3.11's asyncio logs an ERROR with a
            # traceback for a cancelled client_connected_cb task, so end it quietly instead.
            if not self._closed:
                raise
        finally:
            self._conns.pop(task, None)
            self._serving.discard(task)
            writer.close()

    def _admit_connection(self, address: str) -> bool:
        """Room for one more inbound connection from ``address``: within the per-address cap
        and the global cap, evicting an idle connection (never one mid-request) when full.

        Victims, in order: connections still without a valid request, then those of the
        address (for the global cap) or identity holding the most connections, idlest first.
        So hoarded connections make room for a newcomer instead of locking it out.
        """
        same = [c for c in self._conns.values() if c.address == address]
        if len(same) >= self.max_per_address:
            same.sort(key=lambda c: (c.identity is not None, _activity(c)))
            if not self._evict(same):
                return False
        if len(self._conns) >= self.max_connections:
            per_address = Counter(c.address for c in self._conns.values())
            per_identity = Counter(c.identity for c in self._conns.values() if c.identity)
            ranked = sorted(
                self._conns.values(),
                key=lambda c: (
                    c.identity is not None,
                    -per_address[c.address],
                    -(per_identity[c.identity] if c.identity else 0),
                    _activity(c),
                ),
            )
            if not self._evict(ranked):
                return False
        return True

    def _evict(self, ranked: list[_ServerConn]) -> bool:
        """Close the first connection of ``ranked`` that is not mid-request; False if none."""
        for conn in ranked:
            if not conn.busy:
                self.stats.connections_evicted += 1
                for task, held in list(self._conns.items()):
                    if held is conn:
                        del self._conns[task]  # its slot is free now; the task ends on its own
                conn.writer.transport.abort()
                return True
        return False

    async def _answer(self, data: bytes, writer: asyncio.StreamWriter, conn: _ServerConn) -> bool:
        """Handle one request; False if the connection should close.

        A bad request (empty, undecodable, unsigned) is a strike against the connection and
        does not reset its idle timer; after MAX_BAD_REQUESTS strikes it is closed. The first
        valid request names the connection's identity; beyond MAX_PER_IDENTITY connections of
        one signer the new one closes that signer's idlest other connection, before its handler
        runs; only when all of them are mid-request is the new one refused and closed (so a
        refused request has no effect: no upload slot taken, no answer computed and dropped).
        """

        def admit(sender: str) -> str | None:
            if conn.identity is not None:
                return None
            held = [c for c in self._conns.values() if c.identity == sender and c is not conn]
            # At the cap, the newest connection of an identity wins: the idlest other one is closed
            # (never one mid-request). Refusing the newcomer instead let anyone who copied one of a
            # peer's signed envelopes (its public PeerRecord, say) lock that peer out by replaying it
            # as the first request of 16 connections (red team round 8, R8-2).
            if len(held) >= self.max_per_identity and not self._evict(sorted(held, key=_activity)):
                return f"busy: over {self.max_per_identity} connections from one peer, all mid-request"
            conn.identity = sender  # claimed before the handler runs: concurrent handshakes count
            return None

        handled = await self._dispatch(data, admit, source=conn.address)
        if handled.bad:
            conn.bad_requests += 1
            await write_error(writer, handled.error or "bad request")
            if conn.bad_requests >= MAX_BAD_REQUESTS:
                self.stats.connections_struck_out += 1
                return False
            return True
        if handled.refused:
            self.stats.connections_refused += 1
            await write_error(writer, handled.error or "busy")
            return False
        conn.last_valid_at = time.monotonic()
        if handled.error is not None:
            await write_error(writer, handled.error)
            return True
        ok = False
        try:
            await self._write(writer, handled.out)
            ok = True
        finally:
            if handled.after is not None:
                handled.after(ok)
        return True

    async def _dispatch(
        self, data: bytes, admit: Callable[[str], str | None] | None = None, *, source: str = ""
    ) -> _Handled:
        """One request's bytes -> the encoded answer, or the text of an ERROR answer.

        ``source`` is what ``request_source()`` tells the handler. ``admit(sender)``, called once
        the envelope verified and before the handler, may refuse the request (the text of the
        ERROR answer): then no handler runs.

        Shared by both transports, so a handler answers the same on TCP and on hivemind. Never
        raises for anything a peer sent or a handler did (only on cancellation).
        """
        if self._closed:
            return _Handled(error="closed: the data plane is shutting down")
        envelope = decode_envelope(data)
        problem: str | None = None
        message: Message | WireError | None = None
        if isinstance(envelope, WireError):
            problem = f"{envelope.reason.value}: {envelope.detail}"
        elif (allowed := self._senders.get(envelope.kind)) is not None and not allowed(envelope.sender_id):
            problem = f"not_allowed: {envelope.kind.label} is taken only from the peers this node chose"
        elif not envelope.verify():
            problem = "signature does not verify"
        else:
            message = decode_payload(envelope.kind, envelope.payload)
            if isinstance(message, WireError):
                problem = f"{message.reason.value}: {message.detail}"
        if problem is not None or isinstance(envelope, WireError) or isinstance(message, WireError):
            self.stats.bad_requests += 1
            log.debug("bad data-plane request: %s", problem)
            return _Handled(error=f"bad request: {problem}", bad=True)
        assert message is not None
        sender = envelope.sender_id
        if admit is not None:
            refusal = admit(sender)
            if refusal is not None:
                return _Handled(error=refusal, sender=sender, refused=True)
        handler = self._handlers.get(envelope.kind)
        after: Callable[[bool], None] | None = None
        answer: Message | Envelope | None
        try:
            if handler is None:
                raise RefuseRequest("unknown_kind", f"no handler for {envelope.kind.label}")
            token = _REQUEST_SOURCE.set(source)
            try:
                # wait_for runs the handler in a task that copies this context: it sees ``source``.
                result = await asyncio.wait_for(handler(sender, envelope, message), self.handler_timeout)
            finally:
                _REQUEST_SOURCE.reset(token)
            if isinstance(result, Reply):
                answer, after = result.answer, result.after
            else:
                answer = result
        except RefuseRequest as r:
            self.stats.refusals_sent += 1
            answer = Refusal(r.reason[: limits.MAX_REFUSAL_REASON_BYTES], r.detail[: limits.MAX_REASON_BYTES])
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a handler bug must not take the server down: log it, answer ERROR
            self.stats.handler_failures += 1
            log.exception("data-plane handler for %s from %s failed", envelope.kind.label, sender)
            return _Handled(error=f"handler failed: {type(e).__name__}", sender=sender)
        try:
            if answer is None:
                out = b""
            elif isinstance(answer, Envelope):
                out = encode_envelope(answer)
            else:
                out = encode_envelope(seal(self.identity, answer, to_ms(time.time())))
        except ValueError as e:  # over the envelope limit (or not sealable): a handler bug
            self.stats.handler_failures += 1
            log.error(
                "data-plane handler for %s from %s: unsendable answer: %s", envelope.kind.label, sender, e
            )
            if after is not None:
                after(False)
            return _Handled(error=f"handler failed: answer not sendable ({e})", sender=sender)
        self.stats.requests_served += 1
        return _Handled(out=out, after=after, sender=sender)

    # ------------------------------------------------------------------ hivemind fallback

    async def attach_fallback(
        self,
        runtime: HivemindRuntime,
        *,
        max_concurrent: int = FALLBACK_MAX_CONCURRENT,
    ) -> None:
        """Also serve and send requests over ``runtime``'s libp2p streams (a running runtime).

        Registers the stream handler ``FALLBACK_STREAM``: each stream carries one encoded
        signed Envelope each way, answered by the handlers of ``register`` exactly as on TCP.
        Afterwards ``request("p2p:<libp2p id>", ...)`` and ``request_peer`` use it, and
        ``fallback_address`` is this node's own. Once per data plane and runtime.
        """
        from swarmnode.net.hivemind_runtime import RequestRefused  # here: importing hivemind is heavy

        if self._fallback is not None:
            raise DataPlaneError("a hivemind fallback is already attached")

        async def serve(remote: str, request: bytes) -> bytes:
            # ``remote`` is the libp2p id of the stream; the sender that counts is the envelope's.
            handled = await self._dispatch(request, source=P2P_PREFIX + remote)
            if handled.error is not None:
                raise RequestRefused(handled.error)  # reaches the caller as an error answer
            self.stats.fallback_requests_served += 1
            try:
                # The runtime writes the answer itself, so the upload bucket is paid up front.
                await self._pace_all(len(handled.out))
            except BaseException:
                if handled.after is not None:
                    handled.after(False)
                raise
            if handled.after is not None:
                handled.after(True)  # handed to the runtime; it reports no write outcome
            return handled.out

        await runtime.add_stream_handler(
            FALLBACK_STREAM,
            serve,
            max_request_bytes=limits.MAX_ENVELOPE_BYTES,
            timeout=self.handler_timeout + FALLBACK_WRITE_SLACK,
            max_concurrent=max_concurrent,
        )
        self._fallback = runtime

    @property
    def fallback_address(self) -> str:
        """This node's address on the hivemind fallback: ``"p2p:<libp2p peer id>"``."""
        if self._fallback is None:
            raise DataPlaneError("no hivemind fallback attached")
        return P2P_PREFIX + self._fallback.peer_id

    async def _pace_all(self, n: int) -> None:
        """Take ``n`` bytes from the upload bucket in PACE_FRAME steps (FIFO with TCP uploads)."""
        if self.limiter is None:
            self.stats.bytes_sent += n
            return
        for offset in range(0, n, PACE_FRAME):
            await self._pace(min(PACE_FRAME, n - offset))

    # ------------------------------------------------------------------ client

    async def request(
        self,
        address: str,
        message: Message | None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        envelope: Envelope | None = None,
        expect_peer: str | None = None,
        max_response_bytes: int = limits.MAX_ENVELOPE_BYTES,
        connect_timeout: float | None = None,
    ) -> Message | None:
        """Send ``message`` (or the pre-signed ``envelope``) to ``address``; return the answer.

        ``address`` is ``"host:port"`` (direct TCP) or ``"p2p:<libp2p peer id>"`` (over the
        hivemind fallback, see ``attach_fallback``). The whole exchange (connect, send, answer)
        gets ``timeout`` seconds; ``connect_timeout`` (TCP only; default: the whole timeout)
        bounds opening the connection and raises ``PeerUnreachable`` when it expires, so a
        black-holed address fails fast enough to try another path. ``expect_peer``: the answer
        must be signed by that peer id. Returns ``None`` for an empty answer.
        """
        if envelope is None:
            if message is None:
                raise ValueError("request needs a message or an envelope")
            envelope = seal(self.identity, message, to_ms(time.time()))
        data = encode_envelope(envelope)
        self.stats.requests_sent += 1
        try:
            async with asyncio.timeout(timeout):
                if address.startswith(P2P_PREFIX):
                    self.stats.fallback_requests_sent += 1
                    raw = await self._exchange_p2p(address, data, timeout, max_response_bytes)
                else:
                    raw = await self._exchange(address, data, max_response_bytes, connect_timeout)
        except TimeoutError as e:
            raise RequestTimeout(f"{address}: no answer within {timeout:g} s") from e
        if not raw:
            return None
        answer = decode_envelope(raw)
        if isinstance(answer, WireError):
            raise BadResponse(f"{address}: {answer.reason.value}: {answer.detail}")
        if not answer.verify():
            raise BadResponse(f"{address}: answer signature does not verify")
        if expect_peer is not None and answer.sender_id != expect_peer:
            raise BadResponse(f"{address}: answered by {answer.sender_id}, expected {expect_peer}")
        reply = decode_payload(answer.kind, answer.payload)
        if isinstance(reply, WireError):
            raise BadResponse(f"{address}: {reply.reason.value}: {reply.detail}")
        if isinstance(reply, Refusal):
            raise PeerRefused(reply.reason, reply.detail)
        return reply

    async def request_peer(
        self,
        addresses: Sequence[str],
        libp2p_id: str | None,
        message: Message | None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        envelope: Envelope | None = None,
        expect_peer: str | None = None,
        max_response_bytes: int = limits.MAX_ENVELOPE_BYTES,
        connect_timeout: float = DIRECT_CONNECT_TIMEOUT,
    ) -> Message | None:
        """``request`` to one peer by any path it has: its direct ``addresses`` (a PeerRecord's
        ``"host:port"`` entries) first, then ``"p2p:<libp2p_id>"`` over the hivemind fallback.

        A path is abandoned for the next only on ``PeerUnreachable`` (refused, reset, no route,
        no TCP connection within ``connect_timeout``); a timeout, refusal or error answer is the
        peer's answer and is raised as is. An unreachable address is remembered for
        ``PATH_MEMORY`` seconds and tried last meanwhile, so a peer behind NAT costs one failed
        dial per period, not per request, and a peer's new address is tried at once. ``timeout``
        bounds the whole call, every path included. The same signed envelope is sent on every
        path, so a handler may see a request twice when a direct connection broke after sending
        (as with any retry): keep requests idempotent.
        """
        if envelope is None:
            if message is None:
                raise ValueError("request needs a message or an envelope")
            envelope = seal(self.identity, message, to_ms(time.time()))
        routes = self.routes(addresses, libp2p_id)
        if not routes:
            raise PeerUnreachable("the peer has no address (no host:port, no libp2p id)")
        key = libp2p_id or ",".join(addresses)  # names the peer in errors
        deadline = time.monotonic() + timeout
        failure: PeerUnreachable | None = None
        for route in routes:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RequestTimeout(f"{key}: no answer within {timeout:g} s") from failure
            try:
                reply = await self.request(
                    route,
                    None,
                    envelope=envelope,
                    timeout=left,
                    expect_peer=expect_peer,
                    max_response_bytes=max_response_bytes,
                    connect_timeout=min(connect_timeout, left),
                )
            except PeerUnreachable as e:
                if route not in self._unreachable:  # not refreshed: retried after PATH_MEMORY
                    self._unreachable.put(route, None, time.monotonic() + PATH_MEMORY)
                log.debug("data-plane path %s to %s unreachable: %s", route, key, e)
                failure = e
                continue
            self._unreachable.pop(route)
            return reply
        assert failure is not None
        raise failure

    def routes(self, addresses: Sequence[str], libp2p_id: str | None) -> list[str]:
        """The addresses ``request_peer`` tries, in order: the direct addresses, then the
        hivemind fallback (only when one is attached); an address found unreachable in the
        last ``PATH_MEMORY`` seconds goes after all the others (a last resort)."""
        self._unreachable.pop_expired(time.monotonic())
        routes = [a for a in addresses if a]
        if libp2p_id and self._fallback is not None:
            routes.append(P2P_PREFIX + libp2p_id)
        routes = list(dict.fromkeys(routes))
        return [r for r in routes if r not in self._unreachable] + [
            r for r in routes if r in self._unreachable
        ]

    async def _exchange(
        self, address: str, data: bytes, max_response_bytes: int, connect_timeout: float | None = None
    ) -> bytes:
        for attempt in range(CONNECT_RETRY + 1):
            conn, pooled = await self._checkout(address, connect_timeout)
            try:
                await self._write(conn.writer, data)
                raw = await read_message(conn.reader, max_response_bytes)
            except RemoteRefused as e:
                self._checkin(address, conn)  # an ERROR frame is a complete answer
                raise RemoteError(f"{address}: {e}") from e
            except MessageTooLarge as e:
                conn.writer.close()
                raise AnswerTooLarge(f"{address}: {e}") from e
            except (FramingError, ConnectionError) as e:
                conn.writer.close()
                if pooled and attempt < CONNECT_RETRY:
                    continue  # the peer closed an idle pooled connection: try a fresh one
                if isinstance(e, FramingError):
                    raise BadResponse(f"{address}: {e}") from e
                raise PeerUnreachable(f"{address}: {e}") from e
            except BaseException:
                conn.writer.close()  # timeout or cancel mid-exchange: the stream state is unknown
                raise
            self._checkin(address, conn)
            return raw
        raise AssertionError("unreachable")

    async def _checkout(self, address: str, connect_timeout: float | None = None) -> tuple[_Conn, bool]:
        now = time.monotonic()
        conns = self._pool.get(address, [])
        while conns:
            conn = conns.pop()
            if now - conn.used_at < POOL_IDLE and not conn.writer.is_closing():
                return conn, True
            conn.writer.close()
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise PeerUnreachable(f"bad address {address!r}: expected host:port")
        try:
            async with asyncio.timeout(connect_timeout):
                local = (self.source_host, 0) if self.source_host else None
                reader, writer = await asyncio.open_connection(
                    host.strip("[]"), int(port), limit=2**16, local_addr=local
                )
        except OSError as e:
            raise PeerUnreachable(f"{address}: {e}") from e
        except TimeoutError as e:
            if connect_timeout is None:
                raise  # the request's own timeout
            raise PeerUnreachable(f"{address}: no connection within {connect_timeout:g} s") from e
        return _Conn(reader, writer, now), False

    async def _exchange_p2p(
        self, address: str, data: bytes, timeout: float, max_response_bytes: int
    ) -> bytes:
        """One exchange over the hivemind fallback; PeerCallError reasons -> DataPlaneError classes."""
        runtime = self._fallback
        if runtime is None:
            raise PeerUnreachable(f"{address}: no hivemind fallback attached (DataPlane.attach_fallback)")
        peer = address[len(P2P_PREFIX) :]
        await self._pace_all(len(data))
        try:
            return await runtime.call_stream(
                peer, FALLBACK_STREAM, data, timeout=timeout, max_response_bytes=max_response_bytes
            )
        except PeerCallError as e:
            detail = f"{address}: {e.detail}"
            if e.reason is CallFailure.TIMEOUT:
                raise RequestTimeout(detail) from e
            if e.reason is CallFailure.UNREACHABLE:
                raise PeerUnreachable(detail) from e
            if e.reason is CallFailure.TOO_LARGE and e.detail.startswith("response"):
                raise AnswerTooLarge(detail) from e
            if e.reason in (CallFailure.PROTOCOL, CallFailure.CLOSED):  # as a FramingError on TCP
                raise BadResponse(detail) from e
            if e.detail.startswith("busy:"):  # the runtime's serving slots are full: like a refusal
                raise PeerRefused("busy", e.detail) from e
            raise RemoteError(detail) from e  # refused by the runtime or our handler, or too large
        except NetError as e:  # our runtime stopped: this path is gone, another may work
            raise PeerUnreachable(f"{address}: {e}") from e

    def _checkin(self, address: str, conn: _Conn) -> None:
        conns = self._pool.setdefault(address, [])
        if self._closed or len(conns) >= MAX_POOLED_PER_ADDRESS:
            conn.writer.close()
            return
        conn.used_at = time.monotonic()
        conns.append(conn)
