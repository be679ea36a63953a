"""Scenario files for ``swarmnode simulate``: TOML in, validated typed sections out.

Owns
    The scenario schema (documented in simulations/README.md), its defaults and its error
    messages: every bad value raises ``ScenarioError`` (a ``ConfigError``, CLI exit 2) naming the
    key, e.g. ``scenario key network.loss: must be in [0, 1), got 1.5``. Unknown keys are errors
    too, so a typo never silently runs the default.

Must not
    Run anything. For ``mode = "learning"`` only ``[simulation]`` is checked here; the rest of the
    file belongs to ``swarmnode.sim.learning``, which receives the raw dict.

Distributions
    Any key documented as a distribution takes a number (a constant) or a table:
    ``{distribution = "uniform", low = 10, high = 100}``, ``{distribution = "lognormal", median = 40,
    sigma = 0.5}``, ``{distribution = "normal", mean = 1, std = 0.2}`` (clamped at ``min``, default
    0), ``{distribution = "exponential", mean = 5}``, ``{distribution = "choice", values = [10, 100],
    weights = [3, 1]}``.
"""

from __future__ import annotations

import math
import random
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from swarmnode.activation import core as act
from swarmnode.broadcast.core import BroadcastConfig
from swarmnode.errors import ConfigError
from swarmnode.gossip.core import GossipConfig

MODES = ("network", "learning")


class ScenarioError(ConfigError):
    """A scenario value is missing or invalid; the message names the key."""


# ---------------------------------------------------------------------------------------------
# Distributions


@dataclass(frozen=True)
class Dist:
    """A value drawn per node (or per message): a constant or one of a few distributions."""

    kind: str
    params: tuple[tuple[str, Any], ...] = ()

    @staticmethod
    def constant(value: float) -> Dist:
        return Dist("constant", (("value", float(value)),))

    def _p(self, name: str) -> Any:
        return dict(self.params)[name]

    def sample(self, rng: random.Random) -> float:
        k = self.kind
        if k == "constant":
            return float(self._p("value"))
        if k == "uniform":
            return rng.uniform(self._p("low"), self._p("high"))
        if k == "lognormal":
            return float(self._p("median")) * math.exp(rng.gauss(0.0, self._p("sigma")))
        if k == "normal":
            return max(float(self._p("min")), rng.gauss(self._p("mean"), self._p("std")))
        if k == "exponential":
            return rng.expovariate(1.0 / self._p("mean"))
        if k == "choice":
            return float(rng.choices(self._p("values"), weights=self._p("weights"))[0])
        raise AssertionError(k)

    def median(self) -> float:
        """A typical value, for the analytic bounds (exact for constant, lognormal, uniform)."""
        k = self.kind
        if k == "constant":
            return float(self._p("value"))
        if k == "uniform":
            return (self._p("low") + self._p("high")) / 2
        if k == "lognormal":
            return float(self._p("median"))
        if k == "normal":
            return max(float(self._p("min")), float(self._p("mean")))
        if k == "exponential":
            return float(self._p("mean")) * math.log(2)
        values = sorted(zip(self._p("values"), self._p("weights"), strict=True))
        half, acc = sum(w for _, w in values) / 2, 0.0
        for v, w in values:
            acc += w
            if acc >= half:
                return float(v)
        return float(values[-1][0])

    def is_constant(self) -> bool:
        return self.kind == "constant"


_DIST_PARAMS: dict[str, tuple[str, ...]] = {
    "uniform": ("low", "high"),
    "lognormal": ("median", "sigma"),
    "normal": ("mean", "std", "min"),
    "exponential": ("mean",),
    "choice": ("values", "weights"),
}


# ---------------------------------------------------------------------------------------------
# A reader that remembers which keys were used, so leftovers can be reported as unknown.


