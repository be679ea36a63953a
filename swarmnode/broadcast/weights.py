"""Policy versions from the learner to its workers over the pipelined weight broadcast.

Owns: when the learner publishes a version and to whom it sends the signed manifest, which
versions stay served, and (worker side) receiving a version from any peer that has it and
swapping it into the model atomically, between batches.
Must not: choose chunks or sources (``core.broadcast`` does), decide which version to fetch,
abandon or install (``swarmnode.broadcast.receiver.ReceiverCore`` does; ``WeightReceiver`` is its
driver), or move bytes itself (``swarmnode.broadcast.driver.BroadcastNode`` over the data plane does).

Flow: after each step the learner publishes version v (blob + manifest signed by the learner)
and sends the manifest envelope to every active worker. A worker that gets a manifest signed
by its learner for a version newer than its own fetches the chunks from the learner and the
other workers (each worker serves a chunk as soon as it verified it) and, once every chunk
is verified, loads the state_dict under the model lock, so a batch is never generated with a
half-swapped model. Every worker learns the other workers' data-plane addresses from their
records under the learner's workers key (``workers.records``).

A learner training LoRA adapters (``base`` given) publishes each version as its adapter alone, a
few percent of the model (``swarmnode.broadcast.adapter``); a worker that answers it does not hold
the learner's base (``base_mismatch``) is sent every version whole from then on, merged from the
base and the adapter.

The learner keeps its last ``keep`` versions published (S + 1: a worker still fetching an
older version can finish it), as memory-mapped files in its ``archive``. Those blobs are also the
learner's only copies of old weights: its spot checks re-compute a worker's log-probs under the
version it claims from ``weights_of``. The learner times each
version from sending its manifest to a worker to that worker announcing every chunk
(ChunkHave): that is the dissemination time D its activation plan checks against S * T. A worker abandons a
receive once a manifest more than S versions newer arrives: the learner no longer serves the
old version, and everything generated with it would be dropped as stale anyway. (Without
that rule a worker that fell behind a fast learner waited out ``RECEIVE_TIMEOUT`` on a version
nobody had any more.)
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import mmap
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from swarmnode.broadcast.adapter import BaseWeights
from swarmnode.broadcast.core import Blame, BroadcastConfig
from swarmnode.broadcast.driver import (
    Blob,
    BroadcastError,
    BroadcastNode,
    OpenedManifest,
    Published,
    blob_to_state_dict,
    publishable,
    state_dict_to_blob,
    write_blob,
)
from swarmnode.broadcast.receiver import (
    AbandonReceive,
    Action,
    ChunkBlamed,
    Close,
    Install,
    Installed,
    ManifestArrived,
    ReceiveComplete,
    ReceiveFailed,
    ReceiverCore,
    Release,
    StartReceive,
)
from swarmnode.identity import NodeIdentity, peer_id_from_key
from swarmnode.net.dataplane import DataPlane, DataPlaneError, PeerRefused, RefuseRequest
from swarmnode.net.identity_lock import IdentityLock
from swarmnode.ops.metrics import Metrics
from swarmnode.ops.supervise import TaskSet
from swarmnode.policy import Policy
from swarmnode.policy.lock import ModelLock
from swarmnode.policy.lora import broadcast_adapter, merged_state_dict
from swarmnode.rollout import RolloutEngine
from swarmnode.store.atomic import atomic_write_text
from swarmnode.wire import Envelope, Kind, PeerRecord, TensorEntry, WeightManifest
from swarmnode.wire.messages import Message, WeightManifestBody

log = logging.getLogger(__name__)
MANIFEST_TIMEOUT = 10.0
RECEIVE_TIMEOUT = 300.0


def _read_highest(record: Path | None) -> int:
    """The version in ``record`` (-1: none yet). An unreadable record is named in a warning and
    counts as none: it is this node's own file, written atomically."""
    if record is None:
        return -1
    try:
        return int(record.read_text(encoding="utf-8").strip())
    except FileNotFoundError:
        return -1
    except (OSError, ValueError) as exc:
        log.warning("ignoring the published-version record %s: %s", record, exc)
        return -1


