"""Weight broadcast in the simulator: the node's real ``BroadcastCore`` on every simulated node, and the
worker's real ``ReceiverCore`` on every receiver.

Owns
    A simulated driver per node: performs the broadcast core's actions (``Fetch`` as a control message,
    ``Upload`` as a bulk transfer on the modelled network, ``Have`` to overlay neighbours,
    ``Refuse`` as a control message) and feeds back ``ChunkRequested``, ``ChunkReceived``,
    ``FetchFailed``, ``UploadFinished``, ``PeerHave`` and ``PeerLeft``; on a receiver, feeds each
    manifest to its ``ReceiverCore`` (the one ``WeightReceiver`` drives in a worker) and performs its
    actions (``StartReceive`` as ``ManifestAccepted``, ``Release`` as ``Retire``, ``Install`` at
    once), reporting ``Completed`` as ``ReceiveComplete``; the overlay (each node
    links to ``neighbors`` random others, links are symmetric; a node that loses a neighbour
    links to a new one); completion times; and the analytic bounds of ALGORITHMS.md §6.

Model
    No chunk bytes exist: a chunk is its length on the wire and a validity bit (a corrupt node
    serves chunks whose driver-side hash check fails; a silent one never answers a request).
    The signed manifest reaches each node ``dht_delay_ms`` after the broadcast starts (or after
    it joins). Every node knows the publisher (it signs the manifest), so every node may fetch
    from it; relays are the overlay
    neighbours, who tell each other what they hold (``Have``), and a newly linked pair swaps
    full ``holding`` sets. By default one version is broadcast; ``later_versions`` (seconds after
    the start) publishes more, each manifest reaching every receiver after its own DHT delay, so
    a newer manifest can land mid-broadcast: a receiver is complete once it installed the last.

Must not
    Decide which chunk to fetch from whom or what to serve (the core does).
"""

from __future__ import annotations

import functools
import math
from typing import Any

from swarmnode.broadcast.core import (
    Blame,
    BroadcastCore,
    ChunkLayout,
    ChunkReceived,
    ChunkRequested,
    Completed,
    Fetch,
    FetchFailed,
    Have,
    ManifestAccepted,
    PeerHave,
    PeerLeft,
    Publish,
    Refuse,
    Retire,
    Upload,
    UploadFinished,
)
from swarmnode.broadcast.receiver import Action as ReceiverAction
from swarmnode.broadcast.receiver import (
    ChunkBlamed,
    Install,
    Installed,
    ManifestArrived,
    ReceiveComplete,
    ReceiverCore,
    Release,
    StartReceive,
)
from swarmnode.errors import ConfigError
from swarmnode.sim.scenario import BroadcastSpec, ScenarioError, broadcast_config
from swarmnode.sim.world import CORRUPT, SILENT, SimNode, World

DIGEST = b"weights-v1".ljust(32, b"\x00")
#: The receivers' staleness bound S unless the layer is given one: a newer manifest within S waits
#: for the receive in flight, one more than S newer abandons it.
STALENESS_BOUND = 2


def version_digest(version: int) -> bytes:
    """The digest naming ``version`` (0 is ``DIGEST``)."""
    return f"weights-v{version + 1}".encode().ljust(32, b"\x00")


