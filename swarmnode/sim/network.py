"""The modelled network: hosts with an uplink and a downlink, latency, loss, crashes.

Owns
    When a message or a bulk transfer between two hosts arrives, if at all. O(1) work per
    message: no per-flow rate recomputation, so a 1,000-host broadcast stays cheap.

Model (and its error)
    * Every host has an uplink port (``up`` bytes/s) and a downlink port (``down`` bytes/s). Each
      port is a work-conserving FIFO byte server with a ``free_at`` time.
    * A bulk transfer of ``n`` bytes from A to B is queued on both ports at once: A's uplink
      serves it during ``[max(now, A.up.free_at), +n/A.up]``, B's downlink during
      ``[max(now, B.down.free_at), +n/B.down]``; the last byte arrives when both have served it,
      plus ``latency(A, B)``. A lone transfer therefore runs at ``min(A.up, B.down)``; a fast
      uplink feeding several slow receivers serves them side by side; no port ever idles while
      bytes are queued for it, and no port ever carries more than its capacity.
    * Error against a fluid (max-min fair, TCP-like) model: the two ports are decoupled, as if
      the network buffered the bytes between them, so a transfer's bytes may leave its sender
      before its receiver's downlink is free (its completion is still the later of the two, as
      in the fluid model when one port is the bottleneck). Each port serves its transfers in
      request order (FIFO) rather than sharing fairly: a batch of transfers through one
      bottleneck port ends at the same time as under fair sharing (the makespan is exact) but
      the first of them finishes earlier and none later. The fluid lower bound of ALGORITHMS.md
      §6 therefore holds for simulated runs, since no capacity is ever exceeded; a schedule
      that leans on coupling (a sender stalled by one slow receiver while others wait) is
      simulated optimistically by at most the other port's queueing delay.
    * Latency: every host draws an access latency from ``network.latency_ms``; a link's one-way
      latency is the mean of its two ends' draws, plus ``uniform(0, jitter_ms)`` per message.
    * Loss: each message (a control message or a whole bulk transfer) is lost with probability
      ``network.loss``: the sender's port time is spent, nothing arrives, the requester's own
      timeout notices. This models a dropped connection, not TCP's packet-level loss (which only
      lowers the rate, and is better modelled as a lower bandwidth).
    * Crash or leave: a host that is down neither sends nor receives; anything addressed to it,
      or still on the wire from it when it went down, is dropped. A restarted host gets a new
      incarnation, so deliveries meant for its previous life are dropped too.

Must not
    Know what the messages mean (the drivers do).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from swarmnode.sim.engine import Simulation

MBPS = 1e6 / 8  # bytes per second in one Mbit/s


class Port:
    __slots__ = ("free_at", "rate")

    def __init__(self, rate: float) -> None:
        self.rate = rate  # bytes / second
        self.free_at = 0.0


class Host:
    __slots__ = (
        "alive",
        "bytes_received",
        "bytes_sent",
        "down",
        "incarnation",
        "index",
        "latency",
        "name",
        "up",
    )

    def __init__(self, index: int, name: str, up: float, down: float, latency: float) -> None:
        self.index = index
        self.name = name
        self.up = Port(up)
        self.down = Port(down)
        self.latency = latency  # seconds, this host's access latency
        self.alive = True
        self.incarnation = 0
        self.bytes_sent = 0
        self.bytes_received = 0


class Network:
    def __init__(self, sim: Simulation, *, loss: float = 0.0, jitter: float = 0.0) -> None:
        self.sim = sim
        self.loss = loss
        self.jitter = jitter  # seconds
        self.rng = sim.rng
        self.hosts: dict[str, Host] = {}
        self.messages_sent = 0
        self.messages_lost = 0
        self.messages_dropped = 0  # addressed to (or sent by) a host that was down

    def add_host(self, name: str, *, up: float, down: float, latency: float) -> Host:
        """``up``/``down`` in bytes per second, ``latency`` in seconds."""
        host = Host(len(self.hosts), name, up, down, latency)
        self.hosts[name] = host
        return host

    def latency(self, a: Host, b: Host) -> float:
        base = (a.latency + b.latency) / 2
        return base + self.rng.random() * self.jitter if self.jitter else base

    def down(self, host: Host) -> None:
        """The host crashed or left: what is in flight to or from it is lost."""
        host.alive = False
        host.incarnation += 1

    def up(self, host: Host) -> None:
        """The host (re)started: fresh ports, a new incarnation."""
        host.alive = True
        host.incarnation += 1
        host.up.free_at = host.down.free_at = self.sim.now

    def _lost(self) -> bool:
        return self.loss > 0 and self.rng.random() < self.loss

    def send(self, src: Host, dst: Host, fn: Callable[..., Any], *args: Any) -> None:
        """A small control message (a request, a have, a refusal): latency only, may be lost."""
        self.messages_sent += 1
        if not src.alive:
            self.messages_dropped += 1
            return
        if self._lost():
            self.messages_lost += 1
            return
        self.sim.at(
            self.sim.now + self.latency(src, dst), self._deliver, src, src.incarnation, dst, dst.incarnation,
            fn, args,
        )  # fmt: skip

    def transfer(
        self,
        src: Host,
        dst: Host,
        nbytes: int,
        fn: Callable[..., Any],
        *args: Any,
        on_sent: Callable[[], Any] | None = None,
    ) -> float:
        """Bulk bytes from ``src`` to ``dst``; ``fn(*args)`` runs at ``dst`` when the last byte
        arrives, ``on_sent()`` at ``src`` when both ports served it (when a real sender's last
        write would complete). Returns the arrival time (also when lost)."""
        self.messages_sent += 1
        now = self.sim.now
        up, down = src.up, dst.down
        up.free_at = max(now, up.free_at) + nbytes / up.rate
        down.free_at = max(now, down.free_at) + nbytes / down.rate
        sent_at = max(up.free_at, down.free_at)  # both ports served the last byte
        arrive_at = sent_at + self.latency(src, dst)
        src.bytes_sent += nbytes
        if on_sent is not None:
            self.sim.at(sent_at, self._on_sent, src, src.incarnation, on_sent)
        if not src.alive:
            self.messages_dropped += 1
        elif self._lost():
            self.messages_lost += 1
        else:
            self.sim.at(
                arrive_at, self._deliver_bulk, src, src.incarnation, dst, dst.incarnation, nbytes, fn, args
            )
        return arrive_at

    def _on_sent(self, src: Host, incarnation: int, fn: Callable[[], Any]) -> None:
        if src.alive and src.incarnation == incarnation:
            fn()

    def _deliver(
        self, src: Host, src_inc: int, dst: Host, dst_inc: int, fn: Callable[..., Any], args: tuple[Any, ...]
    ) -> None:
        if dst.alive and dst.incarnation == dst_inc:
            fn(*args)
        else:
            self.messages_dropped += 1

    def _deliver_bulk(
        self,
        src: Host,
        src_inc: int,
        dst: Host,
        dst_inc: int,
        nbytes: int,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
    ) -> None:
        # A sender that went down before the last byte arrived never finished sending it.
        if dst.alive and dst.incarnation == dst_inc and src.incarnation == src_inc:
            dst.bytes_received += nbytes
            fn(*args)
        else:
            self.messages_dropped += 1
