"""A randomized adversary against the real ``ActivationCore``: honest workers, an attacker program,
and the learner's driver, on a virtual clock of whole seconds.

The driver is ``roles/learner.py``'s: every ``RECRUIT`` s all live offers go in as ``WorkerJoined``
(re-advertisements too) plus ``WorkerLeft`` for the gone ones, in one ``handle_all``; ``poll`` at
``next_deadline()``. Weights: a version every 10 s (``step_time``), the newest five kept; each worker
the core holds active that was sent an Activate is told the newest version and announces it ``D``
seconds later (``DisseminationMeasured(D, peer)``), unless the version was dropped or the worker
restarted meanwhile. A worker works from its Activate until a Deactivate or its own restart, and
only completions the core accepts (from a worker it holds active) count.

An attacker program is a list of moves ``(t, op, slot, *args)``; each slot is one live identity at
a time (``fresh`` swaps in a new one). Moves: join / re-advertise with a (rate, price, tail) claim,
leave, restart at a new address, a delivery mode, an announce delay, and a reactive policy that
watches ``status()`` (restart once proven, leave once proven and come back fresh, leave just before
``first_rollout_timeout``, re-advertise r / 2r while on trial). Red team round 18 wrote the first
version; ``test_adversary_search.py`` states the properties it checks.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from swarmnode.activation.core import (
    Activate,
    ActivationAction,
    ActivationConfig,
    ActivationCore,
    Deactivate,
    DisseminationMeasured,
    Forget,
    RolloutsReceived,
    WorkerJoined,
    WorkerLeft,
    WorkerOffer,
)

HOUR = 3600
MEASURE_FROM = 600  # property (a) is judged after a bounded delay
RECRUIT = 5  # seconds between recruit rounds
CAP_PER_BIN = 120  # 12 completions/s per 10-s bin: a learner needing 11/s cannot use more

Move = tuple[Any, ...]


@dataclass
class Outcome:
    useful: int  # accepted completions over [MEASURE_FROM, HOUR), capped per bin
    honest: int  # accepted completions from honest workers
    attacker: int
    attacker_activates: int  # non-renewal Activates to an attacker identity not already working
    honest_activates: int
    honest_deactivates: int
    identities: int


class World:
    """The learner's side and the bookkeeping of what each worker was told."""

    def __init__(self) -> None:
        self.core = ActivationCore(ActivationConfig(batch=100, staleness=4, step_time=10.0))
        self.offers: dict[str, WorkerOffer] = {}
        self.fed: set[str] = set()
        self.working: dict[str, float] = {}  # worker side: peer -> when its Activate arrived
        self.pending: list[tuple[float, str, int, int, float]] = []  # (due, peer, version, run, D)
        self.told: set[tuple[str, int, int]] = set()
        self.run_of: dict[str, int] = defaultdict(int)
        self.version = -1
        self.kept_versions: set[int] = set()
        self.delay: dict[str, float | None] = {}  # announce delay per peer (None: never)
        self.honest: set[str] = set()
        self.bins: dict[int, int] = defaultdict(int)
        self.accepted = {"honest": 0, "attacker": 0}
        self.activates = {"honest": 0, "attacker": 0}
        self.deactivates = {"honest": 0, "attacker": 0}

    def side(self, peer: str) -> str:
        return "honest" if peer in self.honest else "attacker"

    def perform(self, actions: Sequence[ActivationAction], now: float) -> None:
        for a in actions:
            if isinstance(a, Activate) and not a.renewal and a.peer not in self.working:
                self.activates[self.side(a.peer)] += 1
                self.working[a.peer] = now
            elif isinstance(a, Deactivate):
                self.deactivates[self.side(a.peer)] += 1
                self.working.pop(a.peer, None)
            elif isinstance(a, Forget):
                self.pending = [p for p in self.pending if p[1] != a.peer]

    def offer(self, offer: WorkerOffer) -> None:
        self.offers[offer.peer] = offer

    def leave(self, peer: str) -> None:
        self.offers.pop(peer, None)
        self.working.pop(peer, None)
        self.pending = [p for p in self.pending if p[1] != peer]

    def restart(self, peer: str) -> None:
        """The worker process restarted: it forgets it was active until a new Activate."""
        self.working.pop(peer, None)
        self.run_of[peer] += 1
        self.pending = [p for p in self.pending if p[1] != peer]

    def deliver(self, peer: str, count: int, now: float) -> None:
        accepted = peer in self.core.active()
        self.perform(self.core.handle(RolloutsReceived(peer, count), now), now)
        if accepted:
            self.accepted[self.side(peer)] += count
            self.bins[int(now // 10)] += count

    def tick(self, t: int) -> None:
        now = float(t)
        if t % 10 == 0:
            self.version += 1
            self.kept_versions = {v for v in self.kept_versions if v > self.version - 5} | {self.version}
        if t % RECRUIT == 0:
            events: list[Any] = [WorkerJoined(o) for o in self.offers.values()]
            events += [WorkerLeft(p) for p in self.fed if p not in self.offers]
            self.fed = set(self.offers)
            self.perform(self.core.handle_all(events, now), now)
        deadline = self.core.next_deadline()
        if deadline is not None and deadline <= now:
            self.perform(self.core.poll(now), now)
        for peer in self.core.active():
            key = (peer, self.version, self.run_of[peer])
            if peer in self.working and key not in self.told:
                self.told.add(key)
                delay = self.delay.get(peer, 1.0)
                if delay is not None:
                    self.pending.append((now + delay, peer, self.version, self.run_of[peer], delay))
        due = [p for p in self.pending if p[0] <= now]
        if due:
            self.pending = [p for p in self.pending if p[0] > now]
            for _, peer, version, run, delay in sorted(due, key=lambda p: -p[2]):
                if version in self.kept_versions and peer in self.offers and run == self.run_of[peer]:
                    self.perform(self.core.handle(DisseminationMeasured(delay, peer), now), now)

    def useful(self) -> int:
        return sum(min(self.bins.get(b, 0), CAP_PER_BIN) for b in range(MEASURE_FROM // 10, HOUR // 10))

    def proven(self, peer: str, now: float) -> bool:
        return any(w.peer == peer and w.proven for w in self.core.status(now).workers)


@dataclass
class Honest:
    """6/s at price 1 with a tail of 2 s; announces D s after being told; first delivery ``first`` s
    after its Activate (after its weights arrive, on a slow link), then its rate each second."""

    peer: str
    d: float = 1.0
    first: float = 3.0
    join: int = 0
    restarts: tuple[int, ...] = ()
    run: int = 0

    def offer(self) -> WorkerOffer:
        return WorkerOffer(self.peer, 6.0, 1.0, address=f"{self.peer}:{self.run}", gen_tail_latency=2.0)

    def step(self, world: World, t: int) -> None:
        if t == self.join:
            world.offer(self.offer())
        if t in self.restarts:
            self.run += 1
            world.restart(self.peer)
            world.offer(self.offer())
        since = world.working.get(self.peer)
        if since is not None and t + 0.5 - since >= self.first:
            world.deliver(self.peer, 6, t + 0.5)


def honest_world(name: str) -> list[Honest]:
    """The honest workers of each world: fast links (D 1 s), a newcomer, restarts, and slow links
    just outside S * T (own D 41 s + tail 2 > 40 s), whose first delivery follows their weights."""
    slow = {"d": 41.0, "first": 44.0}
    worlds = {
        "fast2": [Honest("h0"), Honest("h1")],
        "fast3": [Honest("h0"), Honest("h1"), Honest("h2")],
        "new2": [Honest("h0"), Honest("h1", join=300)],
        "rst2": [Honest("h0", restarts=(1500,)), Honest("h1", restarts=(1500,))],
        "slow2": [Honest("h0", d=41.0), Honest("h1", d=41.0)],
        "slowreal2": [Honest("h0", **slow), Honest("h1", **slow)],  # type: ignore[arg-type]
        "slowrst2": [Honest(f"h{i}", restarts=(1500,), **slow) for i in range(2)],  # type: ignore[arg-type]
        "mixed2": [Honest("h0"), Honest("h1", **slow)],  # type: ignore[arg-type]
        # Slow first deliveries (a large model's weights and first batch), round 19.
        "first60": [Honest("h0", first=60.0), Honest("h1", first=90.0)],
    }
    return worlds[name]


WORLDS = ("fast2", "fast3", "new2", "rst2", "slow2", "slowreal2", "slowrst2", "mixed2", "first60")


@dataclass
class _Slot:
    nid: int = 0
    live: bool = False
    run: int = 0
    rate: float = 1.0
    price: float = 0.0
    tail: float | None = None
    mode: tuple[Any, ...] = ("none",)
    late: float | None = 1.0
    policy: str | None = None
    owed: float = 0.0
    proven_at: int | None = None
    back_at: int | None = None
    doubled: bool = False


@dataclass
class Attacker:
    program: Sequence[Move]
    slots: dict[int, _Slot] = field(default_factory=dict)
    used: set[str] = field(default_factory=set)

    def name(self, k: int) -> str:
        return f"a{k}_{self.slots[k].nid}"

    def offer(self, world: World, k: int, rate: float | None = None) -> None:
        s, name = self.slots[k], self.name(k)
        self.used.add(name)
        world.delay[name] = s.late
        world.offer(
            WorkerOffer(name, rate or s.rate, s.price, address=f"{name}:{s.run}", gen_tail_latency=s.tail)
        )

    def apply(self, world: World, move: Move) -> None:
        op, k = move[1], move[2]
        s = self.slots.setdefault(k, _Slot())
        if op in ("join", "readv"):
            s.rate, s.price, s.tail = move[3], move[4], move[5]
            if s.live == (op == "readv"):  # a re-advertisement of a live one, or a join
                s.live = True
                self.offer(world, k)
        elif op == "leave" and s.live:
            world.leave(self.name(k))
            s.live = False
        elif op == "fresh":
            if s.live:
                world.leave(self.name(k))
            s.nid, s.run, s.live, s.proven_at = s.nid + 1, 0, True, None
            self.offer(world, k)
        elif op == "restart" and s.live:
            s.run += 1
            world.restart(self.name(k))
            self.offer(world, k)
        elif op == "deliver":
            s.mode = move[3]
        elif op == "late":
            s.late = move[3]
            world.delay[self.name(k)] = move[3]
        elif op == "policy":
            s.policy = move[3]

    def step(self, world: World, t: int, moves: Sequence[Move]) -> None:
        for move in moves:
            self.apply(world, move)
        for k, s in self.slots.items():
            name = self.name(k)
            if s.back_at == t and not s.live:
                s.live = True
                self.offer(world, k)
            if not s.live:
                continue
            proven = world.proven(name, float(t)) if s.policy in ("rwp", "lap", "c115", "ra") else False
            if proven and s.proven_at is None:
                s.proven_at = t
            since = world.working.get(name)
            if s.policy == "rwp" and proven and s.proven_at is not None and t - s.proven_at > 121:
                s.run, s.proven_at = s.run + 1, None  # restart once proven, past the take-back window
                world.restart(name)
                self.offer(world, k)
                continue
            if s.policy == "lap" and s.proven_at is not None and t - s.proven_at > 121:
                world.leave(name)  # leave once proven and come back as a fresh identity
                s.nid, s.run, s.proven_at = s.nid + 1, 0, None
                self.offer(world, k)
                continue
            if s.policy == "c115" and since is not None and t - since >= 115 and not proven:
                world.leave(name)  # leave just before first_rollout_timeout, back 5 s later
                s.live, s.back_at = False, t + 5
                continue
            if s.policy == "ra" and since is not None and t % 20 == 0 and not proven:
                s.doubled = not s.doubled
                self.offer(world, k, rate=s.rate * (2 if s.doubled else 1))
            if since is None or t + 0.7 - since < 3:
                continue
            count = 0
            if s.mode[0] == "tiny":
                count = 1 if t % s.mode[1] == 0 else 0
            elif s.mode[0] in ("real", "claim"):
                s.owed += s.mode[1] if s.mode[0] == "real" else min(s.rate, 24.0)
                count = int(s.owed)
                s.owed -= count
            elif s.mode[0] == "huge":
                count, s.mode = s.mode[1], ("tiny", 10)
            if count:
                world.deliver(name, count, t + 0.7)


def simulate(world_name: str, program: Sequence[Move]) -> Outcome:
    """One hour of ``world_name``'s honest workers beside ``program``."""
    world = World()
    honest = honest_world(world_name)
    for h in honest:
        world.honest.add(h.peer)
        world.delay[h.peer] = h.d
    attacker = Attacker(program)
    by_time: dict[int, list[Move]] = defaultdict(list)
    for move in program:
        by_time[move[0]].append(move)
    for t in range(HOUR):
        world.tick(t)
        for h in honest:
            h.step(world, t)
        attacker.step(world, t, by_time.get(t, ()))
    return Outcome(
        useful=world.useful(),
        honest=world.accepted["honest"],
        attacker=world.accepted["attacker"],
        attacker_activates=world.activates["attacker"],
        honest_activates=world.activates["honest"],
        honest_deactivates=world.deactivates["honest"],
        identities=len(attacker.used),
    )


RATES = (0.1, 0.5, 1.0, 3.0, 6.0, 12.0, 100.0, 1e6)
PRICES = (0.0, 0.0, 0.5, 1.0, 2.0)
TAILS = (None, None, 0.0, 2.0, 39.0, 45.0)
LATES = (0.0, 1.0, 1.0, 20.0, 38.0, 41.0, 49.0, None)
POLICIES = ("rwp", "lap", "c115", "ra")


def _mode(r: random.Random) -> tuple[Any, ...]:
    return r.choice(
        [
            ("none",),
            ("tiny", r.choice([1, 2, 5, 10, 30])),
            ("real", r.choice([0.1, 0.5, 1.0, 3.0, 6.0, 12.0])),
            ("claim",),
            ("huge", r.choice([50, 200, 2000])),
        ]
    )


def random_program(seed: int) -> tuple[str, list[Move]]:
    """A world and an attacker program of 1-16 slots, drawn from ``seed`` (reproducible)."""
    r = random.Random(seed)
    world = r.choice(WORLDS)
    slots = r.randint(1, 16)
    program: list[Move] = []
    for k in range(slots):
        t = r.choice([0, 0, r.randint(0, 600), r.randint(600, 3000)])
        program += [
            (t, "join", k, r.choice(RATES), r.choice(PRICES), r.choice(TAILS)),
            (t, "late", k, r.choice(LATES)),
            (t, "deliver", k, _mode(r)),
        ]
        if r.random() < 0.35:
            program.append((t, "policy", k, r.choice(POLICIES)))
    for _ in range(r.randint(0, 12)):
        t, k = r.randint(0, 3500), r.randrange(slots)
        op = r.choice(["leave", "join", "fresh", "restart", "readv", "deliver", "late", "policy"])
        if op in ("join", "readv"):
            program.append((t, op, k, r.choice(RATES), r.choice(PRICES), r.choice(TAILS)))
        elif op == "deliver":
            program.append((t, op, k, _mode(r)))
        elif op == "late":
            program.append((t, op, k, r.choice(LATES)))
        elif op == "policy":
            program.append((t, op, k, r.choice([*POLICIES, None])))
        else:
            program.append((t, op, k))
    return world, program
