"""Run a network-mode scenario: build the world, attach the layers, run, collect the figures.

Owns: the order of a run and the shape of ``results.json``.
Must not: parse TOML (``scenario``) or draw (``plots``).
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from swarmnode.sim.scenario import Scenario

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


@contextlib.contextmanager
def no_cyclic_collection(*, freeze: bool = False) -> Iterator[None]:
    """Python's cyclic garbage collector off for the run. The heap is every node's state (the
    cores of 10,000 nodes), and each full collection walks all of it: with it on, a 300-node
    gossip run took 1.26x as long. A run makes little cyclic garbage (a 1,000-node run peaked at
    the same memory either way).

    Everything made while it was off is in the collector's youngest generation, which its next
    collection walks whole: 3.7 s at the first allocation after a 1,000-node run (py-spy). With
    ``freeze`` (a command whose process ends after the run) those objects are frozen instead
    (``gc.freeze``): never walked again, nor at exit, and never freed before the process ends."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
        if was_enabled:
            gc.enable()


def simulate_network(scenario: Scenario, progress: Progress = _quiet) -> dict[str, Any]:
    """Run the scenario; return every figure (JSON-ready). Deterministic given the seed."""
    from swarmnode.sim.world import ADVERSARY_ROLES, HONEST, World

    wall0 = time.perf_counter()
    results: dict[str, Any] = {"scenario": scenario.name, "mode": "network", "seed": scenario.seed}
    if scenario.broadcast is not None or scenario.gossip is not None:
        world = World(scenario)
        broadcast = gossip = None
        if scenario.broadcast is not None:
            from swarmnode.sim.broadcast import BroadcastLayer

            broadcast = BroadcastLayer(world, scenario.broadcast)
            world.attach(broadcast)
        if scenario.gossip is not None:
            from swarmnode.sim.gossip import GossipLayer

            gossip = GossipLayer(world, scenario.gossip)
            world.attach(gossip)
        world.start()
        end = scenario.end_time()
        progress(f"simulating {len(world.nodes)} nodes for up to {end:g} virtual seconds")
        with no_cyclic_collection():
            world.sim.run(end)
        results["virtual_seconds"] = world.sim.now
        results["calendar_entries"] = world.sim.events_run
        results["nodes"] = {
            "initial": scenario.nodes.count,
            "total": len(world.nodes),
            "alive_at_end": len(world.alive_nodes()),
            "roles": {r: sum(1 for n in world.nodes if n.role == r) for r in (HONEST, *ADVERSARY_ROLES)},
        }
        results["churn"] = world.churn_log
        net = world.network
        results["network"] = {
            "messages": net.messages_sent,
            "lost": net.messages_lost,
            "dropped_at_down_hosts": net.messages_dropped,
            "bytes": sum(h.bytes_sent for h in net.hosts.values()),
        }
        if broadcast is not None:
            results["broadcast"] = broadcast.results()
        if gossip is not None:
            results["gossip"] = gossip.results()
    if scenario.activation is not None:
        from swarmnode.sim.activation import simulate_activation

        progress("simulating worker activation policies")
        results["activation"] = simulate_activation(scenario.activation, scenario.seed)
    results["wall_seconds"] = time.perf_counter() - wall0
    return results


def write_results(results: dict[str, Any], out_dir: Path, *, plots: bool = True) -> list[Path]:
    """``results.json`` plus (``plots``) one PNG per figure; returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "results.json"
    # A network-mode run is a pure function of its scenario and seed, and so is this file: the run's
    # wall time (printed in the summary) stays out of it, so a regenerated file is byte-identical.
    figures = {key: value for key, value in results.items() if key != "wall_seconds"}
    path.write_text(json.dumps(_finite(figures), indent=2, sort_keys=False) + "\n")
    if not plots:
        return [path]
    from swarmnode.sim.plots import plot_all

    return [path, *plot_all(results, out_dir)]


def _finite(value: Any) -> Any:
    """JSON has no inf/nan: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
