"""Gossip in the simulator: the node's real ``GossipCore`` on every simulated node.

Owns
    A simulated driver per node (the counterpart of ``swarmnode.gossip.driver.GossipDriver``): it
    performs the core's actions over the modelled network and a modelled DHT, and feeds the
    results back as events. Also the round workload (who publishes which items when: producing
    a rollout is a modelled cost of ``1 / rollout_rate`` seconds), modelled admission (a forged
    item is always rejected, an honest one accepted, after ``admission_ms``; a signer charged
    with ``ban_after`` rejections is banned, as ``swarmnode.admit`` does; the verdict reaches the
    core through the node's own rule, ``swarmnode.gossip.intake.admission_events``) and the
    figures: per-delivery latency, per-item coverage, the cores' summed counters.

Model
    * Items carry no bytes: an item's payload is its 16-byte digest (``digest_of`` is the
      identity, so the core's own corrupt-payload check runs); its modelled size (``item_bytes``)
      is what the network carries. A corrupt node serves a payload that does not match.
    * DHT: an ``Announce`` takes effect ``dht_delay_ms`` after it is issued; a read returns every
      live record of the rounds asked, as of ``dht_delay_ms`` after it was issued. No DHT node
      churn is modelled (records survive their writer, as hivemind's replicas do).
    * Pull: the request is a control message; the server's core answers it at once (``Serve``),
      the answer is a bulk transfer of the served items' sizes; a slow sender waits
      ``slow_delay_ms`` first and has a thin uplink; a silent sender never answers (the
      client's core gives the pull up at its timeout); a copycat re-announces every digest it
      reads as its own and answers pulls with none of them (red team rt70 F1, F6).

Must not
    Decide what to pull, serve or retry (the core does) or keep payload bytes.
"""

from __future__ import annotations

import bisect
import math
import statistics
from dataclasses import dataclass
from typing import Any

from swarmnode.core.demand import announcement_bucket
from swarmnode.core.events import Digest
from swarmnode.core.rounds import round_start
from swarmnode.gossip.core import (
    RELAY_PART,
    Admit,
    Announce,
    Announced,
    GossipCore,
    GossipEvent,
    Publish,
    Pull,
    PullFailed,
    PullRequest,
    PullSucceeded,
    ReadAnnouncements,
    Serve,
)
from swarmnode.gossip.intake import admission_events
from swarmnode.sim.scenario import GossipSpec, gossip_config
from swarmnode.sim.world import (
    ADVERSARY_ROLES,
    COPYCAT,
    CORRUPT,
    FORGER,
    HONEST,
    SILENT,
    SLOW,
    SimNode,
    World,
)

COPY_BUCKETS = 2  # announcement buckets a copycat reads a sweep
REQUEST_OVERHEAD = 64  # bytes of a pull response's framing
# An announcement record as read from the DHT: its digests (32 bytes each on the wire) and about
# this much of key, owner, signature and expiry.
DIGEST_WIRE_BYTES = 32
ANNOUNCE_RECORD_OVERHEAD = 160


def _identity(payload: bytes) -> Digest:
    return payload


@dataclass
class Item:
    digest: Digest
    publisher: str
    role: str
    round: int
    published_at: float
    size: int
    accepted_by: int = 0


