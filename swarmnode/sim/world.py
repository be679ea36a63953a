"""The simulated swarm: nodes (honest and adversarial) on the modelled network, and churn.

Owns
    Which nodes exist, their drawn properties (bandwidths, latency, rollout rate, price, role),
    when they join, leave (gracefully: peers are told) or crash (silently), and restarting
    crashed nodes with empty state. Protocol layers (gossip, broadcast) attach to the world and
    are told about every join and departure.

Must not
    Make protocol decisions (the sans-IO cores do, through the layers' drivers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from swarmnode.sim.engine import Simulation
from swarmnode.sim.network import MBPS, Host, Network
from swarmnode.sim.scenario import Scenario

HONEST, FORGER, SLOW, CORRUPT, SILENT, COPYCAT = "honest", "forger", "slow", "corrupt", "silent", "copycat"
ADVERSARY_ROLES = (FORGER, SLOW, CORRUPT, SILENT, COPYCAT)


@dataclass
class SimNode:
    index: int
    name: str
    host: Host
    role: str
    rollout_rate: float  # rollouts / second
    price: float  # per hour active
    joined_at: float
    down_at: float | None = None
    departures: list[tuple[float, str]] = field(default_factory=list)  # (time, "leave" | "crash")

    @property
    def alive(self) -> bool:
        return self.host.alive

    @property
    def honest(self) -> bool:
        return self.role == HONEST


class Layer(Protocol):
    """A protocol running on every node (gossip, broadcast)."""

    def on_start(self) -> None: ...
    def on_join(self, node: SimNode) -> None: ...
    def on_down(self, node: SimNode, graceful: bool) -> None: ...
    def results(self) -> dict[str, Any]: ...


class World:
    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.sim = Simulation(scenario.seed)
        self.rng = self.sim.rng
        self.network = Network(self.sim, loss=scenario.network.loss, jitter=scenario.network.jitter_ms / 1000)
        self.nodes: list[SimNode] = []
        self.layers: list[Layer] = []
        self.churn_log: list[dict[str, Any]] = []
        self._done: set[int] = set()
        self._build()

    # -- nodes ----------------------------------------------------------------------------------

    def _build(self) -> None:
        sc = self.scenario
        count = sc.nodes.count
        protected = {sc.broadcast.publisher} if sc.broadcast is not None else set()
        candidates = [i for i in range(count) if i not in protected]
        adv = sc.adversaries
        drawn = [FORGER] * adv.forgers + [SLOW] * adv.slow + [CORRUPT] * adv.corrupt + [SILENT] * adv.silent
        drawn += [COPYCAT] * adv.copycats
        roles = dict.fromkeys(range(count), HONEST)
        for role, index in zip(drawn, self.rng.sample(candidates, len(drawn)), strict=True):
            roles[index] = role
        for i in range(count):
            self._new_node(roles[i], joined_at=0.0)

    def _new_node(self, role: str, joined_at: float) -> SimNode:
        sc, rng = self.scenario, self.rng
        index = len(self.nodes)
        up = sc.network.upload_mbps.sample(rng) * MBPS
        down = sc.network.download_mbps.sample(rng) * MBPS
        if role == SLOW:
            up = min(up, sc.adversaries.slow_upload_mbps * MBPS)
        if (
            sc.broadcast is not None
            and index == sc.broadcast.publisher
            and sc.broadcast.publisher_upload_mbps
        ):
            up = sc.broadcast.publisher_upload_mbps * MBPS
        latency = sc.network.latency_ms.sample(rng) / 1000
        name = f"n{index}"
        host = self.network.add_host(name, up=up, down=down, latency=latency)
        node = SimNode(
            index=index,
            name=name,
            host=host,
            role=role,
            rollout_rate=sc.nodes.rollout_rate.sample(rng),
            price=sc.nodes.price.sample(rng),
            joined_at=joined_at,
        )
        self.nodes.append(node)
        return node

    def alive_nodes(self) -> list[SimNode]:
        return [n for n in self.nodes if n.alive]

    def node(self, name: str) -> SimNode:
        return self.nodes[int(name[1:])]

    # -- churn ----------------------------------------------------------------------------------

    def attach(self, layer: Layer) -> None:
        self.layers.append(layer)

    def layer_done(self, layer: Layer) -> None:
        """``layer`` has nothing left to measure; the run ends once every layer said so."""
        self._done.add(id(layer))
        if len(self._done) == len(self.layers):
            self.sim.stop()

    def start(self) -> None:
        for layer in self.layers:
            layer.on_start()
        ch = self.scenario.churn
        if ch.joins or ch.leaves or ch.crashes:
            self.sim.process(self._churn)

    async def _churn(self) -> None:
        ch = self.scenario.churn
        end = ch.end if ch.end is not None else self.scenario.end_time()
        plan = sorted(
            [(self.rng.uniform(ch.start, end), kind) for kind, n in
             (("join", ch.joins), ("leave", ch.leaves), ("crash", ch.crashes)) for _ in range(n)]
        )  # fmt: skip
        for t, kind in plan:
            await self.sim.sleep_until(t)
            if kind == "join":
                self.join()
            else:
                protected = self.scenario.broadcast.publisher if self.scenario.broadcast is not None else -1
                choices = [n for n in self.alive_nodes() if n.index != protected]
                if choices:
                    self.depart(self.rng.choice(choices), graceful=kind == "leave")

    def join(self) -> SimNode:
        node = self._new_node(HONEST, joined_at=self.sim.now)
        self.churn_log.append({"t": self.sim.now, "event": "join", "node": node.name})
        for layer in self.layers:
            layer.on_join(node)
        return node

    def depart(self, node: SimNode, graceful: bool) -> None:
        kind = "leave" if graceful else "crash"
        node.down_at = self.sim.now
        node.departures.append((self.sim.now, kind))
        self.churn_log.append({"t": self.sim.now, "event": kind, "node": node.name})
        self.network.down(node.host)
        for layer in self.layers:
            layer.on_down(node, graceful)
        if not graceful and self.scenario.churn.restart_after > 0:
            self.sim.after(self.scenario.churn.restart_after, self._restart, node)

    def _restart(self, node: SimNode) -> None:
        self.network.up(node.host)
        node.down_at = None
        node.joined_at = self.sim.now
        self.churn_log.append({"t": self.sim.now, "event": "restart", "node": node.name})
        for layer in self.layers:
            layer.on_join(node)
