"""Weight broadcast driver: the sans-IO ``BroadcastCore`` over the direct ``DataPlane``.

Owns
    Turning a state_dict into a blob plus a signed ``WeightManifest`` (per-chunk SHA-256), the
    bytes of every version this node publishes or receives, hashing each arrived chunk against
    the manifest, the ChunkRequest / ChunkHave handlers, performing the core's actions
    (fetch in slices, announce, serve under an upload slot, refuse, blame) and its timers, and
    handing back the assembled blob / state_dict when a version completes.

Must not
    Decide which chunk comes from whom (the core does), apply weights to a model (the caller
    does, atomically, on the returned state_dict), or write files (callers that persist use
    ``swarmnode.store.atomic``).

Usage
    ``bn = BroadcastNode(identity, dataplane, config)`` registers its handlers on the data
    plane (before or after ``dataplane.start()``); ``bn.add_peer(peer_id, address)`` for every
    other peer of the swarm; ``await bn.start()`` (the timer task); publisher:
    ``version = bn.publish_state_dict(state_dict, model_id, version, chunk_size)`` (or
    ``publish_blob``) returns a ``Published`` whose ``manifest_envelope`` receivers need;
    receiver: ``blob = await bn.receive(manifest_envelope, timeout=...)``, then
    ``blob_to_state_dict(blob, body.tensors)``; ``bn.retire(digest)`` drops a version;
    ``on_peer_complete(peer, digest)`` is called once a peer has announced every chunk of a
    version this node holds (a publisher times dissemination with it);
    ``await bn.close()``. A chunk request for a version in flight is answered from verified
    chunks at once (pipelined relay).

A chunk travels as slices of at most ``MAX_CHUNK_SLICE`` (1 MiB) on one connection: the first
slice request takes an upload slot from the core (``ChunkRequested`` -> ``Upload`` or
``Refuse``); the following slices of that chunk from that peer ride on the same lease, which
ends (``UploadFinished``) once the last slice is written, or lapses after ``upload_timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import mmap
import time
import warnings
from collections.abc import Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, BinaryIO

from swarmnode.broadcast import core as bc
from swarmnode.core.events import PeerId
from swarmnode.identity import peer_id_from_key
from swarmnode.net.dataplane import (
    DataPlane,
    DataPlaneError,
    PeerRefused,
    RefuseRequest,
    Reply,
    RequestTimeout,
)
from swarmnode.ops.faults import fault_point
from swarmnode.ops.supervise import TaskSet
from swarmnode.wire import limits
from swarmnode.wire.envelope import Envelope, Signer, seal, sign_manifest, to_ms, verify_manifest
from swarmnode.wire.kinds import Kind
from swarmnode.wire.messages import (
    ChunkData,
    ChunkHave,
    ChunkRequest,
    Message,
    TensorEntry,
    WeightManifest,
    WeightManifestBody,
    decode_payload,
)
from swarmnode.wire.reasons import WireError

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

DEFAULT_CHUNK_SIZE = 4 * limits.MIB
HAVE_TIMEOUT = 10.0


def _dtype_names() -> dict[torch.dtype, str]:
    # torch is imported only by the state_dict helpers: relay-only processes never need it.
    import torch

    return {
        torch.bool: "BOOL",
        torch.uint8: "U8",
        torch.int8: "I8",
        torch.int16: "I16",
        torch.float16: "F16",
        torch.bfloat16: "BF16",
        torch.int32: "I32",
        torch.float32: "F32",
        torch.int64: "I64",
        torch.float64: "F64",
    }


class BroadcastError(Exception):
    """A version could not be published or received (bad manifest, timeout, retired)."""


# --------------------------------------------------------------------------- blobs and manifests


# ``load_blob_into`` reads tensors from a blob in place (a read-only map): torch warns that they cannot
# be written through, and they are only copied from. (A process-wide filter for that one message:
# ``warnings.catch_warnings`` around the load is not thread-safe.)
warnings.filterwarnings("ignore", message="The given buffer is not writable", category=UserWarning)

#: What a blob may be held in: bytes, a buffer being filled (a receiver), or a read-only memory map
#: of a file (a learner's archive of published versions: ``WeightPublisher(archive=...)``).
Blob = bytes | bytearray | mmap.mmap


def _copied_out(blob: mmap.mmap, start: int, length: int) -> bytes:
    """``blob[start:start + length]`` as bytes, its pages then dropped from the resident set (a
    served slice of an archived version: a worker fetching every version would otherwise map them
    all). One call, off the event loop: a read of a page not cached blocks."""
    data = blob[start : start + length]
    release_pages(blob, start, length)
    return data


def release_pages(blob: Blob, start: int = 0, length: int | None = None) -> None:
    """Drop the pages of ``blob[start:start + length]`` from this process's resident set when the
    blob is a memory map (a learner's archived version; other blobs: nothing to do).

    They are clean pages of a file the kernel keeps cached: the next read maps them again. Without
    this every version a spot check loaded or a worker fetched stayed resident: a 0.5 B learner at
    S = 8 held 9.80 GiB against its 9.20 target, 1.98 of it one version's pages, and serving all
    S + 1 versions would have mapped them all (issue #15 item 4)."""
    if not isinstance(blob, mmap.mmap) or len(blob) == 0 or not hasattr(mmap, "MADV_DONTNEED"):
        return
    end = len(blob) if length is None else min(len(blob), start + length)
    first = start - start % mmap.PAGESIZE  # madvise takes whole pages from a page boundary
    if first < end:
        blob.madvise(mmap.MADV_DONTNEED, first, end - first)


def _blob_parts(state_dict: Mapping[str, torch.Tensor]) -> Iterator[tuple[TensorEntry, memoryview]]:
    """Each tensor (sorted by name, contiguous CPU bytes, not copied) and its entry in the layout."""
    import torch

    names = _dtype_names()
    offset = 0
    for name in sorted(state_dict):
        tensor = state_dict[name].detach().to("cpu").contiguous()
        dtype = names.get(tensor.dtype)
        if dtype is None:
            raise BroadcastError(f"tensor {name!r} has dtype {tensor.dtype}, which the manifest cannot carry")
        data = tensor.reshape(-1).view(torch.uint8).numpy().data if tensor.numel() else memoryview(b"")
        yield TensorEntry(name, dtype, tuple(tensor.shape), offset, len(data)), data
        offset += len(data)


def state_dict_to_blob(state_dict: Mapping[str, torch.Tensor]) -> tuple[bytes, tuple[TensorEntry, ...]]:
    """Concatenate tensors (sorted by name, contiguous CPU bytes) and describe each."""
    entries, parts = zip(*_blob_parts(state_dict), strict=True) if state_dict else ((), ())
    return b"".join(parts), tuple(entries)


def write_blob(
    state_dict: Mapping[str, torch.Tensor], file: BinaryIO, chunk_size: int
) -> tuple[tuple[TensorEntry, ...], tuple[bytes, ...]]:
    """``state_dict_to_blob`` written to ``file`` a tensor at a time (no copy of the whole in memory),
    and its ``chunk_hashes`` taken on the way (so the file need not be read back to sign it)."""
    entries, hashes = [], []
    chunk, filled = hashlib.sha256(), 0
    for entry, data in _blob_parts(state_dict):
        file.write(data)
        entries.append(entry)
        at = 0
        while at < len(data):
            take = min(chunk_size - filled, len(data) - at)
            chunk.update(data[at : at + take])
            at, filled = at + take, filled + take
            if filled == chunk_size:
                hashes.append(chunk.digest())
                chunk, filled = hashlib.sha256(), 0
    if filled:
        hashes.append(chunk.digest())
    return tuple(entries), tuple(hashes)


def blob_to_state_dict(blob: Blob, tensors: tuple[TensorEntry, ...]) -> dict[str, torch.Tensor]:
    """The inverse of ``state_dict_to_blob`` (fresh tensors that own their memory)."""
    import torch

    dtypes = {name: dtype for dtype, name in _dtype_names().items()}
    out: dict[str, torch.Tensor] = {}
    for t in tensors:
        dtype = dtypes[t.dtype]
        if t.nbytes == 0:
            out[t.name] = torch.empty(t.shape, dtype=dtype)
            continue
        raw = torch.frombuffer(bytearray(blob[t.offset : t.offset + t.nbytes]), dtype=torch.uint8)
        out[t.name] = raw.view(dtype).reshape(t.shape)
    return out


def tied_to(state: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """Each name in ``state`` whose tensor is an earlier name's, storage, dtype and view alike (a tied
    LM head and input embedding), mapped to that first name in sorted order."""
    first: dict[tuple[int, int, tuple[int, ...], tuple[int, ...], Any], str] = {}
    aliases: dict[str, str] = {}
    for name in sorted(state):
        t = state[name]
        if not t.numel():
            continue
        key = (
            t.untyped_storage().data_ptr(),
            int(t.storage_offset()),
            tuple(t.shape),
            tuple(t.stride()),
            t.dtype,
        )
        if key in first:
            aliases[name] = first[key]
        else:
            first[key] = name
    return aliases


def tied_aliases(state: Mapping[str, torch.Tensor]) -> set[str]:
    """The names in ``state`` whose tensor is another name's, storage and all (a tied LM head and
    input embedding): each but the first in sorted order. A blob carries such a tensor once."""
    return set(tied_to(state))


def publishable(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` without its tied aliases (``tied_aliases``): what a version's blob holds."""
    aliases = tied_aliases(state)
    return {name: tensor for name, tensor in state.items() if name not in aliases}


def check_fits(
    model: torch.nn.Module, tensors: Mapping[str, tuple[tuple[int, ...], torch.dtype]]
) -> dict[str, torch.Tensor]:
    """``model``'s state dict, once ``tensors`` (name -> shape, dtype) is known to fill it exactly:
    every name of the model (a tied alias may be left out: it is the tensor it aliases), none other,
    every shape and dtype the model's. Otherwise a ``BroadcastError`` naming the difference, before
    anything is loaded."""
    targets = model.state_dict()
    names = set(tensors)
    missing = sorted(set(targets) - names - tied_aliases(targets))
    unexpected = sorted(names - set(targets))
    if missing or unexpected:
        raise BroadcastError(
            f"weights do not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    for name, (shape, dtype) in tensors.items():
        target = targets[name]
        if tuple(target.shape) != tuple(shape) or target.dtype != dtype:
            raise BroadcastError(
                f"tensor {name!r}: {dtype} {tuple(shape)} does not fit the model's "
                f"{target.dtype} {tuple(target.shape)}"
            )
    return targets


def _check_tied(targets: Mapping[str, torch.Tensor], same: Callable[[str, str], bool]) -> None:
    """A tied alias the weights carry anyway (a learner that sends both) must be the very tensor it
    aliases: the model cannot hold two values in one storage (e.g. a LoRA delta on a tied head)."""
    for alias, first in tied_to(targets).items():
        if not same(alias, first):
            raise BroadcastError(
                f"tensor {alias!r} is tied to {first!r} in this model, but the weights give it other values"
            )


def load_weights(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copy ``state`` into ``model`` after ``check_fits`` (nothing is loaded when it does not fit)."""
    import torch

    targets = check_fits(model, {name: (tuple(t.shape), t.dtype) for name, t in state.items()})
    _check_tied(
        targets,
        lambda a, b: a not in state or (state[a].dtype == state[b].dtype and torch.equal(state[a], state[b])),
    )
    with torch.no_grad():
        for name, tensor in state.items():
            targets[name].copy_(tensor)


def load_blob_into(model: torch.nn.Module, blob: Blob, tensors: tuple[TensorEntry, ...]) -> None:
    """``load_weights(model, blob_to_state_dict(blob, tensors))`` a tensor at a time, read from the
    blob in place, so no second copy of the model is ever made (a learner's spot checks load old
    versions into their scratch model from the memory-mapped archive this way)."""
    import torch

    dtypes = {name: dtype for dtype, name in _dtype_names().items()}
    view = memoryview(blob)
    entries = {t.name: t for t in tensors}
    for t in tensors:
        if t.dtype not in dtypes or t.offset + t.nbytes > len(view):
            raise BroadcastError(f"tensor {t.name!r}: dtype {t.dtype} or bytes past the blob's end")
    targets = check_fits(model, {t.name: (t.shape, dtypes[t.dtype]) for t in tensors})

    def same(a: str, b: str) -> bool:
        if a not in entries:
            return True
        x, y = entries[a], entries[b]
        return (
            x.dtype == y.dtype
            and view[x.offset : x.offset + x.nbytes] == view[y.offset : y.offset + y.nbytes]
        )

    _check_tied(targets, same)
    with torch.no_grad():
        for t in tensors:
            if t.nbytes:
                raw = torch.frombuffer(view[t.offset : t.offset + t.nbytes], dtype=torch.uint8)
                targets[t.name].copy_(raw.view(dtypes[t.dtype]).reshape(t.shape))
                del raw  # the pages it read are copied: off the resident set, a tensor at a time
                release_pages(blob, t.offset, t.nbytes)
    # and once whole: a page fault maps the cached pages around it too (up to 64 KiB), so each
    # tensor's reads mapped some of its neighbours' again
    release_pages(blob)


def chunk_hashes(blob: Blob, chunk_size: int) -> tuple[bytes, ...]:
    view = memoryview(blob)
    return tuple(hashlib.sha256(view[i : i + chunk_size]).digest() for i in range(0, len(blob), chunk_size))


def chunk_ok(body: WeightManifestBody, index: int, data: bytes | memoryview) -> bool:
    """Does ``data`` match chunk ``index`` of the manifest (length and SHA-256)?"""
    return len(data) == body.chunk_length(index) and hashlib.sha256(data).digest() == body.chunk_hashes[index]


def build_manifest(
    identity: Signer,
    model_id: str,
    version: int,
    blob: Blob,
    tensors: tuple[TensorEntry, ...],
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    hashes: tuple[bytes, ...] | None = None,
    *,
    base_hash: bytes = b"",
    adapter_scale: float = 0.0,
) -> tuple[WeightManifest, Envelope]:
    """The publisher's signed manifest and the envelope that carries it (its id names the version).
    ``hashes``: the blob's ``chunk_hashes``, when already known (``write_blob``). ``base_hash`` and
    ``adapter_scale``: the blob is a LoRA adapter for that base (``swarmnode.broadcast.adapter``)."""
    body = WeightManifestBody(
        model_id=model_id,
        version=version,
        tensors=tensors,
        chunk_size=chunk_size,
        chunk_hashes=hashes if hashes is not None else chunk_hashes(blob, chunk_size),
        total_bytes=len(blob),
        base_hash=base_hash,
        adapter_scale=adapter_scale,
    )
    manifest = sign_manifest(identity, body)
    return manifest, seal(identity, manifest, to_ms(time.time()))


def open_manifest(envelope: Envelope, trusted_publishers: frozenset[bytes] | None = None) -> WeightManifest:
    """Check a manifest envelope: signed, decodes, publisher signature valid (and trusted)."""
    if envelope.kind != Kind.WEIGHT_MANIFEST:
        raise BroadcastError(f"expected a weight_manifest envelope, got {envelope.kind.label}")
    if not envelope.verify():
        raise BroadcastError("manifest envelope signature does not verify")
    manifest = decode_payload(envelope.kind, envelope.payload)
    if isinstance(manifest, WireError):
        raise BroadcastError(f"manifest does not decode: {manifest.reason.value}: {manifest.detail}")
    assert isinstance(manifest, WeightManifest)
    if not verify_manifest(manifest):
        raise BroadcastError("manifest publisher signature does not verify")
    if trusted_publishers is not None and manifest.publisher_key not in trusted_publishers:
        raise BroadcastError("manifest publisher is not trusted")
    return manifest


@dataclass(frozen=True)
class OpenedManifest:
    """A manifest envelope checked once (both signatures, decode, publisher) and carried as a value,
    so nothing downstream re-opens it: each open costs two Ed25519 verifications."""

    envelope: Envelope
    manifest: WeightManifest
    digest: bytes  # the envelope id: the version's name among peers

    @property
    def version(self) -> int:
        return self.manifest.body.version

    @property
    def body(self) -> WeightManifestBody:
        return self.manifest.body

    @classmethod
    def open(cls, envelope: Envelope, trusted_publishers: frozenset[bytes] | None = None) -> OpenedManifest:
        """``open_manifest``'s checks; raises ``BroadcastError`` naming the one that failed."""
        return cls(envelope, open_manifest(envelope, trusted_publishers), envelope.envelope_id())

    @classmethod
    def from_request(cls, envelope: Envelope, message: WeightManifest) -> OpenedManifest:
        """A manifest a data-plane handler received: the data plane has verified the envelope's
        signature and decoded ``message`` from it; only the publisher's signature is left."""
        if not verify_manifest(message):
            raise BroadcastError("manifest publisher signature does not verify")
        return cls(envelope, message, envelope.envelope_id())

    def trusted_by(self, trusted_publishers: frozenset[bytes] | None) -> bool:
        return trusted_publishers is None or self.manifest.publisher_key in trusted_publishers


# --------------------------------------------------------------------------- the node


@dataclass
class Published:
    digest: bytes
    manifest: WeightManifest
    manifest_envelope: Envelope


@dataclass
class _Version:
    digest: bytes
    body: WeightManifestBody
    buffer: Blob
    done: asyncio.Future[None]
    greeted: set[PeerId] = field(default_factory=set)  # peers that got our full set

    def chunk(self, index: int) -> memoryview:
        start = index * self.body.chunk_size
        return memoryview(self.buffer)[start : start + self.body.chunk_length(index)]


@dataclass
class _Lease:
    request_id: int
    expires: float


@dataclass
class BroadcastNodeStats:
    chunks_fetched: int = 0
    bytes_fetched: int = 0  # of verified chunks
    chunks_invalid: int = 0
    slices_served: int = 0
    chunks_served: int = 0
    blames: int = 0
    haves_sent: int = 0
    have_failures: int = 0
    tasks_failed: int = 0


class BroadcastNode:
    """One node's weight broadcast; see the module docstring."""

    def __init__(
        self,
        identity: Signer,
        dataplane: DataPlane,
        config: bc.BroadcastConfig | None = None,
        *,
        on_blame: Callable[[bc.Blame], None] | None = None,
        on_peer_complete: Callable[[PeerId, bytes], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.identity = identity
        self.me: PeerId = peer_id_from_key(identity.public_key)
        self.dataplane = dataplane
        self.config = config or bc.BroadcastConfig()
        self.core = bc.BroadcastCore(self.me, self.config)
        self.stats = BroadcastNodeStats()
        self.on_blame = on_blame
        self.on_peer_complete = on_peer_complete  # (peer, digest): it announced every chunk
        self._clock = clock
        self._peers: dict[PeerId, str] = {}
        self._versions: dict[bytes, _Version] = {}
        self._waiting: dict[int, asyncio.Future[str | None]] = {}  # request id -> None (serve) / refusal
        self._leases: dict[tuple[PeerId, bytes, int], _Lease] = {}
        self._next_request = 0
        self._outbox: dict[PeerId, set[tuple[bytes, int]]] = {}
        self._senders: dict[PeerId, asyncio.Task[None]] = {}
        self._tasks = TaskSet("broadcast", self._task_failed)
        self._changed = asyncio.Event()
        self._timer: asyncio.Task[None] | None = None
        dataplane.register(Kind.CHUNK_REQUEST, self._on_chunk_request)
        dataplane.register(Kind.CHUNK_HAVE, self._on_chunk_have)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._timer = self._spawn(self._run_timers(), "broadcast timers")

    async def close(self) -> None:
        await self._tasks.close()  # the timer and the senders are among them
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_result("gone")

    def add_peer(self, peer: PeerId, address: str) -> None:
        if peer != self.me:
            self._peers[peer] = address

    def _spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        return self._tasks.spawn(coro, name)

    def _task_failed(self, name: str, exc: BaseException) -> None:
        self.stats.tasks_failed += 1

    # ------------------------------------------------------------------ the core

    def _feed(self, event: bc.Event) -> None:
        self._perform(self.core.handle(event, self._clock()))

    def _perform(self, actions: list[bc.Action]) -> None:
        self._changed.set()
        for action in actions:
            if isinstance(action, bc.Fetch):
                self._spawn(self._fetch(action), f"fetch {action.index} from {action.peer}")
            elif isinstance(action, bc.Have):
                self._announce(action.digest, action.index)
            elif isinstance(action, bc.Upload | bc.Refuse):
                fut = self._waiting.pop(action.request_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(action.reason if isinstance(action, bc.Refuse) else None)
                elif isinstance(action, bc.Upload):
                    self._feed_later(bc.UploadFinished(action.request_id))  # requester gone already
            elif isinstance(action, bc.Blame):
                self.stats.blames += 1
                log.warning("peer %s sent a bad chunk %d: %s", action.peer, action.index, action.reason)
                if self.on_blame is not None:
                    self.on_blame(action)
            elif isinstance(action, bc.Completed):
                v = self._versions.get(action.digest)
                if v is not None and not v.done.done():
                    v.done.set_result(None)

    def _feed_later(self, event: bc.Event) -> None:
        asyncio.get_running_loop().call_soon(self._feed, event)

    async def _run_timers(self) -> None:
        while True:
            deadline = self.core.next_deadline()
            self._changed.clear()
            if deadline is None:
                await self._changed.wait()
            else:
                delay = deadline - self._clock()
                if delay > 0:
                    # Not asyncio.wait_for: on Python 3.11 it swallows a cancel that lands in the
                    # loop iteration where the wait also ends (an event fed just as close() runs),
                    # and this loop would then never end. asyncio.timeout lets the cancel through.
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(delay):
                            await self._changed.wait()
            self._perform(self.core.poll(self._clock()))
            self._changed.clear()

    # ------------------------------------------------------------------ publishing

    def publish_blob(
        self,
        blob: Blob,
        tensors: tuple[TensorEntry, ...],
        model_id: str,
        version: int,
        chunk_size: int,
        hashes: tuple[bytes, ...] | None = None,
        *,
        base_hash: bytes = b"",
        adapter_scale: float = 0.0,
    ) -> Published:
        manifest, envelope = build_manifest(
            self.identity,
            model_id,
            version,
            blob,
            tensors,
            chunk_size,
            hashes,
            base_hash=base_hash,
            adapter_scale=adapter_scale,
        )
        digest = envelope.envelope_id()
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        self._versions[digest] = _Version(digest, manifest.body, blob, done)
        self._feed(bc.Publish(digest, bc.ChunkLayout(len(blob), chunk_size)))
        return Published(digest, manifest, envelope)

    def publish_prepared(self, blob: bytes, manifest_envelope: Envelope) -> Published:
        """Serve ``blob`` under a manifest envelope signed earlier (by this node's identity)."""
        manifest = open_manifest(manifest_envelope, frozenset([self.identity.public_key]))
        body = manifest.body
        if body.total_bytes != len(blob) or chunk_hashes(blob, body.chunk_size) != body.chunk_hashes:
            raise BroadcastError("blob does not match the manifest")
        digest = manifest_envelope.envelope_id()
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        self._versions[digest] = _Version(digest, body, blob, done)
        self._feed(bc.Publish(digest, bc.ChunkLayout(len(blob), body.chunk_size)))
        return Published(digest, manifest, manifest_envelope)

    def publish_state_dict(
        self,
        state_dict: Mapping[str, torch.Tensor],
        model_id: str,
        version: int,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
    ) -> Published:
        blob, tensors = state_dict_to_blob(state_dict)
        return self.publish_blob(blob, tensors, model_id, version, chunk_size)

    def served(self, digest: bytes) -> tuple[Blob, WeightManifestBody] | None:
        """The blob and manifest body this node serves under ``digest`` (a published version, or a
        received one once complete), or None: ``BaseWeights.install`` loads them into a model."""
        v = self._versions.get(digest)
        if v is None or not v.done.done() or v.done.cancelled() or v.done.exception() is not None:
            return None
        return v.buffer, v.body

    def retire(self, digest: bytes) -> None:
        v = self._versions.pop(digest, None)
        if v is not None and not v.done.done():
            v.done.set_exception(BroadcastError("version retired before it completed"))
        self._feed(bc.Retire(digest))

    # ------------------------------------------------------------------ receiving

    async def receive(
        self,
        manifest_envelope: Envelope | OpenedManifest,
        *,
        timeout: float,
        trusted_publishers: frozenset[bytes] | None = None,
    ) -> bytes:
        """Fetch the version a manifest names from the peers; return the verified blob. An
        ``OpenedManifest`` is not opened again."""
        if isinstance(manifest_envelope, OpenedManifest):
            opened = manifest_envelope
            if not opened.trusted_by(trusted_publishers):
                raise BroadcastError("manifest publisher is not trusted")
        else:
            opened = OpenedManifest.open(manifest_envelope, trusted_publishers)
        manifest, body, digest = opened.manifest, opened.body, opened.digest
        publisher = peer_id_from_key(manifest.publisher_key)
        v = self._versions.get(digest)
        if v is None:
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            v = self._versions[digest] = _Version(digest, body, bytearray(body.total_bytes), done)
            self._feed(
                bc.ManifestAccepted(digest, bc.ChunkLayout(body.total_bytes, body.chunk_size), publisher)
            )
            for peer in self._peers:
                self._outbox.setdefault(peer, set())
                self._kick(peer)  # an empty ChunkHave says hello; the answer is the peer's full set
        try:
            async with asyncio.timeout(timeout):  # not wait_for: see _run_timers
                await asyncio.shield(v.done)
        except TimeoutError as e:
            have = len(self.core.holding(digest))
            raise BroadcastError(
                f"version {body.version} not complete after {timeout:g} s "
                f"({have}/{len(body.chunk_hashes)} chunks)"
            ) from e
        return bytes(v.buffer)

    async def _fetch(self, action: bc.Fetch) -> None:
        fault_point("receive_chunk", may_pause=False)  # on the event loop: marker only
        v = self._versions.get(action.digest)
        address = self._peers.get(action.peer)
        if v is None or address is None:
            self._feed(bc.FetchFailed(action.peer, action.digest, action.index, "error"))
            return
        body = v.body
        length = body.chunk_length(action.index)
        parts: list[bytes] = []
        started = self._clock()
        deadline = started + action.timeout
        try:
            offset = 0
            while offset < length:
                size = min(limits.MAX_CHUNK_SLICE, length - offset)
                request = ChunkRequest(action.digest, action.index, offset, size)
                reply = await self.dataplane.request(
                    address,
                    request,
                    timeout=max(deadline - self._clock(), 0.001),
                    expect_peer=action.peer,
                )
                if not (
                    isinstance(reply, ChunkData)
                    and reply.manifest_digest == action.digest
                    and reply.chunk_index == action.index
                    and reply.offset == offset
                    and len(reply.data) == size
                ):
                    # A signed answer that is not the slice asked for: as bad as a wrong chunk.
                    self._feed(bc.ChunkReceived(action.peer, action.digest, action.index, False, 0, 0.0))
                    return
                parts.append(reply.data)
                offset += size
        except PeerRefused as e:
            passed_on = (bc.FAIL_BUSY, bc.FAIL_MISSING, bc.REFUSE_SEEDED, bc.REFUSE_NOT_PEER)
            # An honest server says busy or not_peer before a chunk's first slice, never after
            # serving part of it: later, it is a failure (red team rt94: ~3 MiB wasted per request).
            no_fault = e.reason in passed_on and not (
                offset > 0 and e.reason in (bc.FAIL_BUSY, bc.REFUSE_NOT_PEER)
            )
            reason = e.reason if no_fault else "refused"
            self._feed(bc.FetchFailed(action.peer, action.digest, action.index, reason))
            return
        except RequestTimeout:
            self._feed(bc.FetchFailed(action.peer, action.digest, action.index, bc.FAIL_TIMEOUT))
            return
        except DataPlaneError as e:
            log.debug("fetch of chunk %d from %s failed: %s", action.index, action.peer, e)
            self._feed(bc.FetchFailed(action.peer, action.digest, action.index, "error"))
            return
        data = b"".join(parts)
        # hashlib releases the GIL on large inputs: hash off the loop so serving goes on.
        valid = (
            await asyncio.to_thread(chunk_ok, body, action.index, data)
            if length > 256 * 1024
            else chunk_ok(body, action.index, data)
        )
        if valid and action.digest in self._versions and isinstance(v.buffer, bytearray):
            start = action.index * body.chunk_size
            v.buffer[start : start + length] = data
            self.stats.chunks_fetched += 1
            self.stats.bytes_fetched += length
        elif not valid:
            self.stats.chunks_invalid += 1
        self._feed(
            bc.ChunkReceived(action.peer, action.digest, action.index, valid, length, self._clock() - started)
        )

    # ------------------------------------------------------------------ announcing

    def _announce(self, digest: bytes, index: int) -> None:
        for peer in self._peers:
            self._outbox.setdefault(peer, set()).add((digest, index))
            self._kick(peer)

    def _kick(self, peer: PeerId) -> None:
        task = self._senders.get(peer)
        if task is None or task.done():
            self._senders[peer] = self._spawn(self._send_haves(peer), f"haves to {peer}")

    async def _send_haves(self, peer: PeerId) -> None:
        """Drain this peer's outbox, one ChunkHave per version per round trip (natural batching)."""
        while peer in self._outbox:
            pending = self._outbox.pop(peer)
            address = self._peers.get(peer)
            if address is None:
                return
            by_digest: dict[bytes, list[int]] = {}
            for digest, index in pending:
                by_digest.setdefault(digest, []).append(index)
            if not by_digest:
                by_digest = {d: [] for d, v in self._versions.items() if isinstance(v.buffer, bytearray)}
            for digest, indices in by_digest.items():
                await self._send_have(peer, address, digest, indices)

    async def _send_have(self, peer: PeerId, address: str, digest: bytes, indices: list[int]) -> None:
        try:
            reply = await self.dataplane.request(
                address, ChunkHave(digest, tuple(sorted(indices))), timeout=HAVE_TIMEOUT, expect_peer=peer
            )
        except DataPlaneError as e:
            self.stats.have_failures += 1
            log.debug("ChunkHave to %s failed: %s", peer, e)
            return
        self.stats.haves_sent += 1
        if isinstance(reply, ChunkHave) and reply.chunk_indices:
            self._peer_have(peer, reply.manifest_digest, frozenset(reply.chunk_indices))

    def _peer_have(self, peer: PeerId, digest: bytes, chunks: frozenset[int]) -> None:
        already = self.core.peer_has_all(digest, peer)
        self._feed(bc.PeerHave(peer, digest, chunks))
        if not already and self.on_peer_complete is not None and self.core.peer_has_all(digest, peer):
            self.on_peer_complete(peer, digest)

    # ------------------------------------------------------------------ serving

    async def _on_chunk_have(self, sender: str, envelope: Envelope, message: Message) -> Message | None:
        assert isinstance(message, ChunkHave)
        if sender not in self._peers:
            return None  # no address to fetch from: it will show up through a peer record
        if message.chunk_indices:
            self._peer_have(sender, message.manifest_digest, frozenset(message.chunk_indices))
        v = self._versions.get(message.manifest_digest)
        if v is None or sender in v.greeted:
            return None
        v.greeted.add(sender)
        held = self.core.holding(message.manifest_digest)
        return ChunkHave(message.manifest_digest, tuple(held)) if held else None

    async def _on_chunk_request(self, sender: str, envelope: Envelope, message: Message) -> Reply:
        assert isinstance(message, ChunkRequest)
        if sender not in self._peers:  # before any slot, lease or lookup is spent on it
            raise RefuseRequest(bc.REFUSE_NOT_PEER, "not one of this node's broadcast peers")
        digest, index = message.manifest_digest, message.chunk_index
        v = self._versions.get(digest)
        if v is None or index >= len(v.body.chunk_hashes):
            raise RefuseRequest(bc.REFUSE_MISSING, "unknown version or chunk")
        length = v.body.chunk_length(index)
        if message.offset + message.length > length:
            raise RefuseRequest("invalid", f"slice past the end of chunk {index} ({length} bytes)")
        key = (sender, digest, index)
        now = self._clock()
        lease = self._leases.get(key)
        if lease is None or lease.expires <= now:
            self._next_request += 1
            rid = self._next_request
            fut: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
            self._waiting[rid] = fut
            self._feed(bc.ChunkRequested(sender, digest, index, rid))
            try:
                refusal = await fut
            finally:
                self._waiting.pop(rid, None)
            if refusal is not None:
                raise RefuseRequest(refusal)
            lease = self._leases[key] = _Lease(rid, self._clock() + self.config.upload_timeout)
        piece = v.chunk(index)[message.offset : message.offset + message.length]
        # A memory-mapped version (a learner's archive) may be on disk only: its read blocks, so it
        # runs in a thread, not on the loop every peer's requests share.
        if isinstance(v.buffer, mmap.mmap):
            start = index * v.body.chunk_size + message.offset
            data = await asyncio.to_thread(_copied_out, v.buffer, start, len(piece))
        else:
            data = bytes(piece)
        last = message.offset + message.length >= length
        self.stats.slices_served += 1
        rid = lease.request_id

        def after(sent: bool) -> None:
            # The slot is freed once the last slice is written, or at once if a write fails.
            if last or not sent:
                if self._leases.get(key) is lease:
                    del self._leases[key]
                if last and sent:
                    self.stats.chunks_served += 1
                self._feed(bc.UploadFinished(rid))

        return Reply(ChunkData(digest, index, message.offset, data), after)