class GossipPeer:
    """One node's simulated gossip driver (one life of it: a restart makes a new one)."""

    def __init__(self, layer: GossipLayer, node: SimNode) -> None:
        self.layer = layer
        self.node = node
        self.sim = layer.sim
        # The demand-driven draw's key, seeded so that runs repeat (a node draws a secret one).
        key = f"{layer.key_seed}:{node.name}:{node.joined_at}".encode()
        self.core = GossipCore(layer.config, node.name, digest_of=_identity, selection_key=key)
        self.active = True
        self._poll_at = math.inf
        self._copied: dict[int, set[Digest]] = {}  # a copycat's: round -> digests it re-announces

    # -- core plumbing --------------------------------------------------------------------------

    def feed(self, events: list[GossipEvent]) -> None:
        if not self.active:
            return
        self._perform(self.core.handle_all(events, self.sim.now))
        self._reschedule()

    def _poll(self, at: float) -> None:
        if not self.active or at != self._poll_at:
            return  # superseded by an earlier timer, or this life ended
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
        admitted: list[Admit] = []
        for action in actions:
            if isinstance(action, Pull):
                self._pull(action)
            elif isinstance(action, Admit):
                if layer.instant_admission:
                    admitted.append(action)  # judged below, in this same instant
                else:
                    delay = layer.spec.admission_ms.sample(layer.rng) / 1000
                    self.sim.after(delay, self._admitted, action)
            elif isinstance(action, ReadAnnouncements):
                self.sim.after(layer.dht_delay(), self._read_done, action)
            elif isinstance(action, Announce):
                self.sim.after(layer.dht_delay(), layer.dht_store, self.node.name, action)
            # CancelPull: a late answer is ignored by the core; Retire: no payload is kept here;
            # Serve: answered inline by _on_pull_request.
        if admitted:
            self.sim.after(0.0, self._admitted_all, admitted)

    # -- actions --------------------------------------------------------------------------------

    def _read_done(self, action: ReadAnnouncements) -> None:
        if self.active:
            self.feed([*self.layer.dht_read(action, self.node.name, self.sim.now)])

    def copy_round(self, r: int) -> None:
        """A copycat's sweep, every ``read_interval`` of round ``r`` whatever its core does: it reads
        the round's records (``COPY_BUCKETS`` random buckets of them: about 128 records, enough to
        fill its record) and announces, as its own, the digests it read (one record, as full as a
        record may be). It holds none of them: its answers hold nothing."""
        c, layer = self.layer.config, self.layer
        if not self.active:
            return
        k = c.announce_buckets
        buckets = tuple(layer.rng.sample(range(k), min(COPY_BUCKETS, k))) if k > 1 else ()
        read = ReadAnnouncements((r,), (buckets,) if buckets else ())
        copied = self._copied.setdefault(r, set())
        for event in layer.dht_read(read, self.node.name, self.sim.now):
            fresh = [d for d in event.digests if d not in copied]
            copied.update(fresh[: max(0, c.max_digests_per_announcement - len(copied))])
        for old in [old for old in self._copied if old < r - 1]:
            del self._copied[old]
        if copied:
            bucket = announcement_bucket(r, self.node.name, c.announce_buckets) if buckets else None
            record = Announce(r, 0, tuple(sorted(copied)), self.sim.now + c.candidate_ttl, bucket)
            self.sim.after(layer.dht_delay(), layer.dht_store, self.node.name, record)

    def _pull(self, action: Pull) -> None:
        server = self.layer.peers.get(action.peer)
        net = self.layer.world.network
        if server is None:  # unknown or down: a connection error after one round trip
            target = self.layer.world.node(action.peer).host
            self.sim.after(
                2 * net.latency(self.node.host, target),
                self.feed,
                [PullFailed(action.request_id, action.peer, "unreachable", received=0)],  # nothing arrived
            )
            return
        net.send(
            self.node.host, server.node.host, server._on_pull_request, self, action.request_id, action.digests
        )

    def _on_pull_request(self, client: GossipPeer, request_id: int, digests: tuple[Digest, ...]) -> None:
        if not self.active or self.node.role == SILENT:
            return  # a silent node holds the stream open and never answers: the client times out
        served: tuple[Digest, ...] = ()
        actions = self.core.handle(PullRequest(client.node.name, digests), self.sim.now)
        rest = []
        for action in actions:
            if isinstance(action, Serve):
                served = () if self.node.role == COPYCAT else action.digests  # relays included
            else:
                rest.append(action)
        self._perform(rest)
        self._reschedule()
        items = self.layer.items
        corrupt = self.node.role == CORRUPT
        payloads = tuple((d, d[:-1] + bytes([d[-1] ^ 0xFF]) if corrupt else d) for d in served)
        nbytes = REQUEST_OVERHEAD + sum(items[d].size for d in served if d in items)
        delay = self.layer.slow_delay if self.node.role == SLOW else 0.0
        if delay:
            self.sim.after(delay, self._respond, client, request_id, payloads, nbytes)
        else:
            self._respond(client, request_id, payloads, nbytes)

    def _respond(
        self, client: GossipPeer, request_id: int, payloads: tuple[tuple[Digest, bytes], ...], nbytes: int
    ) -> None:
        if self.active:
            self.layer.count_bytes(self.node, client.node.name, nbytes)
            self.layer.world.network.transfer(
                self.node.host, client.node.host, nbytes, client._on_pull_response, request_id,
                self.node.name,
                payloads,
            )  # fmt: skip

    def _on_pull_response(
        self, request_id: int, server: str, payloads: tuple[tuple[Digest, bytes], ...]
    ) -> None:
        self.feed([PullSucceeded(request_id, server, payloads)])

    def _admitted(self, action: Admit) -> None:
        if self.active:
            self.feed(self._verdict(action))

    def _admitted_all(self, actions: list[Admit]) -> None:
        if self.active:
            self.feed([event for action in actions for event in self._verdict(action)])

    def _verdict(self, action: Admit) -> list[GossipEvent]:
        layer = self.layer
        item = layer.items.get(action.digest)
        accepted = item is not None and item.role != FORGER
        banned_until = None
        if accepted and item is not None:
            layer.record_accept(self.node, item)
        else:
            signer = item.publisher if item is not None else action.peer
            charged = layer.charge(self.node.name, signer)
            if charged >= layer.spec.ban_after:
                banned_until = self.sim.now + layer.spec.ban_seconds
        # What the verdict means to the core: the node's rule (swarmnode.gossip.intake), not a copy.
        reason = "accepted" if accepted else "forged"
        return admission_events(
            action.peer,
            action.digest,
            accepted=accepted,
            reason=reason,
            banned_until=banned_until,
            ban_on_signer=not accepted and signer != action.peer,
            sent_at=item.published_at if item is not None else None,  # no age limit modelled
            signer=item.publisher if item is not None else None,
        )

    def publish(self, item: Item) -> None:
        self.feed([Publish(item.digest, item.size)])


