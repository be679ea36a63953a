"""``swarmnode simulate SCENARIO.toml``: run a scenario, write results.json and PNGs.

Owns: the ``simulate`` sub-command's flags and its dispatch on ``[simulation] mode``.
Must not: know the scenario schema (``scenario``) or simulate anything itself.

Exit codes: 0 ok, 2 a bad scenario (the message names the key), 1 a runtime error.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any

from swarmnode.errors import ConfigError, SwarmError

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


def add_simulate_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "simulate",
        help="run a simulation scenario (network: virtual-time swarm; learning: tiny-model learners)",
    )
    p.add_argument("scenario", help="scenario TOML file (see simulations/README.md)")
    p.add_argument(
        "--out",
        help="output directory (default simulations/results/<scenario name>)",
    )
    p.add_argument("--seed", type=int, help="override [simulation] seed")
    p.add_argument("--no-plots", action="store_true", help="write results.json only")
    p.set_defaults(handler=main)
    return p


def _progress(message: str) -> None:
    print(f"simulate: {message}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from swarmnode.sim.scenario import ScenarioError, parse_scenario, read_scenario_dict

    path = Path(args.scenario)
    data = read_scenario_dict(path)
    if args.seed is not None:
        if args.seed < 0:
            raise ScenarioError(f"--seed must be >= 0, got {args.seed}")
        data.setdefault("simulation", {})
        if not isinstance(data["simulation"], dict):
            raise ScenarioError("scenario key simulation: must be a table")
        data["simulation"]["seed"] = args.seed
    scenario = parse_scenario(data, name=path.stem)
    out_dir = Path(args.out) if args.out else Path("simulations/results") / scenario.name
    if scenario.mode == "learning":
        try:
            learning = importlib.import_module("swarmnode.sim.learning")
        except ModuleNotFoundError as exc:
            if exc.name != "swarmnode.sim.learning":
                raise
            raise SwarmError(
                "learning mode is not available in this build (swarmnode.sim.learning is missing)"
            ) from exc
        run_learning = getattr(learning, "run_learning", None)
        if run_learning is None:
            raise SwarmError("learning mode is not available: swarmnode.sim.learning has no run_learning()")
        results = run_learning(data, out_dir, _progress)
        _progress(f"results in {out_dir}")
        print(_summary(results))
        return EXIT_OK

    from swarmnode.sim.run import no_cyclic_collection, simulate_network, write_results

    # Through the writing too, and frozen after: the process ends here, so the world's objects are
    # never walked by the collector (its first collection after the run walked them all: 3.7 s of a
    # 1,000-node run, ~23 s of a 10,000-node one).
    with no_cyclic_collection(freeze=True):
        results = simulate_network(scenario, _progress)
        written = write_results(results, out_dir, plots=not args.no_plots)
    for path_written in written:
        _progress(f"wrote {path_written}")
    print(_summary(results))
    return EXIT_OK


def _summary(results: Any) -> str:
    if not isinstance(results, dict):
        return ""
    lines = [f"scenario {results.get('scenario', '?')}: wall {results.get('wall_seconds', 0):.1f} s"]
    b = results.get("broadcast")
    if b:
        c, bounds = b["completion_seconds"], b["bounds_seconds"]
        last = "-" if c["last"] is None else f"{c['last']:.1f} s"
        lines.append(
            f"  broadcast: {b['receivers_completed']}/{b['receivers_alive']} receivers complete, "
            f"last {last}; "
            f"fluid bound {bounds['fluid']:.1f} s, chain {bounds['chain']:.1f} s, star {bounds['star']:.1f} s"
        )
    g = results.get("gossip")
    if g:
        q = g.get("latency_seconds") or {}
        cov = g.get("coverage_mean")
        lines.append(
            f"  gossip: {g['deliveries']} deliveries, latency p50 {q.get('p50', float('nan')):.2f} s "
            f"p99 {q.get('p99', float('nan')):.2f} s, coverage "
            + ("-" if cov is None else f"{cov:.1%}")
            + f", forged accepted {g['forged_accepted']}"
        )
    a = results.get("activation")
    if a:
        for r in a["policies"]:
            lines.append(
                f"  activation {r['policy']:>12}: utilization {r['utilization']:.3f} "
                f"(predicted {r['predicted']['utilization']:.3f}), cost/step {r['cost_per_step']:.4g} "
                f"(predicted {r['predicted']['cost_per_step']:.4g})"
            )
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """Entry point for the ``simulate`` sub-command; errors become messages and exit codes."""
    try:
        return run(args)
    except ConfigError as exc:
        print(f"swarmnode simulate: scenario error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SwarmError as exc:
        print(f"swarmnode simulate: {exc}", file=sys.stderr)
        return EXIT_ERROR