def _private(path: str, flags: int) -> int:
    """Open for ``open(..., opener=)``, a new file readable by this user alone (as every file in a
    node's home: ``swarmnode.home``)."""
    return os.open(path, flags, 0o600)


class WeightPublisher:
    """The learner's side: publish each version, tell the active workers."""

    def __init__(
        self,
        identity: NodeIdentity,
        dataplane: DataPlane,
        model_id: str,
        chunk_bytes: int,
        *,
        keep: int,
        metrics: Metrics,
        on_blame: Any = None,
        on_disseminated: Callable[[str, int, float], None] | None = None,
        record: Path | None = None,
        archive: Path | None = None,
        base: BaseWeights | None = None,
    ) -> None:
        # The highest version ever published (``record``: kept there across restarts). A version
        # number names one set of weights for good: a learner resumed from an older checkpoint
        # numbers past it (``next_free``). Reused, a worker still holding the old weights of
        # number N ignores the new N as not newer, keeps generating with the old weights, and
        # fails its spot checks once we reach N again: every worker deactivated (red team #20).
        self.record = record
        self.highest = _read_highest(record)
        self.node = BroadcastNode(
            identity, dataplane, BroadcastConfig(), on_blame=on_blame, on_peer_complete=self._peer_complete
        )
        self.on_disseminated = on_disseminated  # (worker, version, seconds since it was told)
        # Who was told which version, in one place: worker -> digest of the newest manifest sent to
        # it (a send that failed is forgotten, so the next ``tell`` sends again).
        self.told: dict[str, bytes] = {}
        # (worker, digest) -> when its manifest was first sent to that worker (monotonic): D runs
        # from there, not from publishing, which may be long before a worker is activated.
        self.told_at: dict[tuple[str, bytes], float] = {}
        self.model_id = model_id
        self.chunk_bytes = chunk_bytes
        self.keep = max(1, keep)
        self.metrics = metrics
        self.published: collections.OrderedDict[int, Published] = collections.OrderedDict()
        # Where the ``keep`` versions served live: ``archive`` (one file each, memory-mapped: the
        # kernel's page cache holds what is read, and drops it under pressure, instead of ``keep``
        # full copies of the model in the learner's own memory), else in memory (tests, tools).
        self.archive = archive
        self._files: dict[str, Path] = {}  # archive file name -> its path
        # One learner per archive, locked before the sweep below: another one's would delete our
        # served versions and write to our ``.partial`` names (its identity lock comes much later).
        self._archive_lock = IdentityLock(archive, "the learner's archive") if archive is not None else None
        if archive is not None and self._archive_lock is not None:
            self._archive_lock.acquire()
            archive.mkdir(parents=True, exist_ok=True, mode=0o700)
            for stale in archive.glob("*.blob*"):  # an earlier run's: nothing refers to them
                stale.unlink(missing_ok=True)
        self.dataplane = dataplane
        # Set: each version is the model's LoRA adapter for this base (its workers hold it), not
        # the whole merged model (``swarmnode.broadcast.adapter``); a worker that refuses it as not
        # its base (``without_base``) is sent each version whole instead (``whole``).
        self.base = base
        self.without_base: set[str] = set()
        self._records: dict[str, PeerRecord] = {}  # worker -> its record, as last told
        self.whole: dict[int, Published] = {}
        self._whole_lock = asyncio.Lock()
        self._closing = threading.Event()
        self._tasks = TaskSet("weight publisher")  # manifest sends

    async def start(self) -> None:
        await self.node.start()

    async def close(self) -> None:
        self._closing.set()  # a whole version being written in a thread is dropped, not installed
        await self._tasks.close()
        await self.node.close()
        if self._archive_lock is not None:
            self._archive_lock.release()

    @property
    def latest(self) -> Published | None:
        return next(reversed(self.published.values())) if self.published else None

    def next_free(self, version: int) -> int:
        """``version``, or the first number past every version published before."""
        return max(version, self.highest + 1)

    def publish(self, version: int, model: torch.nn.Module) -> Published:
        if version <= self.highest:
            raise ValueError(f"policy version {version} was published already (highest {self.highest})")
        # The adapter alone for workers holding our base, else the merged weights (LoRA adapters
        # folded in) a worker's plain model loads; a tied head and embedding once.
        if self.base is not None:
            state, scale = broadcast_adapter(model)
            published = self._publish(version, f"{version}.blob", state, self.base.hash, scale)
        else:
            published = self._publish(
                version, f"{version}.blob", publishable(merged_state_dict(model)), b"", 0.0
            )
        self.published[version] = published
        if self.base is not None and self.without_base:  # whole, for workers that lack our base:
            # merged from the base and the adapter just archived, off the event loop (a model-sized
            # merge, hash and write), then sent to them
            self._tasks.spawn(self._whole_then_tell(), name=f"weights v{version} whole")
        while len(self.published) > self.keep:
            old_version, old = self.published.popitem(last=False)
            self._retire(f"{old_version}.blob", old)
            whole = self.whole.pop(old_version, None)
            if whole is not None:
                self._retire(f"{old_version}.whole.blob", whole)
        self.highest = version
        if self.record is not None:
            atomic_write_text(self.record, f"{version}\n")
        self.metrics.set("published_version", "Latest policy version published", version)
        return published

    def _publish(
        self, version: int, name: str, state: Mapping[str, torch.Tensor], base_hash: bytes, scale: float
    ) -> Published:
        blob, tensors, hashes = self._blob(name, state)
        return self.node.publish_blob(
            blob,
            tensors,
            self.model_id,
            version,
            self.chunk_bytes,
            hashes,
            base_hash=base_hash,
            adapter_scale=scale,
        )

    def _retire(self, name: str, old: Published) -> None:
        self.node.retire(old.digest)
        # Unlinked now; a chunk being served keeps its map (and so the file's pages) until done.
        path = self._files.pop(name, None)
        if path is not None:
            path.unlink(missing_ok=True)
        for key in [k for k in self.told_at if k[1] == old.digest]:
            del self.told_at[key]

    def _blob(
        self, name: str, state: Mapping[str, torch.Tensor]
    ) -> tuple[Blob, tuple[TensorEntry, ...], tuple[bytes, ...] | None]:
        """``state`` as a blob to serve: archived as file ``name``, else in memory (chunk hashes then
        taken when the manifest is built)."""
        if self.archive is None:
            blob, tensors = state_dict_to_blob(state)
            return blob, tensors, None
        return self._archived(name, state)

    def _archived(
        self, name: str, state: Mapping[str, torch.Tensor]
    ) -> tuple[Blob, tuple[TensorEntry, ...], tuple[bytes, ...]]:
        """Write ``state`` into the archive as file ``name``, a tensor at a time (its chunk hashes
        taken on the way), and map it read-only: its pages enter this process's memory only as
        chunks are served or a spot check loads it."""
        assert self.archive is not None
        path = self.archive / name
        partial = path.with_suffix(".blob.partial")
        try:
            with open(partial, "wb", opener=_private) as file:
                tensors, hashes = write_blob(state, file, self.chunk_bytes)
            if self._closing.is_set():  # closed while this thread wrote: the archive is not ours now
                raise BroadcastError("the publisher closed while the version was written")
            os.replace(partial, path)
            with open(path, "rb") as file:
                blob: Blob = (
                    mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
                    if os.fstat(file.fileno()).st_size
                    else b""
                )
        except BaseException:
            # A full disk or an unwritable archive: nothing of this version is left to fill it more.
            partial.unlink(missing_ok=True)
            path.unlink(missing_ok=True)
            raise
        self._files[name] = path
        return blob, tensors, hashes

    def status(self) -> dict[str, Any]:
        """How versions go out: as adapters or whole, their size, who is sent them whole."""
        latest = self.latest
        return {
            "mode": "adapter" if self.base is not None else "whole",
            "version_bytes": latest.manifest.body.total_bytes if latest is not None else None,
            "whole_version_bytes": next(
                (p.manifest.body.total_bytes for p in reversed(self.whole.values())), None
            ),
            "workers_without_base": sorted(self.without_base),
        }

    def weights_of(self, version: int) -> tuple[Blob, WeightManifestBody] | None:
        """The blob and manifest body of a version still served (the last ``keep``), or None. The
        learner's spot checks re-compute an older version from here (``BaseWeights.install``): it
        keeps no other copy of old weights."""
        published = self.published.get(version)
        return self.node.served(published.digest) if published is not None else None

    def _version_of(self, digest: bytes) -> int | None:
        for versions in (self.published, self.whole):
            found = next((v for v, p in versions.items() if p.digest == digest), None)  # <= keep
            if found is not None:
                return found
        return None

    def _peer_complete(self, peer: str, digest: bytes) -> None:
        """``peer`` announced every chunk of a version we told it of: that is D for it."""
        at = self.told_at.pop((peer, digest), None)
        version = self._version_of(digest)
        if at is None or version is None:
            return
        seconds = time.monotonic() - at
        self.metrics.set("dissemination_seconds", "Seconds the last version took to reach a worker", seconds)
        if self.on_disseminated is not None:
            try:
                self.on_disseminated(peer, version, seconds)
            except Exception:  # called from a ChunkHave handler: never turn it into an error reply
                log.exception("dissemination callback failed")

    def set_peers(self, addresses: dict[str, str]) -> None:
        """The workers' data-plane addresses (the broadcast's other peers)."""
        for peer, address in addresses.items():
            self.node.add_peer(peer, address)

    def latest_for(self, worker: str) -> Published | None:
        """The newest version as ``worker`` takes it: whole when it lacks our base, else as published."""
        if worker not in self.without_base:
            return self.latest
        newest = next(reversed(self.published), None)
        return self.whole.get(newest) if newest is not None else None

    def tell(self, worker: PeerRecord, *, again: bool = False) -> bool:
        """Send the latest manifest to ``worker`` (in the background; a failure is logged), once
        per version unless ``again`` (e.g. right after an Activate: a worker that restarted may
        have lost it). True when a send started."""
        self._records[worker.peer_id] = worker  # where to send the whole version once it is built
        latest = self.latest_for(worker.peer_id)
        if latest is None or (not again and self.told.get(worker.peer_id) == latest.digest):
            return False
        self.told[worker.peer_id] = latest.digest
        key = (worker.peer_id, latest.digest)
        first = key not in self.told_at  # a re-send keeps the first time: D runs from there
        if first:
            self.told_at[key] = time.monotonic()
        self._tasks.spawn(
            self._send(worker, latest.manifest_envelope, latest.digest, key if first else None),
            name=f"manifest to {worker.peer_id}",
        )
        return True

    def forget(self, worker: str) -> None:
        """``worker`` left or restarted: what it was told, and the timings of it, no longer hold."""
        self.told.pop(worker, None)
        self._records.pop(worker, None)
        self.without_base.discard(worker)  # restarted, it may hold our base now
        for key in [k for k in self.told_at if k[0] == worker]:
            del self.told_at[key]

    async def _send(
        self, worker: PeerRecord, envelope: Envelope, digest: bytes, timing: tuple[str, bytes] | None
    ) -> None:
        try:
            await self.dataplane.request_peer(
                worker.addresses,
                worker.libp2p_peer_id or None,
                None,
                envelope=envelope,
                timeout=MANIFEST_TIMEOUT,
                expect_peer=worker.peer_id,
            )
        except DataPlaneError as e:
            if self.told.get(worker.peer_id) == digest:
                del self.told[worker.peer_id]  # not told after all: the next ``tell`` sends again
            if timing is not None:
                self.told_at.pop(timing, None)  # and a later send times D
            if (
                isinstance(e, PeerRefused)
                and e.reason == "base_mismatch"
                and self.base is not None
                and worker.peer_id not in self.without_base
            ):
                # It does not hold our base: from now on it gets whole versions, starting now.
                log.warning(
                    "worker %s lacks this learner's base model (%s): sending it whole versions",
                    worker.peer_id,
                    e,
                )
                self.without_base.add(worker.peer_id)
                self.metrics.inc("workers_without_base", "Workers sent whole versions: they lack our base")
                await self._whole_then_tell()  # ``tell`` kept its record
                return
            log.warning("manifest to worker %s failed: %s", worker.peer_id, e)
            self.metrics.inc("manifest_failures", "Manifests a worker did not take")

    async def _whole_then_tell(self) -> None:
        """The newest version whole (``_whole_latest``), then told to every worker without our base."""
        try:
            await self._whole_latest()
        except OSError as e:  # the adapter is out; workers without our base miss this one
            log.warning("weights not published whole: %s", e)
            return
        for peer in sorted(self.without_base):
            record = self._records.get(peer)
            if record is not None:
                self.tell(record)

    async def _whole_latest(self) -> None:
        """Publish the newest version whole as well (merged from our base and its adapter, off the
        event loop: no model is read, so a step running meanwhile changes nothing), unless done."""
        assert self.base is not None
        async with self._whole_lock:
            version = next(reversed(self.published), None)
            if version is None or version in self.whole:
                return
            served = self.weights_of(version)
            if served is None:
                return
            blob, body = served
            base = self.base
            state = await asyncio.to_thread(
                lambda: base.merged(blob_to_state_dict(blob, body.tensors), body.adapter_scale)
            )
            name = f"{version}.whole.blob"
            whole_blob, tensors, hashes = await asyncio.to_thread(self._blob, name, state)
            if version not in self.published:  # retired meanwhile: a newer one was published whole
                path = self._files.pop(name, None)
                if path is not None:
                    path.unlink(missing_ok=True)
                return
            self.whole[version] = self.node.publish_blob(
                whole_blob, tensors, self.model_id, version, self.chunk_bytes, hashes
            )


