"""hivemind P2P (p2pd) and DHTNode running inside the caller's asyncio loop.

Owns: starting and stopping p2pd and the DHT node, the libp2p identity in use,
owned DHT records (store/get), request/response calls over libp2p
streams, and a timeout on every one of them.
Must not: know what the bytes mean (gossip, broadcast and admission do), keep
per-peer scores, retry on its own, or block the event loop.

Why not ``hivemind.DHT``: it runs the DHT in a forked process behind a pipe,
and a request over ~64 KiB crashes it (DESIGN.md; hivemind PR #660). Here the
DHT node shares the node's loop, so there is no pipe and no second process.

Processes: exactly one p2pd per runtime (plus, at start with an existing
identity and initial peers, one short-lived p2pd for hivemind's "identity
already taken" check). ``swarmnode.net.child_guard`` makes each die with this
process even on SIGKILL; ``stop()`` ends it in order, with a deadline and a
SIGKILL fallback.

Calls and their limits:

* ``call_stream``: one request and one response, each framed in chunks of at
  most 256 KiB (``swarmnode.net.framing``); the serving side caps the request,
  the calling side caps the response, both before buffering.
* Every call and DHT operation takes a ``timeout`` (seconds) and raises
  ``PeerCallError`` / ``DhtTimeout`` when it expires.

Handlers get ``(remote peer id, request bytes)`` and return response bytes.
To refuse a request, raise ``RequestRefused(reason)``: the caller receives the
reason. Any other exception is logged here with its traceback and the caller
receives "failed".
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from hivemind.dht.node import DHTNode
from hivemind.dht.protocol import ValidationError
from hivemind.dht.validation import CompositeValidator, RecordValidatorBase
from hivemind.p2p import P2P, PeerID
from hivemind.p2p.p2p_daemon_bindings.datastructures import StreamInfo
from hivemind.p2p.p2p_daemon_bindings.utils import P2PDaemonError
from hivemind.utils.multiaddr import Multiaddr
from hivemind.utils.timed_storage import get_dht_time

from swarmnode.errors import ConfigError
from swarmnode.net.child_guard import install_p2pd_death_signal, track_p2pd_spawns
from swarmnode.net.config import NetConfig
from swarmnode.net.dht_answers import AnswerStats
from swarmnode.net.dht_answers import install as install_bounded_find
from swarmnode.net.errors import CallFailure, NetError, PeerCallError
from swarmnode.net.framing import (
    MAX_CHUNK,
    FramingError,
    MessageTooLarge,
    ReadProgress,
    RemoteRefused,
    StreamEnded,
    read_message,
    write_error,
    write_message,
)
from swarmnode.net.identity_lock import IdentityLock
from swarmnode.net.libp2p_identity import Libp2pIdentity, load_or_create_identity
from swarmnode.net.record_rules import (
    CACHE_SHARE,
    BoundedDHTStorage,
    RecordRulesValidator,
    adopt,
    refusal,
)
from swarmnode.net.records import (
    DhtRecord,
    OwnerSignatureValidator,
    check_storable,
    make_record_validators,
    records_from_dictionary,
)

logger = logging.getLogger(__name__)

Handler = Callable[[str, bytes], Awaitable[bytes]]
"""A request handler: ``(remote libp2p peer id, request) -> response``."""

DEFAULT_STREAM_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_SERVE_TIMEOUT = 60.0
DEFAULT_MAX_CONCURRENT = 16
# A slow-loris peer (streams opened and fed a byte at a time) held every serving slot for the
# whole exchange timeout and stopped gossip for everyone (tests/fault/test_adversarial.py,
# bench/adversarial.py). So one remote peer may hold at most a quarter of the slots, and the
# request must arrive at REQUEST_MIN_RATE or better (after REQUEST_GRACE seconds of slack).
REQUEST_GRACE = 5.0
REQUEST_MIN_RATE = 1024 * 1024  # bytes/s
REFUSAL_LINGER = 2.0
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_STREAM_PREFIX = "swarmnode.stream."
# Error codes that start the text of an ERROR frame, so the caller
# can tell "my request was too big" from other refusals.
_TOO_LARGE = "too_large"
_REFUSED = "refused"
_BUSY = "busy"
_FAILED = "failed"
_TIMEOUT = "timeout"


class RequestRefused(Exception):
    """Raised by a handler to refuse a request; ``str(e)`` is sent to the caller."""


class DhtTimeout(NetError):
    """A DHT store or get did not finish within its timeout."""


class HivemindRuntime:
    """One node's libp2p host and DHT node, in the event loop that calls ``start``.

    Use from one event loop only. ``start`` then ``stop`` (or ``async with
    await HivemindRuntime.create(config)``); a stopped runtime cannot restart.
    """

    def __init__(self) -> None:
        self._config: NetConfig | None = None
        self._p2p: P2P | None = None
        self._dht: DHTNode | None = None
        self._identity: Libp2pIdentity | None = None
        self._lock: IdentityLock | None = None
        self._children: list[asyncio.subprocess.Process] = []
        self._socket_dir: Path | None = None
        self._temp_identity_dir: Path | None = None
        self._owner_marker = b""
        self._visible_maddrs: list[str] = []
        self._initial_peers: list[str] = []
        self._rejoin_task: asyncio.Task[None] | None = None
        self._handler_names: set[tuple[str, str]] = set()
        self._serving: set[asyncio.Task[Any]] = set()  # requests being served, cancelled on stop
        self._started_at: float | None = None
        self._rules_validator: RecordRulesValidator | None = None
        self._answer_stats: AnswerStats | None = None
        self.streams_evicted = 0  # stream exchanges cut while reading, to make room (add_stream_handler)
        self._state = "new"  # new -> starting -> running -> stopped
        self.death_signal_active = False  # p2pd dies with this process even on SIGKILL (Linux)

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    async def create(cls, config: NetConfig) -> HivemindRuntime:
        """A started runtime (see ``start``)."""
        runtime = cls()
        await runtime.start(config)
        return runtime

    async def start(self, config: NetConfig) -> None:
        """Start p2pd and the DHT node and join the swarm through the initial peers.

        Raises ConfigError for bad settings, IdentityError for an unusable identity
        file, NetError when p2pd cannot start, the identity is in use, or (with
        ``ensure_bootstrap_success``) no initial peer answers. On any failure
        everything started so far is stopped again.
        """
        if self._state != "new":
            raise NetError(f"runtime already {self._state}; create a new HivemindRuntime")
        self._state = "starting"
        config.check()
        self._config = config
        self._initial_peers = config.all_initial_peers()
        t0 = time.perf_counter()
        try:
            await self._start(config)
        except BaseException:
            await self._teardown(config.shutdown_timeout)
            self._state = "stopped"
            raise
        self._state = "running"
        self._started_at = time.time()
        logger.info(
            "hivemind runtime up in %.2f s: peer id %s, addresses %s",
            time.perf_counter() - t0,
            self.peer_id,
            " ".join(self._visible_maddrs),
        )

    async def _start(self, config: NetConfig) -> None:
        self.death_signal_active = install_p2pd_death_signal()
        if not self.death_signal_active:
            logger.warning("no parent-death signal on this OS: a SIGKILLed node leaves p2pd running")
        if config.identity_path is None:
            self._temp_identity_dir = Path(tempfile.mkdtemp(prefix="swarmnode-id-"))
            identity_path = self._temp_identity_dir / "libp2p.key"
        else:
            identity_path = config.identity_path
        self._lock = IdentityLock(identity_path)
        self._lock.acquire()
        self._identity = await asyncio.to_thread(load_or_create_identity, identity_path)
        self._socket_dir = _prepare_socket_dir(identity_path, ephemeral=config.identity_path is None)
        # A subclass only to put p2pd's control sockets in our own directory: stale
        # sockets of a SIGKILLed run are then ours to clean, not litter in /tmp.
        p2p_class: type[P2P] = type(
            "SwarmnodeP2P", (P2P,), {"_UNIX_SOCKET_PREFIX": f"/unix{self._socket_dir}/p2p-"}
        )

        # With ensure_bootstrap_success, p2pd and the DHT bootstrap from the initial peers and
        # fail if none answers. Without it (bootstraps that link to each other, started in any
        # order), p2pd starts alone (it would exit if no bootstrap peer answered) and the
        # initial peers are dialled afterwards and again whenever the routing table is empty.
        boot_peers = self._initial_peers if config.ensure_bootstrap_success else []
        try:
            async with asyncio.timeout(2 * config.startup_timeout):  # identity check + daemon start
                with track_p2pd_spawns() as spawned:
                    self._children = spawned
                    self._p2p = await p2p_class.create(
                        initial_peers=boot_peers or None,
                        host_maddrs=list(config.host_maddrs),
                        announce_maddrs=list(config.announce_maddrs) or None,
                        identity_path=str(identity_path),
                        dht_mode="client" if config.client_mode else "server",
                        use_relay=config.use_relay,
                        use_auto_relay=config.use_auto_relay,
                        startup_timeout=config.startup_timeout,
                        # A key created just now cannot be in use elsewhere: skip the extra p2pd.
                        check_if_identity_free=config.check_identity_free and not self._identity.created,
                    )
        except TimeoutError as e:
            raise NetError(f"p2pd did not start within {2 * config.startup_timeout:.0f} s") from e
        except P2PDaemonError as e:
            if "already taken" in str(e):
                raise NetError(
                    f"libp2p identity {identity_path} (peer id {self._identity.peer_id}) is already in use "
                    "by a live peer in the swarm; another node runs with a copy of this home"
                ) from e
            if "failed to connect to bootstrap peers" in str(e):
                raise _no_initial_peer(self._initial_peers, e) from e
            raise NetError(f"p2pd failed to start: {e}") from e

        signing = OwnerSignatureValidator(self._identity.record_signing_key())
        self._owner_marker = signing.local_public_key
        validators: list[RecordValidatorBase] = make_record_validators(signing, config.max_record_bytes)
        self._rules_validator = RecordRulesValidator(config.record_rules)
        validators.append(self._rules_validator)
        validators += list(config.extra_validators)
        try:
            async with asyncio.timeout(config.startup_timeout):
                self._dht = await DHTNode.create(
                    p2p=self._p2p,
                    initial_peers=boot_peers or None,
                    client_mode=config.client_mode,
                    record_validator=CompositeValidator(validators),
                    wait_timeout=config.dht_rpc_timeout,
                    ensure_bootstrap_success=config.ensure_bootstrap_success,
                )
        except TimeoutError as e:
            raise NetError(f"joining the DHT did not finish within {config.startup_timeout:.0f} s") from e
        except RuntimeError as e:  # hivemind: "DHTNode bootstrap failed: none of the initial_peers responded"
            raise _no_initial_peer(self._initial_peers, e) from e
        except ValidationError as e:  # clock skew over 3 s, or the peer cannot dial us back
            raise NetError(f"an initial peer refused this node: {e}") from e
        # hivemind's storage and cache have no size cap and no per-owner rules: replace both
        # (keeping what peers stored during the bootstrap), see swarmnode.net.record_rules.
        protocol = self._dht.protocol
        protocol.storage = adopt(protocol.storage, config.record_rules)
        protocol.cache = adopt(protocol.cache, config.record_rules.scaled(CACHE_SHARE))
        # ... nor a bound on what one find request makes it send: see swarmnode.net.dht_answers.
        self._answer_stats = await install_bounded_find(protocol)
        self._visible_maddrs = await self._read_visible_maddrs()
        if self._initial_peers and not boot_peers:
            await self._dial_initial_peers()
        if self._initial_peers:
            self._rejoin_task = asyncio.create_task(self._rejoin_loop(), name="swarmnode-dht-rejoin")
            self._rejoin_task.add_done_callback(_log_crash)

    async def stop(self) -> None:
        """Stop the DHT node and p2pd (SIGKILL after ``shutdown_timeout``); idempotent."""
        if self._state in ("new", "stopped"):
            self._state = "stopped"
            return
        timeout = self._config.shutdown_timeout if self._config else 10.0
        self._state = "stopped"
        await self._teardown(timeout)

    async def _teardown(self, timeout: float) -> None:
        if self._rejoin_task is not None:
            self._rejoin_task.cancel()
            await asyncio.wait([self._rejoin_task])  # a crash was already logged by _log_crash
        # hivemind does not cancel handlers still serving when it closes: we do, so no
        # handler outlives the runtime (and none is left pending when the loop closes).
        serving = [task for task in self._serving if task is not asyncio.current_task()]
        for task in serving:
            task.cancel()
        if serving:
            await asyncio.wait(serving, timeout=timeout / 2)
        if self._dht is not None:
            try:
                async with asyncio.timeout(timeout / 2):
                    await self._dht.shutdown()  # DHT protocol only: the P2P is ours to stop
            except TimeoutError:
                logger.warning("DHT node did not shut down within %.1f s", timeout / 2)
        if self._p2p is not None:
            try:
                async with asyncio.timeout(timeout / 2):
                    await self._p2p.shutdown()  # SIGTERM, then waits for p2pd to exit
            except TimeoutError:
                logger.warning("p2pd did not exit within %.1f s of SIGTERM; killing it", timeout / 2)
        for child in self._children:
            if child.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    child.send_signal(signal.SIGKILL)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(5):
                        await child.wait()
        if self._lock is not None:
            self._lock.release()
        if self._socket_dir is not None:
            _clean_socket_dir(self._socket_dir, remove=True)
        if self._temp_identity_dir is not None:
            shutil.rmtree(self._temp_identity_dir, ignore_errors=True)

    async def __aenter__(self) -> HivemindRuntime:
        if self._state != "running":
            raise NetError("enter a started runtime: async with await HivemindRuntime.create(config)")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # ------------------------------------------------------------------ identity and addresses

    @property
    def peer_id(self) -> str:
        """This node's libp2p peer id (base58)."""
        return self._require_identity().peer_id

    @property
    def visible_maddrs(self) -> list[str]:
        """Full multiaddrs others can dial, each ending in /p2p/<peer id> (announce_maddrs if set)."""
        self._require_running()
        return list(self._visible_maddrs)

    @property
    def owner_marker(self) -> bytes:
        """The ``[owner:...]`` prefix of every subkey this node stores (see ``records``)."""
        self._require_running()
        return self._owner_marker

    @property
    def p2pd_pid(self) -> int | None:
        """Process id of this runtime's p2pd (for supervision and tests)."""
        p2p = self._p2p
        child = getattr(p2p, "_child", None) if p2p is not None else None
        return child.pid if child is not None else None

    @property
    def uptime(self) -> float:
        """Seconds since the runtime came up (0 before)."""
        return time.time() - self._started_at if self._started_at is not None else 0.0

    @property
    def is_running(self) -> bool:
        return self._state == "running"

    async def refresh_visible_maddrs(self, timeout: float) -> list[str]:
        """Ask p2pd again for its addresses (they can change once NAT or relays are detected)."""
        self._require_running()
        async with asyncio.timeout(timeout):
            self._visible_maddrs = await self._read_visible_maddrs(latest=True)
        return list(self._visible_maddrs)

    async def _read_visible_maddrs(self, latest: bool = False) -> list[str]:
        assert self._p2p is not None
        maddrs = [str(m) for m in await self._p2p.get_visible_maddrs(latest=latest)]
        return maddrs

    def dht_peer_count(self) -> int:
        """Peers in the DHT routing table (including replacement candidates)."""
        dht = self._require_dht()
        return len(dht.protocol.routing_table.uid_to_peer_id)

    def dht_peer_ids(self) -> list[str]:
        """libp2p peer ids of the peers in the DHT routing table."""
        dht = self._require_dht()
        return sorted(p.to_base58() for p in dht.protocol.routing_table.uid_to_peer_id.values())

    async def connected_peers(self, timeout: float) -> list[str]:
        """Peer ids p2pd currently holds a connection to."""
        p2p = self._require_p2p()
        async with asyncio.timeout(timeout):
            infos = await p2p.list_peers()
        return sorted(info.peer_id.to_base58() for info in infos)

    # ------------------------------------------------------------------ DHT

    def dht_storage_stats(self) -> dict[str, Any]:
        """What this node's DHT storage and cache hold, and what their rules refused or evicted."""
        dht = self._require_dht()
        out: dict[str, Any] = {}
        if self._rules_validator is not None:
            out["validator_refused"] = dict(self._rules_validator.refused)
        if self._answer_stats is not None:
            out["answers"] = self._answer_stats.as_dict()
        for name in ("storage", "cache"):
            store = getattr(dht.protocol, name)
            if isinstance(store, BoundedDHTStorage):
                out[name] = {
                    "records": store.total_records,
                    "bytes": store.total_bytes,
                    "owners": store.owners(),
                    "max_records": store.rules.max_total_records,
                    "max_bytes": store.rules.max_total_bytes,
                    "evicted": store.evicted,
                    "refused": dict(store.refused),
                }
        return out

    @staticmethod
    def dht_time() -> float:
        """The DHT's clock (seconds since the epoch); expiration times are on this clock."""
        return float(get_dht_time())

    async def dht_store(
        self,
        key: str,
        subkey: bytes,
        value: bytes,
        expiration_time: float,
        *,
        timeout: float,
        await_all_replicas: bool = True,
    ) -> bool:
        """Store ``value`` under ``key`` as this node's record ``subkey`` until ``expiration_time``.

        The stored subkey is ``owner_marker + subkey`` and the value is signed, so
        no other peer can overwrite it. Returns False when the DHT refused the
        record (a newer one exists, or no peer accepted it). With
        ``await_all_replicas=False`` it returns after the first replica accepted
        and the others finish in the background (bounded by ``dht_rpc_timeout``).
        Raises ValueError for a value over ``max_record_bytes`` or containing
        ``[signature:``/``[owner:``, or an expiration or subkey the record rules refuse
        (``record_rules``: every peer would refuse it); DhtTimeout after ``timeout`` seconds.
        """
        dht = self._require_dht()
        assert self._config is not None
        check_storable(subkey, value, self._config.max_record_bytes)
        problem = refusal(
            self._config.record_rules, self._owner_marker + subkey, expiration_time, self.dht_time()
        )
        if problem is not None:
            kind = self._config.record_rules.kind_of(subkey)
            raise ValueError(
                f"DHT record {key!r}/{subkey[:32]!r} refused ({problem}): a {kind.name} record may expire "
                f"at most {kind.max_lifetime:g} s from now, with a subkey of at most "
                f"{self._config.record_rules.max_subkey_bytes} bytes"
            )
        try:
            async with asyncio.timeout(timeout):
                stored = await dht.store(
                    key,
                    value,
                    expiration_time,
                    subkey=self._owner_marker + subkey,
                    await_all_replicas=await_all_replicas,
                )
        except TimeoutError as e:
            raise DhtTimeout(f"DHT store of {key!r} did not finish within {timeout} s") from e
        return bool(stored)

    async def dht_get(self, key: str, *, timeout: float, latest: bool = True) -> list[DhtRecord]:
        """All live owned records under ``key``, sorted by (owner, subkey); [] if none.

        ``latest=True`` (default) asks the whole search beam and merges the subkeys
        every replica holds: the complete set. ``latest=False`` stops at the first
        peer that has the key (possibly this node's own partial copy): faster, but
        it can miss other peers' subkeys. Raises DhtTimeout after ``timeout`` seconds.
        """
        dht = self._require_dht()
        try:
            async with asyncio.timeout(timeout):
                found = await dht.get(key, latest=latest)
        except TimeoutError as e:
            raise DhtTimeout(f"DHT get of {key!r} did not finish within {timeout} s") from e
        if found is None or not isinstance(found.value, dict):
            return []
        return records_from_dictionary({sk: (v.value, v.expiration_time) for sk, v in found.value.items()})

    # ------------------------------------------------------------------ streams (bulk)

    async def add_stream_handler(
        self,
        name: str,
        handler: Handler,
        *,
        max_request_bytes: int,
        timeout: float = DEFAULT_SERVE_TIMEOUT,
        max_concurrent: int = DEFAULT_MAX_CONCURRENT,
    ) -> None:
        """Serve ``name``: read one request (<= ``max_request_bytes``), answer with ``handler``'s bytes.

        One exchange (read request, handle, write response) gets ``timeout``
        seconds, and the request alone ``REQUEST_GRACE + max_request_bytes /
        REQUEST_MIN_RATE``; beyond ``max_concurrent`` exchanges at once, or a
        quarter of them from one remote peer, new callers are told "busy" at
        once instead of queueing. When every slot is taken, a newcomer first evicts the oldest
        exchange still *reading its request* from the peer holding the most slots, if that peer
        holds at least two more than the newcomer (issue 19: four identities trickling requests
        held all 64 fallback slots); exchanges being handled or answered are never evicted.
        """
        p2p = self._require_p2p()
        _check_name(name)
        if (_STREAM_PREFIX, name) in self._handler_names:
            raise NetError(f"a stream handler named {name!r} is already registered")
        slots = asyncio.Semaphore(max_concurrent)
        per_peer_limit = max(1, max_concurrent // 4)
        per_peer: dict[str, int] = {}
        read_timeout = min(timeout, REQUEST_GRACE + max_request_bytes / REQUEST_MIN_RATE)
        reading: dict[asyncio.Task[Any], tuple[str, float]] = {}  # exchanges still reading

        async def make_room(remote: str) -> None:
            if not slots.locked():
                return
            mine = per_peer.get(remote, 0)
            candidates = [
                (-per_peer.get(peer, 0), started, task)
                for task, (peer, started) in reading.items()
                if peer != remote and per_peer.get(peer, 0) >= mine + 2
            ]
            if not candidates:
                return
            victim = min(candidates, key=lambda c: (c[0], c[1]))[2]
            reading.pop(victim, None)
            self.streams_evicted += 1
            victim.cancel()
            await asyncio.wait([victim], timeout=1.0)

        async def serve(
            stream_info: StreamInfo, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
        ) -> None:
            remote = stream_info.peer_id.to_base58()
            self._track_serving()
            task = asyncio.current_task()
            try:
                if per_peer.get(remote, 0) < per_peer_limit:
                    await make_room(remote)
                if slots.locked() or per_peer.get(remote, 0) >= per_peer_limit:
                    await write_error(writer, f"{_BUSY}: too many requests in progress")
                    await _linger(reader)
                    return
                per_peer[remote] = per_peer.get(remote, 0) + 1
                if task is not None:
                    reading[task] = (remote, time.monotonic())
                try:
                    async with slots, asyncio.timeout(timeout):
                        await self._serve_one(
                            name,
                            handler,
                            remote,
                            reader,
                            writer,
                            max_request_bytes,
                            read_timeout,
                            read_done=lambda: reading.pop(task, None) if task is not None else None,
                        )
                finally:
                    if task is not None:
                        reading.pop(task, None)
                    per_peer[remote] -= 1
                    if not per_peer[remote]:
                        del per_peer[remote]
            except TimeoutError:
                logger.debug("stream %s from %s: not done within %.1f s", name, remote, timeout)
                with contextlib.suppress(OSError, TimeoutError):
                    async with asyncio.timeout(1):
                        await write_error(writer, f"{_TIMEOUT}: exchange took over {timeout} s")
                await _linger(reader)
            except OSError as e:  # the caller went away mid-exchange
                logger.debug("stream %s from %s: connection lost: %s", name, remote, e)
            finally:
                writer.close()
                self._untrack_serving()

        await p2p.add_binary_stream_handler(_STREAM_PREFIX + name, serve)
        self._handler_names.add((_STREAM_PREFIX, name))

    async def _serve_one(
        self,
        name: str,
        handler: Handler,
        remote: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        max_request_bytes: int,
        read_timeout: float,
        read_done: Callable[[], object] | None = None,
    ) -> None:
        try:
            async with asyncio.timeout(read_timeout):  # expiry: the caller's TimeoutError path
                request = await read_message(reader, max_request_bytes)
            if read_done is not None:
                read_done()
        except MessageTooLarge as e:
            await write_error(writer, f"{_TOO_LARGE}: requests to {name} are limited to {e.limit} bytes")
            await _linger(reader)
            return
        except (FramingError, RemoteRefused) as e:
            logger.debug("stream %s from %s: bad request framing: %s", name, remote, e)
            return
        try:
            response = await handler(remote, request)
        except RequestRefused as e:
            await write_error(writer, f"{_REFUSED}: {e}")
            return
        except Exception:  # a bug in our handler: log it here, never show the peer our traceback
            logger.exception("stream handler %s failed on a request from %s", name, remote)
            await write_error(writer, f"{_FAILED}: handler failed")
            return
        await write_message(writer, response)

    async def call_stream(
        self,
        peer_id: str,
        name: str,
        request: bytes,
        *,
        timeout: float,
        max_response_bytes: int = DEFAULT_STREAM_MAX_BYTES,
        progress: ReadProgress | None = None,
    ) -> bytes:
        """Send ``request`` to ``peer_id``'s handler ``name`` over a new stream; return its response.

        ``progress``, when given, counts the answer's bytes as they arrive: a caller that cancels
        the call still learns what it cost.

        Raises PeerCallError: TIMEOUT after ``timeout`` seconds for the whole
        exchange, UNREACHABLE if no stream opens, TOO_LARGE if either side's
        limit is exceeded, REMOTE_ERROR if the handler refused or failed,
        PROTOCOL if the peer broke the framing, CLOSED if the stream ended
        inside the answer (the peer or the network closed it).
        """
        p2p = self._require_p2p()
        _check_name(name)
        target = _peer(peer_id, name)
        writer: asyncio.StreamWriter | None = None
        sending: asyncio.Task[None] | None = None
        progress = ReadProgress() if progress is None else progress
        try:
            async with asyncio.timeout(timeout):
                try:
                    _, reader, writer = await p2p.call_binary_stream_handler(target, _STREAM_PREFIX + name)
                except (P2PDaemonError, OSError) as e:
                    raise PeerCallError(CallFailure.UNREACHABLE, peer_id, name, str(e)) from e
                # Send and receive at once: a peer that refuses early (too large) answers while we still send.
                sending = asyncio.create_task(write_message(writer, request))

                # Each failure says how much of the answer arrived: the caller spends it from a
                # download budget (an ERROR frame after 15 MiB of data cost us the 15 MiB).
                def failed(reason: CallFailure, detail: str) -> PeerCallError:
                    return PeerCallError(reason, peer_id, name, detail, received=progress.received)

                try:
                    response = await read_message(reader, max_response_bytes, progress)
                except RemoteRefused as e:
                    raise _refusal(peer_id, name, str(e), received=progress.received) from e
                except MessageTooLarge as e:
                    raise failed(CallFailure.TOO_LARGE, f"response exceeds {e.limit} bytes") from e
                except FramingError as e:
                    lost = _send_failure(sending)  # the stream broke while we were still sending
                    if lost is not None:
                        raise failed(CallFailure.UNREACHABLE, lost) from e
                    reason = CallFailure.CLOSED if isinstance(e, StreamEnded) else CallFailure.PROTOCOL
                    raise failed(reason, str(e)) from e
                except OSError as e:
                    raise failed(CallFailure.UNREACHABLE, f"connection lost: {e}") from e
                # A complete answer: the exchange succeeded, even if a (misbehaving) peer
                # answered before reading all of the request.
                return response
        except TimeoutError as e:
            raise PeerCallError(
                CallFailure.TIMEOUT,
                peer_id,
                name,
                f"no complete answer within {timeout} s ({progress.received} bytes of it arrived)",
                received=progress.received,
            ) from e
        finally:
            if sending is not None:
                sending.cancel()  # no-op when already done
                await asyncio.wait([sending])
                if not sending.cancelled():
                    sending.exception()  # mark it retrieved: its failure was reported above
            if writer is not None:
                writer.close()

    # ------------------------------------------------------------------ internals

    async def _rejoin_loop(self) -> None:
        """Every ``rejoin_interval``, re-dial the initial peers missing from the routing table:
        all of them when it ran empty (the only peer we knew restarted), so a node never stays
        alone for good; and a bootstrap peer that was down and came back. A restarted bootstrap
        has an empty routing table and learns of a node only when that node contacts it, so
        without this, nodes that join through it later would never find the ones already up
        (measured: tests/fault/test_bootstrap_down.py)."""
        assert self._config is not None and self._dht is not None
        while True:
            await asyncio.sleep(self._config.rejoin_interval)
            table = self._dht.protocol.routing_table
            missing = [m for m in self._initial_peers if _maddr_peer(m) not in table.peer_id_to_uid]
            if missing:
                await self._dial_initial_peers(missing)

    async def _dial_initial_peers(self, maddrs: list[str] | None = None) -> None:
        """Connect to each initial peer (or those of ``maddrs``) and ping it into the routing table."""
        assert self._config is not None and self._dht is not None and self._p2p is not None
        p2p, dht, deadline = self._p2p, self._dht, self._config.dht_rpc_timeout * 2

        async def dial(maddr: str) -> None:
            parsed = Multiaddr(maddr)
            peer = PeerID.from_base58(parsed["p2p"])
            try:
                async with asyncio.timeout(deadline):
                    await p2p._client.connect(peer, [parsed.decapsulate(Multiaddr(f"/p2p/{peer}"))])
                    if await dht.protocol.call_ping(peer) is None:
                        logger.info("initial peer %s connected but did not answer the DHT ping", maddr)
            except (TimeoutError, P2PDaemonError, OSError) as e:
                logger.info("initial peer %s unreachable: %s", maddr, e or type(e).__name__)

        await asyncio.gather(*(dial(maddr) for maddr in (self._initial_peers if maddrs is None else maddrs)))

    def _track_serving(self) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._serving.add(task)

    def _untrack_serving(self) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._serving.discard(task)

    def _require_identity(self) -> Libp2pIdentity:
        if self._identity is None:
            raise NetError("the runtime has no identity yet: call start() first")
        return self._identity

    def _require_running(self) -> None:
        if self._state != "running":
            raise NetError(f"the runtime is {self._state}, not running")

    def _require_p2p(self) -> P2P:
        self._require_running()
        assert self._p2p is not None
        return self._p2p

    def _require_dht(self) -> DHTNode:
        self._require_running()
        assert self._dht is not None
        return self._dht


def _maddr_peer(maddr: str) -> PeerID:
    """The peer id of a checked initial-peer multiaddr (it ends in /p2p/<peer id>)."""
    return PeerID.from_base58(Multiaddr(maddr)["p2p"])


def _log_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("%s crashed", task.get_name(), exc_info=task.exception())


def _no_initial_peer(peers: list[str], cause: BaseException) -> NetError:
    return NetError(
        f"none of the initial peers answered ({', '.join(peers)}): check that they run and that the "
        f"addresses (with /p2p/ peer ids) are right ({cause})"
    )


def _check_name(name: str) -> None:
    if not _NAME.match(name):
        raise ValueError(f"handler name {name!r} must be 1-64 characters of A-Z a-z 0-9 _ . -")


def _peer(peer_id: str, name: str) -> PeerID:
    try:
        return PeerID.from_base58(peer_id)
    except ValueError as e:
        raise PeerCallError(CallFailure.UNREACHABLE, peer_id, name, "not a libp2p peer id") from e


def _refusal(peer_id: str, name: str, text: str, *, received: int = 0) -> PeerCallError:
    code = text.split(":", 1)[0].strip()
    reason = CallFailure.TOO_LARGE if code == _TOO_LARGE else CallFailure.REMOTE_ERROR
    return PeerCallError(reason, peer_id, name, text, received=received)


async def _linger(reader: asyncio.StreamReader) -> None:
    """After an ERROR frame sent before the whole request was read (too large, busy, timeout),
    read and drop what the caller still sends until it hangs up (it does as soon as it reads
    the ERROR frame), for at most REFUSAL_LINGER seconds.

    Closing with unread input makes the kernel reset the socket, and p2pd then resets the
    libp2p stream: the caller would see "connection reset" instead of our ERROR frame.
    """
    with contextlib.suppress(TimeoutError, OSError):
        async with asyncio.timeout(REFUSAL_LINGER):
            while await reader.read(MAX_CHUNK):
                pass


def _send_failure(sending: asyncio.Task[None]) -> str | None:
    if sending.done() and not sending.cancelled() and sending.exception() is not None:
        return f"sending the request failed: {sending.exception()}"
    return None


def _prepare_socket_dir(identity_path: Path, *, ephemeral: bool) -> Path:
    """A private directory for p2pd's two control sockets.

    Unix socket paths are limited to ~108 bytes, so it lives under the temp dir,
    named after the identity; the identity lock is held, so sockets found there
    are stale leftovers of a killed run and are removed.
    """
    if ephemeral:
        return Path(tempfile.mkdtemp(prefix="swarmnode-p2p-"))
    digest = hashlib.sha256(str(identity_path.resolve()).encode()).hexdigest()[:16]
    directory = Path(tempfile.gettempdir()) / f"swarmnode-p2p-{os.getuid()}-{digest}"
    directory.mkdir(mode=0o700, exist_ok=True)
    if directory.stat().st_uid != os.getuid() or directory.is_symlink():
        raise ConfigError(f"{directory} belongs to another user; remove it or set TMPDIR")
    _clean_socket_dir(directory, remove=False)
    return directory


def _clean_socket_dir(directory: Path, *, remove: bool) -> None:
    for sock in directory.glob("p2p-*.sock"):
        with contextlib.suppress(FileNotFoundError):
            sock.unlink()
    if remove:
        with contextlib.suppress(OSError):
            directory.rmdir()