class _Table:
    def __init__(self, data: Mapping[str, Any], where: str) -> None:
        if not isinstance(data, Mapping):
            raise ScenarioError(f"scenario key {where}: must be a table, got {data!r}")
        self.data = dict(data)
        self.where = where
        self.used: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def has(self, name: str) -> bool:
        return name in self.data

    def raw(self, name: str, default: Any = None) -> Any:
        self.used.add(name)
        return self.data.get(name, default)

    def number(
        self,
        name: str,
        default: float | None = None,
        *,
        lo: float | None = None,
        hi: float | None = None,
        lo_open: bool = False,
        hi_open: bool = False,
        required: bool = False,
    ) -> float:
        self.used.add(name)
        if name not in self.data:
            if required or default is None:
                raise ScenarioError(f"scenario key {self.key(name)}: required")
            return float(default)
        value = self.data[name]
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ScenarioError(f"scenario key {self.key(name)}: must be a finite number, got {value!r}")
        _check_range(self.key(name), float(value), lo, hi, lo_open, hi_open)
        return float(value)

    def integer(
        self, name: str, default: int | None = None, *, lo: int | None = None, hi: int | None = None
    ) -> int:
        self.used.add(name)
        if name not in self.data:
            if default is None:
                raise ScenarioError(f"scenario key {self.key(name)}: required")
            return default
        value = self.data[name]
        if isinstance(value, bool) or not isinstance(value, int):
            raise ScenarioError(f"scenario key {self.key(name)}: must be an integer, got {value!r}")
        _check_range(self.key(name), value, lo, hi, False, False)
        return value

    def string(self, name: str, default: str | None = None, *, choices: tuple[str, ...] = ()) -> str:
        self.used.add(name)
        if name not in self.data:
            if default is None:
                raise ScenarioError(
                    f"scenario key {self.key(name)}: required"
                    + (f" (one of {', '.join(choices)})" if choices else "")
                )
            return default
        value = self.data[name]
        if not isinstance(value, str):
            raise ScenarioError(f"scenario key {self.key(name)}: must be a string, got {value!r}")
        if choices and value not in choices:
            raise ScenarioError(
                f"scenario key {self.key(name)}: must be one of {', '.join(choices)}, got {value!r}"
            )
        return value

    def dist(self, name: str, default: float, *, positive: bool = True, allow_zero: bool = False) -> Dist:
        """A distribution of values; ``positive`` checks every value it can produce is > 0 (or
        >= 0 with ``allow_zero``)."""
        self.used.add(name)
        key = self.key(name)
        if name not in self.data:
            return Dist.constant(default)
        value = self.data[name]
        if isinstance(value, int | float) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise ScenarioError(f"scenario key {key}: must be finite, got {value!r}")
            if positive:
                _check_range(key, float(value), 0.0, None, not allow_zero, False)
            return Dist.constant(float(value))
        table = _Table(value, key)
        kind = table.string("distribution", choices=tuple(_DIST_PARAMS))
        params: dict[str, Any] = {}
        if kind == "choice":
            values = table.raw("values")
            if not isinstance(values, list) or not values or not all(_is_num(v) for v in values):
                raise ScenarioError(f"scenario key {key}.values: must be a non-empty list of numbers")
            weights = table.raw("weights", [1.0] * len(values))
            if (
                not isinstance(weights, list)
                or len(weights) != len(values)
                or not all(_is_num(w) and w >= 0 for w in weights)
                or sum(weights) <= 0
            ):
                raise ScenarioError(
                    f"scenario key {key}.weights: must be {len(values)} non-negative numbers, not all 0"
                )
            if positive and any(v < 0 or (v == 0 and not allow_zero) for v in values):
                raise ScenarioError(f"scenario key {key}.values: every value must be > 0, got {values}")
            params = {"values": [float(v) for v in values], "weights": [float(w) for w in weights]}
        elif kind == "uniform":
            low = table.number("low", required=True, lo=0.0 if positive else None)
            high = table.number("high", required=True)
            if high < low:
                raise ScenarioError(f"scenario key {key}.high: must be >= low ({low}), got {high}")
            if positive and low == 0 and not allow_zero:
                raise ScenarioError(f"scenario key {key}.low: must be > 0")
            params = {"low": low, "high": high}
        elif kind == "lognormal":
            params = {
                "median": table.number("median", required=True, lo=0.0, lo_open=True),
                "sigma": table.number("sigma", required=True, lo=0.0),
            }
        elif kind == "normal":
            lo_min = 0.0 if positive else -math.inf
            params = {
                "mean": table.number("mean", required=True),
                "std": table.number("std", required=True, lo=0.0),
                "min": table.number("min", 1e-9 if positive and not allow_zero else 0.0, lo=lo_min),
            }
            if positive and not allow_zero and params["min"] <= 0:
                raise ScenarioError(f"scenario key {key}.min: must be > 0")
        elif kind == "exponential":
            params = {"mean": table.number("mean", required=True, lo=0.0, lo_open=True)}
        table.done()
        return Dist(kind, tuple(params.items()))

    def sub(self, name: str) -> _Table:
        self.used.add(name)
        return _Table(self.data.get(name, {}), self.key(name))

    def done(self) -> None:
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            raise ScenarioError(f"scenario key {self.key(unknown[0])}: unknown key")