class GossipLayer:
    """Gossip on every node of a ``World``, plus the per-round workload and the figures."""

    def __init__(self, world: World, spec: GossipSpec) -> None:
        self.world = world
        self.spec = spec
        self.sim = world.sim
        self.rng = world.rng
        self.config = gossip_config(spec)
        self.peers: dict[str, GossipPeer] = {}
        self.items: dict[Digest, Item] = {}
        # (round, bucket) -> (owner, part) -> (digests, expiry); bucket None: a swarm without buckets
        # (round, bucket) -> (owner, part) -> (the record as every reader gets it, its expiry, its
        # bytes on the wire): one event shared by the N k / K readers of a record (the core keeps none).
        self.dht: dict[tuple[int, int | None], dict[tuple[str, int], tuple[Announced, float, int]]] = {}
        self.latencies: list[float] = []  # honest items, per accepting honest node
        self.slow_latencies: list[float] = []  # items of slow senders
        self.forged_accepted = 0
        self.slow_delay = world.scenario.adversaries.slow_delay_ms / 1000
        # admission_ms = 0: verdicts of one response go back in one batch, one calendar entry.
        self.instant_admission = spec.admission_ms.is_constant() and spec.admission_ms.median() == 0
        self._charges: dict[tuple[str, str], int] = {}
        self._item_counter = 0
        self._retired_cores: list[dict[str, int]] = []
        self.key_seed = self.rng.getrandbits(64)
        # Traffic per node: pull answers' bytes up (served) and down (received), announcement
        # records' bytes read; and per (node, round) the honest items of that round accepted by
        # the end of the next round, and the publishers a node accepted items from.
        self.bytes_up: dict[str, int] = {}
        self.bytes_down: dict[str, int] = {}
        self.bytes_down_adversarial: dict[str, int] = {}  # of bytes_down, what adversaries served
        self.announce_bytes: dict[str, int] = {}
        self.in_time: dict[tuple[str, int], int] = {}
        self.sources: dict[str, set[str]] = {}

    # -- world hooks ----------------------------------------------------------------------------

    def on_start(self) -> None:
        for node in self.world.nodes:
            self.on_join(node)
        self.sim.process(self._workload)

    def on_join(self, node: SimNode) -> None:
        peer = GossipPeer(self, node)
        self.peers[node.name] = peer
        peer.feed([])  # first poll: the first read

    def on_down(self, node: SimNode, graceful: bool) -> None:
        peer = self.peers.pop(node.name, None)
        if peer is not None:
            peer.active = False
            self._retired_cores.append(peer.core.stats.as_dict())

    # -- DHT model ------------------------------------------------------------------------------

    def dht_delay(self) -> float:
        return self.world.scenario.network.dht_delay_ms.sample(self.rng) / 1000

    def dht_store(self, owner: str, action: Announce) -> None:
        key = (action.round, action.bucket)
        record = Announced(owner, action.round, action.digests, action.bucket, action.part >= RELAY_PART)
        wire = ANNOUNCE_RECORD_OVERHEAD + len(action.digests) * DIGEST_WIRE_BYTES
        self.dht.setdefault(key, {})[(owner, action.part)] = (record, action.expires_at, wire)

    def dht_read(self, action: ReadAnnouncements, reader: str, now: float) -> list[Announced]:
        events: list[Announced] = []
        keys = (
            [(r, b) for r, buckets in zip(action.rounds, action.buckets, strict=True) for b in buckets]
            if action.buckets
            else [(r, None) for r in action.rounds]
        )
        read = 0
        for r, bucket in keys:
            for (owner, _), (record, expires_at, wire) in self.dht.get((r, bucket), {}).items():
                if owner != reader and expires_at > now:
                    events.append(record)
                    read += wire
        self.announce_bytes[reader] = self.announce_bytes.get(reader, 0) + read
        return events

    def count_bytes(self, server: SimNode, client: str, nbytes: int) -> None:
        self.bytes_up[server.name] = self.bytes_up.get(server.name, 0) + nbytes
        self.bytes_down[client] = self.bytes_down.get(client, 0) + nbytes
        if not server.honest:
            self.bytes_down_adversarial[client] = self.bytes_down_adversarial.get(client, 0) + nbytes

    def charge(self, judge: str, signer: str) -> int:
        key = (judge, signer)
        self._charges[key] = self._charges.get(key, 0) + 1
        return self._charges[key]

    # -- workload -------------------------------------------------------------------------------

    async def _workload(self) -> None:
        spec, cfg = self.spec, self.config
        for r in range(spec.rounds):
            start = round_start(r, cfg.round_seconds, cfg.epoch)
            await self.sim.sleep_until(start)
            self._prune_dht(r)
            honest = [n for n in self.world.alive_nodes() if n.role == HONEST]
            publishers = self.rng.sample(honest, min(spec.publishers, len(honest)))
            # Adversaries publish one item a round too (copycats only re-announce others').
            publishers += [n for n in self.world.alive_nodes() if n.role not in (HONEST, COPYCAT)]
            for node in self.world.alive_nodes():
                if node.role == COPYCAT:
                    for k in range(1, math.ceil(cfg.round_seconds / cfg.read_interval)):
                        self.sim.at(start + k * cfg.read_interval, self._copy_round, node, r)
            for node in publishers:
                for j in range(spec.items_per_round):
                    # Producing a rollout is a modelled cost: 1/rate seconds each, back to back.
                    self.sim.at(start + (j + 1) / node.rollout_rate, self._publish, node, r)
        # One more round for the last items to travel, then the figures are final.
        await self.sim.sleep_until(round_start(spec.rounds + 1, cfg.round_seconds, cfg.epoch))
        self.world.layer_done(self)

    def _copy_round(self, node: SimNode, r: int) -> None:
        peer = self.peers.get(node.name)
        if peer is not None and peer.node is node:
            peer.copy_round(r)

    def _publish(self, node: SimNode, r: int) -> None:
        peer = self.peers.get(node.name)
        if peer is None or peer.node is not node or not node.alive:
            return
        self._item_counter += 1
        digest = self._item_counter.to_bytes(8, "big") + node.index.to_bytes(8, "big")
        item = Item(digest, node.name, node.role, r, self.sim.now, self.spec.item_bytes)
        self.items[digest] = item
        peer.publish(item)

    def _prune_dht(self, current: int) -> None:
        for key in [key for key in self.dht if key[0] < current - self.config.keep_rounds - 2]:
            del self.dht[key]

    def record_accept(self, node: SimNode, item: Item) -> None:
        if item.role == FORGER:
            self.forged_accepted += 1
            return
        if not node.honest:
            return
        latency = self.sim.now - item.published_at
        if item.role == HONEST:
            if self.sim.now < round_start(item.round + 2, self.config.round_seconds, self.config.epoch):
                key = (node.name, item.round)
                self.in_time[key] = self.in_time.get(key, 0) + 1
            self.sources.setdefault(node.name, set()).add(item.publisher)
            item.accepted_by += 1
            self.latencies.append(latency)
        elif item.role == SLOW:
            self.slow_latencies.append(latency)

    # -- figures --------------------------------------------------------------------------------

    def results(self) -> dict[str, Any]:
        spec = self.spec
        end = self.sim.now
        last_counted = spec.rounds - spec.settle_rounds
        honest_items = [i for i in self.items.values() if i.role == HONEST and i.round < last_counted]
        coverages = []
        full = 0
        # Honest nodes up at the end, by join time: an item's eligible receivers are those that
        # joined by its publication, less its publisher (a scan of every node per item was
        # O(items x nodes): hours at 10,000 nodes publishing every round).
        joined = sorted(n.joined_at for n in self.world.nodes if n.honest and n.alive)
        alive_honest = {n.name: n.joined_at for n in self.world.nodes if n.honest and n.alive}
        for item in honest_items:
            eligible = bisect.bisect_right(joined, item.published_at)
            if alive_honest.get(item.publisher, math.inf) <= item.published_at:
                eligible -= 1
            if eligible:
                c = min(1.0, item.accepted_by / eligible)
                coverages.append(c)
                full += item.accepted_by >= eligible
        stats: dict[str, int] = {}
        for d in [*self._retired_cores, *(p.core.stats.as_dict() for p in self.peers.values())]:
            for k, v in d.items():
                stats[k] = stats.get(k, 0) + v
        lat = sorted(self.latencies)
        return {
            **self._traffic(last_counted),
            "rounds": spec.rounds,
            "round_seconds": self.config.round_seconds,
            "items_published": {
                role: sum(1 for i in self.items.values() if i.role == role)
                for role in (HONEST, *ADVERSARY_ROLES)
            },
            "items_counted": len(honest_items),
            "coverage_mean": statistics.fmean(coverages) if coverages else None,
            "coverage_min": min(coverages) if coverages else None,
            "items_fully_covered": full,
            "forged_accepted": self.forged_accepted,
            "deliveries": len(lat),
            "latency_seconds": _quantiles(lat),
            "latency_cdf": [[lat[min(len(lat) - 1, int(k * len(lat) / 100))], k / 100] for k in range(101)]
            if lat
            else [],
            "slow_sender_latency_seconds": _quantiles(sorted(self.slow_latencies)),
            "core_stats": stats,
            "end_time": end,
        }

    def _traffic(self, last_counted: int) -> dict[str, Any]:
        """Per-node traffic per round (mean, p99, max over honest nodes ever up), and, with
        ``wanted``, the share of (node, round) that obtained ``wanted`` honest items of the round in
        time (by the end of the next round), over nodes that joined before the round and are up at
        the end (a node that left or crashed meanwhile is not counted)."""
        spec, cfg = self.spec, self.config
        honest = [n for n in self.world.nodes if n.honest]
        per_round = max(spec.rounds + 1, 1)  # the workload runs one round past the last

        def spread(values: dict[str, int]) -> dict[str, float] | None:
            xs = sorted(values.get(n.name, 0) / per_round for n in honest)
            return (
                None
                if not xs
                else {"mean": statistics.fmean(xs), "p99": xs[int(0.99 * (len(xs) - 1))], "max": xs[-1]}
            )

        out: dict[str, Any] = {
            "bytes_down_per_node_round": spread(self.bytes_down),
            "bytes_up_per_node_round": spread(self.bytes_up),
            "bytes_down_from_adversaries_per_node_round": spread(self.bytes_down_adversarial),
            "announcement_bytes_per_node_round": spread(self.announce_bytes),
            "distinct_sources_per_node": statistics.fmean(len(self.sources.get(n.name, ())) for n in honest)
            if honest
            else None,
        }
        if spec.wanted:
            met = total = 0
            for r in range(last_counted):
                start = round_start(r, cfg.round_seconds, cfg.epoch)
                for n in honest:
                    if n.joined_at <= start and n.alive:
                        total += 1
                        met += self.in_time.get((n.name, r), 0) >= spec.wanted
            out["wanted"] = spec.wanted
            out["wanted_met_share"] = met / total if total else None
        return out

    def latency_samples(self) -> list[float]:
        return self.latencies


def _quantiles(sorted_values: list[float]) -> dict[str, float] | None:
    if not sorted_values:
        return None

    def q(p: float) -> float:
        return sorted_values[min(len(sorted_values) - 1, int(p * len(sorted_values)))]

    return {
        "p10": q(0.10),
        "p50": q(0.50),
        "p90": q(0.90),
        "p99": q(0.99),
        "max": sorted_values[-1],
        "mean": statistics.fmean(sorted_values),
    }