class WeightReceiver:
    """The worker's side: take manifests from the learner, fetch, swap in between batches.

    The asyncio driver of ``ReceiverCore`` (``swarmnode.broadcast.receiver``), which decides what
    to fetch, abandon and install; this class checks who sent a manifest, runs one task per
    receive, and installs under ``model_lock``.
    """

    def __init__(
        self,
        identity: NodeIdentity,
        dataplane: DataPlane,
        policy: Policy,
        engine: RolloutEngine,
        metrics: Metrics,
        *,
        learner_id: str,
        staleness_bound: int,
        base: BaseWeights | None = None,
    ) -> None:
        self.node = BroadcastNode(identity, dataplane, BroadcastConfig(), on_blame=self._blamed)
        # What installs versions into the model: whole ones, and adapter ones for the base it was
        # loaded with (``base``: made, and its hash taken, off the event loop by the caller).
        self.base = base if base is not None else BaseWeights(policy.model)
        self.core: ReceiverCore[OpenedManifest] = ReceiverCore(staleness_bound, installed=policy.version)
        self.policy = policy
        self.engine = engine
        self.metrics = metrics
        self.learner_id = learner_id
        self.model_lock = ModelLock()  # the worker's generation takes it too
        self._tasks: dict[bytes, asyncio.Task[None]] = {}  # digest -> its receive (at most one)
        self.last_seconds: float | None = None
        dataplane.register(Kind.WEIGHT_MANIFEST, self._on_manifest)

    @property
    def staleness_bound(self) -> int:
        return self.core.staleness_bound

    @property
    def receiving(self) -> list[int]:
        """The version being received (at most one)."""
        return self.core.receiving

    @property
    def blamed(self) -> collections.Counter[str]:
        return self.core.stats.blames

    def _blamed(self, blame: Blame) -> None:
        self.metrics.inc("chunks_blamed", "Invalid weight chunks received (sender blamed)")
        self._perform(self.core.handle(ChunkBlamed(blame.peer)))

    def status(self) -> dict[str, Any]:
        core = self.core.status()
        flight = self.core.in_flight
        progress = self.node.core.progress(flight.digest) if flight is not None else None
        return {
            "version": self.policy.version,
            "receiving": core["receiving"],
            # chunks held / in all of the version being received (None: nothing in flight)
            "chunks_received": None if progress is None else f"{progress[0]}/{progress[1]}",
            "pending": core["pending"],
            "last_receive_s": self.last_seconds,
            "blamed": core["blamed"],
            "stats": vars(self.node.stats),
        }

    def set_peers(self, addresses: dict[str, str]) -> None:
        for peer, address in addresses.items():
            self.node.add_peer(peer, address)

    async def _on_manifest(self, sender: str, envelope: Envelope, message: Message) -> None:
        if self.core.closed:
            return None
        if sender != self.learner_id or not isinstance(message, WeightManifest):
            raise RefuseRequest("not_learner", "manifests are taken from this worker's learner only")
        try:
            opened = OpenedManifest.from_request(envelope, message)  # opened once, carried as a value
        except BroadcastError as e:
            raise RefuseRequest("bad_manifest", str(e)) from None
        if peer_id_from_key(opened.manifest.publisher_key) != self.learner_id:
            raise RefuseRequest("not_learner", "manifest not published by this worker's learner")
        body = opened.body
        if body.is_adapter and body.base_hash != self.base.hash:
            raise RefuseRequest(
                "base_mismatch",
                f"an adapter for base {body.base_hash.hex()[:16]}; this worker loaded "
                f"{self.base.hash.hex()[:16]} (start it with the learner's model)",
            )
        if body.is_adapter and not self.base.holds_base:
            raise RefuseRequest("base_mismatch", "this worker installed whole weights since it started")
        self._perform(self.core.handle(ManifestArrived(opened.version, opened.digest, opened)))
        return None

    def _perform(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, StartReceive):
                task = asyncio.get_running_loop().create_task(
                    self._receive(action.manifest), name=f"weights v{action.version}"
                )
                self._tasks[action.digest] = task
                task.add_done_callback(functools.partial(self._task_done, action.digest))
            elif isinstance(action, AbandonReceive):
                if action.newer is not None:
                    log.warning(
                        "abandoning weights v%d: v%d is more than %d versions newer",
                        action.version,
                        action.newer,
                        self.staleness_bound,
                    )
                    self.metrics.inc(
                        "weights_abandoned", "Weight receives abandoned for a much newer version"
                    )
                abandoned = self._tasks.pop(action.digest, None)
                if abandoned is not None:
                    abandoned.cancel()
            elif isinstance(action, Release):
                self.node.retire(action.digest)  # stop holding and serving its bytes
            elif isinstance(action, Install):
                # Only a receive task installs (it holds the state_dict and the model lock).
                raise AssertionError(f"Install of v{action.version} outside its receive task")

    def _task_done(self, digest: bytes, task: asyncio.Task[None]) -> None:
        if self._tasks.get(digest) is task:
            del self._tasks[digest]

    def _failed(self, opened: OpenedManifest, reason: str) -> None:
        if opened.version in self.core.receiving:  # not one abandoned meanwhile
            self.metrics.inc("weights_failed", "Weight versions not received")
        self._perform(self.core.handle(ReceiveFailed(opened.version, opened.digest, reason)))

    async def _receive(self, opened: OpenedManifest) -> None:
        t0 = time.monotonic()
        version = opened.version
        try:
            blob = await self.node.receive(opened, timeout=RECEIVE_TIMEOUT)
        except BroadcastError as e:
            log.warning("weights v%d not received: %s", version, e)
            self._failed(opened, str(e))
            return
        except Exception as e:  # a bug, not the peers: logged with its traceback, and the next one runs
            log.error("receiving weights v%d failed", version, exc_info=e)
            self._failed(opened, repr(e))
            return
        async with self.model_lock.held():  # between batches: never a half-swapped model
            actions = self.core.handle(ReceiveComplete(version, opened.digest))
            if not any(isinstance(a, Install) for a in actions):
                self._perform(actions)  # a newer one was installed meanwhile: released
                return
            try:
                # Checked whole before any tensor is copied. On the event loop, not in a thread: a
                # cancelled receive must never leave a thread writing the model after the lock is
                # released (an adapter's merge at 0.5 B: 0.36 s, 1.9 s the first time).
                self.base.install(blob, opened.body)
                self.policy.version = version
                self.engine.update_weights(self.policy)
            except Exception as e:  # a manifest our learner signed that does not fit the model
                log.error("installing weights v%d failed", version, exc_info=e)
                self._failed(opened, repr(e))
                return
            self.last_seconds = time.monotonic() - t0
            self.metrics.set("policy_version", "Policy version the worker generates with", version)
            self.metrics.set(
                "weights_receive_seconds", "Seconds the last version took to arrive", self.last_seconds
            )
            log.info("weights v%d applied after %.2f s", version, self.last_seconds)
            self._perform(self.core.handle(Installed(version, opened.digest)))

    async def start(self) -> None:
        await self.node.start()

    async def close(self) -> None:
        self._perform(self.core.handle(Close()))
        for task in list(self._tasks.values()):
            task.cancel()
        await self.node.close()