def _is_num(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _check_range(
    key: str, value: float, lo: float | None, hi: float | None, lo_open: bool, hi_open: bool
) -> None:
    if lo is not None and (value < lo or (lo_open and value == lo)):
        raise ScenarioError(f"scenario key {key}: must be {'>' if lo_open else '>='} {lo:g}, got {value!r}")
    if hi is not None and (value > hi or (hi_open and value == hi)):
        raise ScenarioError(f"scenario key {key}: must be {'<' if hi_open else '<='} {hi:g}, got {value!r}")


# ---------------------------------------------------------------------------------------------
# Sections


@dataclass(frozen=True)
class NetworkSpec:
    upload_mbps: Dist = field(default_factory=lambda: Dist.constant(100.0))
    download_mbps: Dist = field(default_factory=lambda: Dist.constant(100.0))
    latency_ms: Dist = field(default_factory=lambda: Dist.constant(20.0))  # per node; link = mean of ends
    jitter_ms: float = 0.0
    loss: float = 0.0
    dht_delay_ms: Dist = field(default_factory=lambda: Dist.constant(50.0))


@dataclass(frozen=True)
class NodesSpec:
    count: int = 10
    rollout_rate: Dist = field(default_factory=lambda: Dist.constant(1.0))  # rollouts / second
    price: Dist = field(default_factory=lambda: Dist.constant(1.0))  # per hour active


@dataclass(frozen=True)
class ChurnSpec:
    joins: int = 0
    leaves: int = 0
    crashes: int = 0
    start: float = 0.0
    end: float | None = None  # None: the simulation's duration
    restart_after: float = 0.0  # a crashed node comes back (empty state) after this; 0 = never


@dataclass(frozen=True)
class AdversarySpec:
    forgers: int = 0
    slow: int = 0
    corrupt: int = 0
    silent: int = 0  # announce (gossip) and accept requests, never answer them
    copycats: int = 0  # gossip: re-announce others' digests as their own, answer pulls with nothing
    slow_upload_mbps: float = 1.0
    slow_delay_ms: float = 0.0


@dataclass(frozen=True)
class BroadcastSpec:
    bytes: int
    chunk_bytes: int
    publisher: int = 0
    publisher_upload_mbps: float | None = None
    start: float = 0.0
    neighbors: int = 8
    core: Mapping[str, Any] = field(default_factory=dict)  # BroadcastConfig fields


@dataclass(frozen=True)
class GossipSpec:
    rounds: int
    round_seconds: float = 30.0
    publishers: int = 1  # honest nodes publishing each round (chosen afresh per round, seeded)
    items_per_round: int = 1  # per publisher (and per forger)
    item_bytes: int = 65536
    admission_ms: Dist = field(default_factory=lambda: Dist.constant(5.0))
    ban_after: int = 3  # rejections charged to a signer before admission bans it
    ban_seconds: float = 600.0
    settle_rounds: int = 1  # items of the last rounds are not counted in coverage (still travelling)
    # Items of a round each node needs (a trainer's J external groups, as batches): the results
    # give the share of (node, round) that obtained at least this many of the round's honest
    # items by the end of the next round. 0: not reported.
    wanted: int = 0
    core: Mapping[str, Any] = field(default_factory=dict)  # GossipConfig fields


@dataclass(frozen=True)
class ActivationSpec:
    workers: int
    worker_rate: Dist  # rollouts / second per worker
    worker_price: Dist  # per hour active
    step_seconds: float  # T
    batch: int  # B
    staleness: int  # S, in learner versions
    margin: float = 0.1
    broadcast_seconds: float = 0.0  # D: weights dissemination delay to a worker
    rollout_latency_ms: float = 50.0  # a finished rollout's trip to the learner
    rate_noise: float = 0.0  # coefficient of variation of a worker's per-rollout time
    steps: int = 200
    policies: tuple[str, ...] = ("planner", "all")
    core: Mapping[str, Any] = field(default_factory=dict)  # ActivationCore config fields


@dataclass(frozen=True)
class Scenario:
    mode: str
    name: str
    seed: int
    duration: float | None
    network: NetworkSpec
    nodes: NodesSpec
    churn: ChurnSpec
    adversaries: AdversarySpec
    broadcast: BroadcastSpec | None
    gossip: GossipSpec | None
    activation: ActivationSpec | None
    raw: Mapping[str, Any]

    def end_time(self) -> float:
        """Virtual seconds to run: ``[simulation] duration``, else long enough for the workload."""
        if self.duration is not None:
            return self.duration
        end = 0.0
        if self.gossip is not None:
            end = max(end, (self.gossip.rounds + 1) * self.gossip.round_seconds)
        if self.broadcast is not None:
            end = max(end, self.broadcast.start + 3600.0)  # ends early once every node completed
        return end if end > 0 else 3600.0


SECTIONS = ("simulation", "network", "nodes", "churn", "adversaries", "broadcast", "gossip", "activation")
POLICY_NAMES = ("planner", "all", "cheapest", "fastest", "random")


def _policy(key: str, value: object) -> str:
    if not isinstance(value, str):
        raise ScenarioError(f"scenario key {key}: policies are strings, got {value!r}")
    name, _, k = value.partition(":")
    if name not in POLICY_NAMES:
        raise ScenarioError(
            f"scenario key {key}: unknown policy {value!r} (planner, all, cheapest:K, fastest:K, random:K)"
        )
    if name in ("planner", "all") and k:
        raise ScenarioError(f"scenario key {key}: policy {name!r} takes no count, got {value!r}")
    if name in ("cheapest", "fastest", "random") and not (k.isdigit() and int(k) >= 1):
        raise ScenarioError(
            f"scenario key {key}: policy {name!r} needs a count, e.g. '{name}:4', got {value!r}"
        )
    return value


def parse_scenario(data: Mapping[str, Any], name: str = "scenario") -> Scenario:
    """Validate a scenario dict (as read from TOML)."""
    top = _Table(data, "")
    sim = top.sub("simulation")
    mode = sim.string("mode", choices=MODES)
    seed = sim.integer("seed", 0, lo=0)
    duration = sim.number("duration", lo=0.0, lo_open=True) if sim.has("duration") else None
    scenario_name = sim.string("name", name)
    if mode == "learning":
        # The rest of the file is the learning mode's; it validates its own keys.
        return Scenario(
            mode, scenario_name, seed, duration, NetworkSpec(), NodesSpec(), ChurnSpec(),
            AdversarySpec(), None, None, None, data,
        )  # fmt: skip
    sim.done()

    net = top.sub("network")
    network = NetworkSpec(
        upload_mbps=net.dist("upload_mbps", 100.0),
        download_mbps=net.dist("download_mbps", 100.0),
        latency_ms=net.dist("latency_ms", 20.0, allow_zero=True),
        jitter_ms=net.number("jitter_ms", 0.0, lo=0.0),
        loss=net.number("loss", 0.0, lo=0.0, hi=1.0, hi_open=True),
        dht_delay_ms=net.dist("dht_delay_ms", 50.0, allow_zero=True),
    )
    net.done()

    nd = top.sub("nodes")
    nodes = NodesSpec(
        count=nd.integer("count", 10, lo=1),
        rollout_rate=nd.dist("rollout_rate", 1.0),
        price=nd.dist("price", 1.0, allow_zero=True),
    )
    nd.done()

    ch = top.sub("churn")
    churn = ChurnSpec(
        joins=ch.integer("joins", 0, lo=0),
        leaves=ch.integer("leaves", 0, lo=0),
        crashes=ch.integer("crashes", 0, lo=0),
        start=ch.number("start", 0.0, lo=0.0),
        end=ch.number("end", lo=0.0) if ch.has("end") else None,
        restart_after=ch.number("restart_after", 0.0, lo=0.0),
    )
    ch.done()
    if churn.end is not None and churn.end < churn.start:
        raise ScenarioError(
            f"scenario key churn.end: must be >= churn.start ({churn.start}), got {churn.end}"
        )
    if churn.leaves + churn.crashes > nodes.count:
        raise ScenarioError(
            f"scenario key churn.leaves: leaves + crashes ({churn.leaves + churn.crashes}) exceed "
            f"nodes.count ({nodes.count})"
        )

    ad = top.sub("adversaries")
    adversaries = AdversarySpec(
        forgers=ad.integer("forgers", 0, lo=0),
        slow=ad.integer("slow", 0, lo=0),
        corrupt=ad.integer("corrupt", 0, lo=0),
        silent=ad.integer("silent", 0, lo=0),
        copycats=ad.integer("copycats", 0, lo=0),
        slow_upload_mbps=ad.number("slow_upload_mbps", 1.0, lo=0.0, lo_open=True),
        slow_delay_ms=ad.number("slow_delay_ms", 0.0, lo=0.0),
    )
    ad.done()
    a = adversaries
    bad = a.forgers + a.slow + a.corrupt + a.silent + a.copycats
    if bad >= nodes.count:
        raise ScenarioError(
            f"scenario key adversaries: forgers + slow + corrupt + silent + copycats ({bad}) must be "
            f"fewer than nodes.count ({nodes.count}): at least one node must be honest"
        )

    broadcast = None
    if top.has("broadcast"):
        bc = top.sub("broadcast")
        broadcast = BroadcastSpec(
            bytes=bc.integer("bytes", lo=1),
            chunk_bytes=bc.integer("chunk_bytes", lo=1),
            publisher=bc.integer("publisher", 0, lo=0, hi=nodes.count - 1),
            publisher_upload_mbps=(
                bc.number("publisher_upload_mbps", lo=0.0, lo_open=True)
                if bc.has("publisher_upload_mbps")
                else None
            ),
            start=bc.number("start", 0.0, lo=0.0),
            neighbors=bc.integer("neighbors", 8, lo=1),
            core=dict(bc.sub("core").data),
        )
        bc.done()

    gossip = None
    if top.has("gossip"):
        gs = top.sub("gossip")
        gossip = GossipSpec(
            rounds=gs.integer("rounds", lo=1),
            round_seconds=gs.number("round_seconds", 30.0, lo=0.0, lo_open=True),
            publishers=gs.integer("publishers", 1, lo=0),
            items_per_round=gs.integer("items_per_round", 1, lo=1),
            item_bytes=gs.integer("item_bytes", 65536, lo=1),
            admission_ms=gs.dist("admission_ms", 5.0, allow_zero=True),
            ban_after=gs.integer("ban_after", 3, lo=1),
            ban_seconds=gs.number("ban_seconds", 600.0, lo=0.0),
            settle_rounds=gs.integer("settle_rounds", 1, lo=0),
            wanted=gs.integer("wanted", 0, lo=0),
            core=dict(gs.sub("core").data),
        )
        gs.done()
        if gossip.publishers > nodes.count:
            raise ScenarioError(
                f"scenario key gossip.publishers: {gossip.publishers} exceeds nodes.count ({nodes.count})"
            )

    activation = None
    if top.has("activation"):
        ac = top.sub("activation")
        policies = ac.raw("policies", ["planner", "all"])
        if not isinstance(policies, list) or not policies:
            raise ScenarioError("scenario key activation.policies: must be a non-empty list of strings")
        activation = ActivationSpec(
            workers=ac.integer("workers", lo=1),
            worker_rate=ac.dist("worker_rate", 1.0),
            worker_price=ac.dist("worker_price", 1.0, allow_zero=True),
            step_seconds=ac.number("step_seconds", lo=0.0, lo_open=True, required=True),
            batch=ac.integer("batch", lo=1),
            staleness=ac.integer("staleness", lo=0),
            margin=ac.number("margin", 0.1, lo=0.0),
            broadcast_seconds=ac.number("broadcast_seconds", 0.0, lo=0.0),
            rollout_latency_ms=ac.number("rollout_latency_ms", 50.0, lo=0.0),
            rate_noise=ac.number("rate_noise", 0.0, lo=0.0, hi=2.0),
            steps=ac.integer("steps", 200, lo=1),
            policies=tuple(_policy(f"activation.policies[{i}]", p) for i, p in enumerate(policies)),
            core=dict(ac.sub("core").data),
        )
        ac.done()

    top.done()
    _check_cores(broadcast, gossip, activation)
    if broadcast is None and gossip is None and activation is None:
        raise ScenarioError(
            "scenario: a network-mode scenario needs at least one of [broadcast], [gossip], [activation]"
        )
    return Scenario(
        mode, scenario_name, seed, duration, network, nodes, churn, adversaries, broadcast, gossip,
        activation, data,
    )  # fmt: skip


# The core configuration each [x.core] table names: built while parsing, so a bad value fails
# before anything runs; the layers build their cores from these same functions.
def broadcast_config(spec: BroadcastSpec) -> BroadcastConfig:
    known = {f.name for f in fields(BroadcastConfig)}
    for key in spec.core:
        if key not in known:
            raise ScenarioError(f"scenario key broadcast.core.{key}: unknown key (see BroadcastConfig)")
    try:
        return BroadcastConfig(**spec.core)
    except (ConfigError, TypeError) as exc:
        raise ScenarioError(f"scenario key broadcast.core: {exc}") from exc


def gossip_config(spec: GossipSpec) -> GossipConfig:
    known = {f.name for f in fields(GossipConfig)}
    for key in spec.core:
        if key not in known:
            raise ScenarioError(f"scenario key gossip.core.{key}: unknown key (see GossipConfig)")
    if "round_seconds" in spec.core:
        raise ScenarioError("scenario key gossip.core.round_seconds: set gossip.round_seconds instead")
    try:
        return GossipConfig(**{"round_seconds": spec.round_seconds, **spec.core})
    except ConfigError as exc:
        raise ScenarioError(f"scenario key gossip.core: {exc}") from exc
    except TypeError as exc:
        raise ScenarioError(f"scenario key gossip.core: {exc}") from exc


def activation_config(spec: ActivationSpec) -> act.ActivationConfig:
    known = {f.name for f in fields(act.ActivationConfig)}
    for key in spec.core:
        if key not in known:
            raise ScenarioError(f"scenario key activation.core.{key}: unknown key (see ActivationConfig)")
    base = {
        "batch": spec.batch,
        "staleness": spec.staleness,
        "step_time": spec.step_seconds,
        "dissemination": spec.broadcast_seconds,
        "margin": spec.margin,
    }
    try:
        return act.ActivationConfig(**{**base, **spec.core})
    except (ConfigError, TypeError) as exc:
        raise ScenarioError(f"scenario key activation.core: {exc}") from exc


def _check_cores(
    broadcast: BroadcastSpec | None, gossip: GossipSpec | None, activation: ActivationSpec | None
) -> None:
    """Build each core's config now, so a bad ``[x.core]`` value fails before anything runs."""
    if broadcast is not None:
        broadcast_config(broadcast)
    if gossip is not None:
        gossip_config(gossip)
    if activation is not None:
        activation_config(activation)


def read_scenario_dict(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError as exc:
        raise ScenarioError(f"scenario file {path} does not exist") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"scenario file {path} is not valid TOML: {exc}") from exc
    except OSError as exc:
        raise ScenarioError(f"cannot read scenario file {path}: {exc}") from exc


def load_scenario(path: Path) -> Scenario:
    return parse_scenario(read_scenario_dict(path), name=path.stem)
