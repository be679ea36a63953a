"""Policy versions from the learner to its workers over the pipelined weight broadcast.

Owns: when the learner publishes a version and to whom it sends the signed manifest, which
versions stay served, and (worker side) receiving a version from any peer that has it and
swapping it into the model atomically, between batches.
Must not: choose chunks or sources (``core.broadcast`` does), or move bytes itself
(``swarmnode.broadcast.driver.BroadcastNode`` over the data plane does).

Flow: after each step the learner publishes version v (blob + manifest signed by the learner)
and sends the manifest envelope to every active worker. A worker that gets a manifest signed
by its learner for a version newer than its own fetches the chunks from the learner and the
other workers (each worker serves a chunk as soon as it verified it) and, once every chunk
is verified, loads the state_dict under the model lock, so a batch is never generated with a
half-swapped model. Every worker learns the other workers' data-plane addresses from their
records under the learner's workers key (``workers.records``).

The learner keeps its last ``keep`` versions published (S + 1: a worker still fetching an
older version can finish it); memory is ``keep`` x the model's bytes. The learner times each
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
import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from swarmnode.broadcast.core import Blame, BroadcastConfig
from swarmnode.broadcast.driver import (
    BroadcastError,
    BroadcastNode,
    OpenedManifest,
    Published,
    blob_to_state_dict,
)
from swarmnode.identity import NodeIdentity, peer_id_from_key
from swarmnode.net.dataplane import DataPlane, DataPlaneError, RefuseRequest
from swarmnode.ops.metrics import Metrics
from swarmnode.policy import Policy
from swarmnode.rollout import RolloutEngine
from swarmnode.wire import Envelope, Kind, PeerRecord, WeightManifest
from swarmnode.wire.messages import Message

log = logging.getLogger(__name__)
MANIFEST_TIMEOUT = 10.0
RECEIVE_TIMEOUT = 300.0


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
    ) -> None:
        self.node = BroadcastNode(
            identity, dataplane, BroadcastConfig(), on_blame=on_blame, on_peer_complete=self._peer_complete
        )
        self.on_disseminated = on_disseminated  # (worker, version, seconds since it was told)
        # (worker, digest) -> when its manifest was first sent to that worker (monotonic): D runs
        # from there, not from publishing, which may be long before a worker is activated.
        self.told_at: dict[tuple[str, bytes], float] = {}
        self.model_id = model_id
        self.chunk_bytes = chunk_bytes
        self.keep = max(1, keep)
        self.metrics = metrics
        self.published: collections.OrderedDict[int, Published] = collections.OrderedDict()
        self.dataplane = dataplane
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        await self.node.start()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await self.node.close()

    @property
    def latest(self) -> Published | None:
        return next(reversed(self.published.values())) if self.published else None

    def publish(self, version: int, model: torch.nn.Module) -> Published:
        state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
        published = self.node.publish_state_dict(state, self.model_id, version, self.chunk_bytes)
        self.published[version] = published
        while len(self.published) > self.keep:
            _, old = self.published.popitem(last=False)
            self.node.retire(old.digest)
            for key in [k for k in self.told_at if k[1] == old.digest]:
                del self.told_at[key]
        self.metrics.set("published_version", "Latest policy version published", version)
        return published

    def _peer_complete(self, peer: str, digest: bytes) -> None:
        """``peer`` announced every chunk of a version we told it of: that is D for it."""
        at = self.told_at.pop((peer, digest), None)
        version = next((v for v, p in self.published.items() if p.digest == digest), None)  # <= keep
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

    def tell(self, worker: PeerRecord) -> None:
        """Send the latest manifest to ``worker`` (in the background; a failure is logged)."""
        latest = self.latest
        if latest is None:
            return
        key = (worker.peer_id, latest.digest)
        first = key not in self.told_at  # a re-send keeps the first time: D runs from there
        if first:
            self.told_at[key] = time.monotonic()
        task = asyncio.get_running_loop().create_task(
            self._send(worker, latest.manifest_envelope, key if first else None),
            name=f"manifest to {worker.peer_id}",
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def forget(self, worker: str) -> None:
        """``worker`` left or restarted: its pending dissemination timings no longer hold."""
        for key in [k for k in self.told_at if k[0] == worker]:
            del self.told_at[key]

    async def _send(self, worker: PeerRecord, envelope: Envelope, timing: tuple[str, bytes] | None) -> None:
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
            log.warning("manifest to worker %s failed: %s", worker.peer_id, e)
            self.metrics.inc("manifest_failures", "Manifests a worker did not take")
            if timing is not None:
                self.told_at.pop(timing, None)  # not told after all: a later send times D


class WeightReceiver:
    """The worker's side: take manifests from the learner, fetch, swap in between batches."""

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
    ) -> None:
        self.node = BroadcastNode(identity, dataplane, BroadcastConfig(), on_blame=self._blamed)
        self.staleness_bound = staleness_bound
        self.policy = policy
        self.engine = engine
        self.metrics = metrics
        self.learner_id = learner_id
        self.model_lock = asyncio.Lock()
        self.receiving: dict[int, asyncio.Task[None]] = {}  # at most one at a time
        self.pending: OpenedManifest | None = None  # the newest manifest that arrived meanwhile
        self.closing = False
        self.applied: collections.OrderedDict[int, bytes] = collections.OrderedDict()  # version -> digest
        self.last_seconds: float | None = None
        self.blamed: collections.Counter[str] = collections.Counter()
        dataplane.register(Kind.WEIGHT_MANIFEST, self._on_manifest)

    def _blamed(self, blame: Blame) -> None:
        self.blamed[blame.peer] += 1
        self.metrics.inc("chunks_blamed", "Invalid weight chunks received (sender blamed)")

    def status(self) -> dict[str, Any]:
        return {
            "version": self.policy.version,
            "receiving": sorted(self.receiving),
            "pending": self.pending.version if self.pending is not None else None,
            "last_receive_s": self.last_seconds,
            "blamed": dict(self.blamed),
            "stats": vars(self.node.stats),
        }

    def set_peers(self, addresses: dict[str, str]) -> None:
        for peer, address in addresses.items():
            self.node.add_peer(peer, address)

    async def _on_manifest(self, sender: str, envelope: Envelope, message: Message) -> None:
        if self.closing:
            return None
        if sender != self.learner_id or not isinstance(message, WeightManifest):
            raise RefuseRequest("not_learner", "manifests are taken from this worker's learner only")
        try:
            opened = OpenedManifest.from_request(envelope, message)  # opened once, carried as a value
        except BroadcastError as e:
            raise RefuseRequest("bad_manifest", str(e)) from None
        if peer_id_from_key(opened.manifest.publisher_key) != self.learner_id:
            raise RefuseRequest("not_learner", "manifest not published by this worker's learner")
        version = opened.version
        if version <= self.policy.version or version in self.receiving:
            return None
        if self.receiving and version - max(self.receiving) > self.staleness_bound:
            if self.pending is not None and self.pending.version > version:
                opened, version = self.pending, self.pending.version  # out of order
            self._abandon(version)
        if self.receiving:
            # One receive at a time, plus the newest manifest waiting: receives of every version
            # the learner publishes would share our link and the learner's upload, and each would
            # arrive later than one alone (and be thrown away when a newer one lands first).
            if self.pending is None or version > self.pending.version:
                self.pending = opened
            return None
        self._start(opened)
        return None

    def _abandon(self, newer: int) -> None:
        """Drop the receives in progress: v``newer`` makes them more than S versions old."""
        for version, task in list(self.receiving.items()):
            if task.done():
                continue  # finished; its callback has not run yet
            log.warning(
                "abandoning weights v%d: v%d is more than %d versions newer",
                version,
                newer,
                self.staleness_bound,
            )
            self.metrics.inc("weights_abandoned", "Weight receives abandoned for a much newer version")
            del self.receiving[version]
            task.cancel()
        self.pending = None

    def _start(self, opened: OpenedManifest) -> None:
        task = asyncio.get_running_loop().create_task(
            self._receive(opened), name=f"weights v{opened.version}"
        )
        self.receiving[opened.version] = task
        task.add_done_callback(self._received)

    def _received(self, task: asyncio.Task[None]) -> None:
        current = [version for version, t in self.receiving.items() if t is task]
        for version in current:
            del self.receiving[version]
        if not task.cancelled() and task.exception() is not None:
            self.metrics.inc("weights_failed", "Weight versions not received")
            log.error("receiving weights failed", exc_info=task.exception())
        if not current or self.closing:
            return  # abandoned (its successor already runs) or shutting down: leave ``pending``
        pending, self.pending = self.pending, None
        if pending is not None and pending.version > self.policy.version and not self.receiving:
            self._start(pending)

    async def _receive(self, opened: OpenedManifest) -> None:
        t0 = time.monotonic()
        version, digest = opened.version, opened.digest
        applied = False
        try:
            try:
                blob = await self.node.receive(opened, timeout=RECEIVE_TIMEOUT)
            except BroadcastError as e:
                log.warning("weights v%d not received: %s", version, e)
                self.metrics.inc("weights_failed", "Weight versions not received")
                return
            state = await asyncio.to_thread(blob_to_state_dict, blob, opened.body.tensors)
            async with self.model_lock:
                if version <= self.policy.version:
                    return  # a newer one was applied meanwhile
                self.policy.model.load_state_dict(state)
                self.policy.version = version
                self.engine.update_weights(self.policy)
                applied = True
        finally:
            if not applied:  # failed, superseded or abandoned: stop holding and serving its bytes
                self.node.retire(digest)
        self.last_seconds = time.monotonic() - t0
        self.applied[version] = digest
        while len(self.applied) > 2:  # keep serving the newest two (peers may still fetch them)
            _, old = self.applied.popitem(last=False)
            self.node.retire(old)
        self.metrics.set("policy_version", "Policy version the worker generates with", version)
        self.metrics.set(
            "weights_receive_seconds", "Seconds the last version took to arrive", self.last_seconds
        )
        log.info("weights v%d applied after %.2f s", version, self.last_seconds)

    async def start(self) -> None:
        await self.node.start()

    async def close(self) -> None:
        self.closing = True
        for task in list(self.receiving.values()):
            task.cancel()
        await self.node.close()