class BroadcastPeer:
    """One node's simulated broadcast driver (one life of it)."""

    def __init__(self, layer: BroadcastLayer, node: SimNode) -> None:
        self.layer = layer
        self.node = node
        self.name = node.name
        self.sim = layer.sim
        self.core = BroadcastCore(node.name, layer.config)
        # The worker's receiver on every node but the publisher: which version to fetch and install.
        self.receiver: ReceiverCore[ChunkLayout] | None = (
            None if node.name == layer.publisher else ReceiverCore(layer.staleness_bound)
        )
        self.neighbors: dict[str, BroadcastPeer] = {}
        self.active = True
        self.started = False
        self.complete: set[bytes] = set()  # digests whose every chunk this node verified
        self._poll_at = math.inf
        self._clients: dict[int, BroadcastPeer] = {}  # request id -> requester
        self._fetch_started: dict[tuple[str, int], float] = {}

    # -- core plumbing --------------------------------------------------------------------------

    def feed(self, event: Any) -> None:
        if not self.active:
            return
        self._perform(self.core.handle(event, self.sim.now))
        self._reschedule()

    def on_manifest(self, version: int, digest: bytes) -> None:
        """The publisher's signed manifest of ``version`` reached this node."""
        if not self.active or self.receiver is None:
            return
        self._perform_receiver(self.receiver.handle(ManifestArrived(version, digest, self.layer.layout)))
        self._reschedule()

    def _perform_receiver(self, actions: list[ReceiverAction]) -> None:
        assert self.receiver is not None
        for action in actions:
            if isinstance(action, StartReceive):
                accepted = ManifestAccepted(action.digest, action.manifest, self.layer.publisher)
                self._perform(self.core.handle(accepted, self.sim.now))
            elif isinstance(action, Release):
                self._perform(self.core.handle(Retire(action.digest), self.sim.now))
            elif isinstance(action, Install):
                # Nothing to swap in the simulator: installed the moment it completes.
                self.layer.installed(self, action.version)
                self._perform_receiver(self.receiver.handle(Installed(action.version, action.digest)))
            # AbandonReceive: no task to stop here; the Release that follows retires its transfer.

    def _poll(self, at: float) -> None:
        if not self.active or at != self._poll_at:
            return
        self._poll_at = math.inf
        self._perform(self.core.poll(self.sim.now))
        self._reschedule()

    def _reschedule(self) -> None:
        deadline = self.core.next_deadline()
        if deadline is None:
            return
        deadline = max(deadline, self.sim.now)
        if deadline < self._poll_at:
            self._poll_at = deadline
            self.sim.at(deadline, self._poll, deadline)

    def _perform(self, actions: list[Any]) -> None:
        layer = self.layer
        net = layer.world.network
        for action in actions:
            if isinstance(action, Fetch):
                self._fetch_started[(action.peer, action.index)] = self.sim.now
                server = layer.peers.get(action.peer)
                if server is None:
                    target = layer.world.node(action.peer).host
                    self.sim.after(
                        2 * net.latency(self.node.host, target),
                        self.feed,
                        FetchFailed(action.peer, action.digest, action.index, "error"),
                    )
                else:
                    layer.request_ids += 1
                    net.send(
                        self.node.host, server.node.host, server._on_request, self, action.digest,
                        action.index,
                        layer.request_ids,
                    )  # fmt: skip
            elif isinstance(action, Have):
                for peer in self.neighbors.values():
                    # A neighbour holding the whole version fetches nothing more; telling it
                    # would only refine its serving order (replica counts), so the message is
                    # skipped: a quarter of all calendar entries at 1,000 nodes. The publisher
                    # is always told (super-seeding counts on it).
                    if action.digest in peer.complete and peer.name != layer.publisher:
                        continue
                    net.send(
                        self.node.host, peer.node.host, peer._on_have, self.name, action.digest, action.index
                    )
            elif isinstance(action, Upload):
                client = self._clients.pop(action.request_id, None)
                if client is None:
                    self.sim.after(0.0, self.feed, UploadFinished(action.request_id))
                    continue
                nbytes = layer.layout.length(action.index)
                valid = self.node.role != CORRUPT
                net.transfer(
                    self.node.host, client.node.host, nbytes, client._on_chunk, self.name, action.digest,
                    action.index, valid, nbytes,
                    on_sent=functools.partial(self.feed, UploadFinished(action.request_id)),
                )  # fmt: skip
            elif isinstance(action, Refuse):
                client = self._clients.pop(action.request_id, None)
                if client is not None:
                    net.send(
                        self.node.host, client.node.host, client._on_refused, self.name, action.digest,
                        action.index, action.reason,
                    )  # fmt: skip
            elif isinstance(action, Blame):
                layer.blames += 1
                if self.receiver is not None:
                    self._perform_receiver(self.receiver.handle(ChunkBlamed(action.peer)))
            elif isinstance(action, Completed):
                self.complete.add(action.digest)
                version = layer.versions.get(action.digest)
                if self.receiver is not None and version is not None:
                    self._perform_receiver(self.receiver.handle(ReceiveComplete(version, action.digest)))

    # -- messages from the network ----------------------------------------------------------------

    def _on_request(self, client: BroadcastPeer, digest: bytes, index: int, request_id: int) -> None:
        if not self.active or self.node.role == SILENT:
            return  # a silent node never answers: the client's core expires the fetch
        self._clients[request_id] = client
        self.feed(ChunkRequested(client.name, digest, index, request_id))

    def _on_have(self, peer: str, digest: bytes, index: int) -> None:
        self.feed(PeerHave(peer, digest, frozenset((index,))))

    def _on_chunk(self, server: str, digest: bytes, index: int, valid: bool, nbytes: int) -> None:
        started = self._fetch_started.pop((server, index), self.sim.now)
        self.feed(ChunkReceived(server, digest, index, valid, nbytes, max(1e-9, self.sim.now - started)))

    def _on_refused(self, server: str, digest: bytes, index: int, reason: str) -> None:
        self._fetch_started.pop((server, index), None)
        self.feed(FetchFailed(server, digest, index, reason))

    # -- overlay ----------------------------------------------------------------------------------

    def link(self, other: BroadcastPeer) -> None:
        """Connect two peers; each tells the other everything it holds (a bitfield exchange)."""
        if other is self or other.name in self.neighbors:
            return
        self.neighbors[other.name] = other
        other.neighbors[self.name] = self
        net = self.layer.world.network
        for a, b in ((self, other), (other, self)):
            for digest in self.layer.versions:
                held = a.core.holding(digest)
                if held:
                    net.send(a.node.host, b.node.host, b.feed, PeerHave(a.name, digest, frozenset(held)))


class BroadcastLayer:
    """The weight broadcast on every node of a ``World``, with its completion figures."""

    def __init__(
        self,
        world: World,
        spec: BroadcastSpec,
        *,
        later_versions: tuple[float, ...] = (),
        staleness_bound: int = STALENESS_BOUND,
    ) -> None:
        """``later_versions``: when (seconds after ``spec.start``) the publisher publishes v1, v2...;
        ``staleness_bound``: the receivers' S."""
        self.world = world
        self.spec = spec
        self.later_versions = tuple(sorted(later_versions))
        self.staleness_bound = staleness_bound
        self.final_version = len(self.later_versions)  # a receiver is complete once it installed this
        self.versions: dict[bytes, int] = {}  # published so far: digest -> version
        self.sim = world.sim
        self.rng = world.rng
        self.config = broadcast_config(spec)
        try:
            self.layout = ChunkLayout(spec.bytes, spec.chunk_bytes)
        except ConfigError as exc:
            raise ScenarioError(f"scenario key broadcast.chunk_bytes: {exc}") from exc
        self.peers: dict[str, BroadcastPeer] = {}
        self.publisher = world.nodes[spec.publisher].name
        self.completion: dict[str, float] = {}  # node -> seconds after the start
        self.request_ids = 0
        self.blames = 0
        self.started = False
        self.installed_versions: dict[str, int] = {}  # node -> the version its receiver installed last
        self._retired_stats: list[dict[str, int]] = []

    # -- world hooks ----------------------------------------------------------------------------

    def on_start(self) -> None:
        for node in self.world.nodes:
            self.peers[node.name] = BroadcastPeer(self, node)
        names = list(self.peers)
        half = max(1, self.spec.neighbors // 2)
        for name in names:
            # Symmetric links: each node opens half its degree, and accepts the rest.
            for other in self.rng.sample(names, min(half + 1, len(names))):
                if other != name and len(self.peers[name].neighbors) < self.spec.neighbors:
                    self.peers[name].link(self.peers[other])
        self.sim.at(self.spec.start, self._start)

    def _start(self) -> None:
        self.started = True
        self.versions[DIGEST] = 0
        for peer in list(self.peers.values()):
            self._begin(peer)
        for version, at in enumerate(self.later_versions, start=1):
            self.sim.at(self.spec.start + at, self._publish, version)

    @property
    def newest(self) -> tuple[int, bytes]:
        digest = next(reversed(self.versions))
        return self.versions[digest], digest

    def _begin(self, peer: BroadcastPeer) -> None:
        if peer.started or not peer.active:
            return
        peer.started = True
        version, digest = self.newest
        if peer.name == self.publisher:
            peer.feed(Publish(digest, self.layout))
        else:
            self._tell(peer, version, digest)

    def _tell(self, peer: BroadcastPeer, version: int, digest: bytes) -> None:
        """The manifest of ``version`` reaches ``peer`` after a DHT delay."""
        delay = self.world.scenario.network.dht_delay_ms.sample(self.rng) / 1000
        self.sim.after(delay, peer.on_manifest, version, digest)

    def _publish(self, version: int) -> None:
        digest = version_digest(version)
        self.versions[digest] = version
        for peer in list(self.peers.values()):
            if not (peer.started and peer.active):
                continue
            if peer.name == self.publisher:
                peer.feed(Publish(digest, self.layout))
            else:
                self._tell(peer, version, digest)

    def on_join(self, node: SimNode) -> None:
        peer = BroadcastPeer(self, node)
        self.peers[node.name] = peer
        alive = [p for p in self.peers.values() if p is not peer and p.active]
        for other in self.rng.sample(alive, min(self.spec.neighbors, len(alive))):
            peer.link(other)
        if self.started:
            self._begin(peer)

    def on_down(self, node: SimNode, graceful: bool) -> None:
        peer = self.peers.pop(node.name, None)
        if peer is None:
            return
        peer.active = False
        self._retired_stats.append(vars(peer.core.stats).copy())
        net = self.world.network
        alive = [p for p in self.peers.values() if p.active]
        for other in list(peer.neighbors.values()):
            other.neighbors.pop(peer.name, None)
            if graceful:
                net.send(peer.node.host, other.node.host, other.feed, PeerLeft(peer.name))
            # Keep the overlay connected: replace the lost link.
            if alive:
                other.link(self.rng.choice(alive))
        peer.neighbors.clear()

    def installed(self, peer: BroadcastPeer, version: int) -> None:
        """``peer``'s receiver installed ``version``; the last version completes it."""
        self.installed_versions[peer.name] = version
        if version != self.final_version or peer.name in self.completion:
            return
        self.completion[peer.name] = self.sim.now - self.spec.start
        if self._all_done():
            self.world.layer_done(self)

    def _all_done(self) -> bool:
        return all(
            p.name in self.completion for p in self.peers.values() if p.active and p.name != self.publisher
        )

    # -- figures --------------------------------------------------------------------------------

    def bounds(self) -> dict[str, float]:
        """ALGORITHMS.md §6, for this network's drawn figures."""
        spec, sc = self.spec, self.world.scenario
        m, c = float(spec.bytes), float(spec.chunk_bytes)
        k = self.layout.n_chunks
        receivers = [n for n in self.world.nodes[: sc.nodes.count] if n.name != self.publisher]
        n = max(1, len(receivers))
        pub = self.world.nodes[spec.publisher].host
        u_pub = pub.up.rate
        # B: the typical per-peer bandwidth (a peer both receives and relays).
        b = sorted(min(r.host.up.rate, r.host.down.rate) for r in receivers)[len(receivers) // 2]
        a = sc.network.latency_ms.median() / 1000
        uploads = sum(r.host.up.rate for r in receivers)
        d_min = min(r.host.down.rate for r in receivers)
        return {
            "fluid_homogeneous": m / b,
            # Kumar-Ross: no schedule beats the source's upload, the slowest download, or the
            # swarm's total upload shared by N copies.
            "fluid": max(m / u_pub, m / d_min, n * m / (u_pub + uploads)),
            "chain": (k + n - 1) * (c / b + a),
            "star": n * m / u_pub,
            "best_chain_chunk_bytes": math.sqrt(m * a * b / max(1, n - 1)),
        }

    def results(self) -> dict[str, Any]:
        sc = self.world.scenario
        receivers = [n for n in self.world.nodes if n.name != self.publisher and n.alive]
        times = sorted(self.completion[n.name] for n in receivers if n.name in self.completion)
        stats: dict[str, int] = {}
        for d in [*self._retired_stats, *(vars(p.core.stats) for p in self.peers.values())]:
            for key, v in d.items():
                stats[key] = stats.get(key, 0) + v
        results: dict[str, Any] = {
            "bytes": self.spec.bytes,
            "chunk_bytes": self.spec.chunk_bytes,
            "chunks": self.layout.n_chunks,
            "receivers_alive": len(receivers),
            "receivers_completed": len(times),
            "completion_seconds": {
                "first": times[0] if times else None,
                "median": times[len(times) // 2] if times else None,
                "last": times[-1] if times else None,
            },
            "all_completed": len(times) == len(receivers),
            "completion_times": times,
            "bounds_seconds": self.bounds(),
            "blames": self.blames,
            "core_stats": stats,
            "initial_receivers": sc.nodes.count - 1,
        }
        if self.later_versions:  # absent from single-version runs: their results stay as committed
            receiver_stats: dict[str, int] = {}
            for peer in self.peers.values():
                if peer.receiver is not None:
                    for key, v in vars(peer.receiver.stats).items():
                        if isinstance(v, int):
                            receiver_stats[key] = receiver_stats.get(key, 0) + v
            results["versions"] = {
                "published_at": [self.spec.start, *(self.spec.start + t for t in self.later_versions)],
                "final": self.final_version,
                "staleness_bound": self.staleness_bound,
                "installed": {n.name: self.installed_versions.get(n.name) for n in receivers},
                "receiver_stats": receiver_stats,
            }
        return results
