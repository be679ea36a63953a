"""Validate the ECHO-2 activation rule: learner utilization and cost against workers and prices.

For each number of workers (sweep 1) and each price spread (sweep 2), and several seeds, the
simulator runs a learner (T, B, S) with workers drawn from the scenario's distributions under
each policy: ``planner`` (the node's real ActivationCore), ``all`` (every worker), and fixed
baselines. Beside every measured figure it prints the formula's prediction for the same active
set: utilization ``min(1, R*T/B)``, cost per step ``sum(c_i r_i / 1000) * max(T, B/R)``.

    python simulations/echo_capacity.py [--scenario simulations/scenarios/echo_capacity.toml]
                                        [--out simulations/results/echo_capacity] [--quick]

Writes results.json and echo_capacity.png in --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

from swarmnode.sim.activation import simulate_activation
from swarmnode.sim.scenario import parse_scenario

ROOT = Path(__file__).resolve().parent


def run_point(base: dict[str, Any], seed: int, **activation: Any) -> dict[str, dict[str, Any]]:
    data = json.loads(json.dumps(base))
    data["activation"].update(activation)
    data["simulation"]["seed"] = seed
    scenario = parse_scenario(data, name="echo_capacity")
    assert scenario.activation is not None
    result = simulate_activation(scenario.activation, seed)
    return {r["policy"]: r for r in result["policies"]}


def summarize(points: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for policy in points[0]:
        runs = [p[policy] for p in points]
        out[policy] = {
            "utilization": statistics.fmean(r["utilization"] for r in runs),
            "predicted_utilization": statistics.fmean(r["predicted"]["utilization"] for r in runs),
            "cost_per_step": statistics.fmean(r["cost_per_step"] for r in runs),
            "predicted_cost_per_step": statistics.fmean(r["predicted"]["cost_per_step"] for r in runs),
            "active_workers": statistics.fmean(len(r["active_workers"]) for r in runs),
            "stale_dropped_per_step": statistics.fmean(r["stale_dropped"] / max(1, r["steps"]) for r in runs),
        }
        if "plan" in runs[0]:
            out[policy]["feasible_share"] = statistics.fmean(
                1.0 if r["plan"]["feasible"] else 0.0 for r in runs
            )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default=str(ROOT / "scenarios" / "echo_capacity.toml"))
    parser.add_argument("--out", default=str(ROOT / "results" / "echo_capacity"))
    parser.add_argument("--quick", action="store_true", help="one seed, fewer points (a smoke run)")
    args = parser.parse_args(argv)

    with open(args.scenario, "rb") as f:
        base = tomllib.load(f)
    sweep = base.pop("echo_capacity")
    seeds = sweep["seeds"][:1] if args.quick else sweep["seeds"]
    worker_counts = sweep["workers"][::3] if args.quick else sweep["workers"]
    spreads = sweep["price_spreads"][::2] if args.quick else sweep["price_spreads"]
    wall0 = time.perf_counter()

    by_workers = []
    for n in worker_counts:
        s = summarize([run_point(base, seed, workers=n) for seed in seeds])
        by_workers.append({"workers": n, **{p: v for p, v in s.items()}})
    by_spread = []
    for spread in spreads:
        price = {"distribution": "uniform", "low": 10 - spread, "high": 10 + spread}
        s = summarize(
            [run_point(base, seed, workers=sweep["spread_workers"], worker_price=price) for seed in seeds]
        )
        by_spread.append({"price_spread": spread, **s})

    act = base["activation"]
    results = {
        "need": {
            "step_seconds": act["step_seconds"],
            "batch": act["batch"],
            "staleness": act["staleness"],
            "margin": act.get("margin", 0.1),
            "required_rate": (1 + act.get("margin", 0.1)) * act["batch"] / act["step_seconds"],
        },
        "seeds": seeds,
        "by_workers": by_workers,
        "by_price_spread": by_spread,
        "wall_seconds": time.perf_counter() - wall0,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(results, out / "echo_capacity.png")
    print_tables(results)
    print(f"\nwrote {out / 'results.json'} and {out / 'echo_capacity.png'} ({results['wall_seconds']:.1f} s)")
    return 0


def print_tables(results: dict[str, Any]) -> None:
    need = results["need"]
    print(
        f"learner: T {need['step_seconds']} s, B {need['batch']}, S {need['staleness']}, "
        f"margin {need['margin']}: required rate {need['required_rate']:.2f} completions/s; "
        f"means over seeds {results['seeds']}"
    )
    print(
        "\nsweep 1: number of workers (utilization measured / predicted, cost per step measured / predicted)"
    )
    print(f"{'workers':>7} | {'planner util':>14} {'planner cost':>15} {'active':>6} | {'all util':>12} "
          f"{'all cost':>15} | {'saving':>6}")  # fmt: skip
    for row in results["by_workers"]:
        p, a = row["planner"], row["all"]
        saving = 1 - p["cost_per_step"] / a["cost_per_step"] if a["cost_per_step"] else 0.0
        print(
            f"{row['workers']:>7} | {p['utilization']:6.3f} / {p['predicted_utilization']:5.3f} "
            f"{p['cost_per_step']:7.3f} / {p['predicted_cost_per_step']:6.3f} {p['active_workers']:6.1f} | "
            f"{a['utilization']:5.3f} / {a['predicted_utilization']:5.3f} "
            f"{a['cost_per_step']:7.3f} / {a['predicted_cost_per_step']:6.3f} | {saving:6.1%}"
        )
    print("\nsweep 2: price spread (prices uniform in [10 - s, 10 + s])")
    print(f"{'spread':>6} | {'planner cost':>15} | {'all cost':>15} | {'saving':>6} | {'planner util':>12}")
    for row in results["by_price_spread"]:
        p, a = row["planner"], row["all"]
        saving = 1 - p["cost_per_step"] / a["cost_per_step"] if a["cost_per_step"] else 0.0
        print(
            f"{row['price_spread']:>6} | {p['cost_per_step']:7.3f} / {p['predicted_cost_per_step']:6.3f} | "
            f"{a['cost_per_step']:7.3f} / {a['predicted_cost_per_step']:6.3f} | {saving:6.1%} | "
            f"{p['utilization']:.3f}"
        )


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.3))
    rows = results["by_workers"]
    xs = [r["workers"] for r in rows]
    policies = [p for p in rows[0] if p != "workers"]
    for i, policy in enumerate(policies):
        c = f"C{i}"
        ax1.plot(xs, [r[policy]["utilization"] for r in rows], "o-", color=c, label=f"{policy} simulated")
        ax1.plot(
            xs, [r[policy]["predicted_utilization"] for r in rows], "x--", color=c, label=f"{policy} formula"
        )
        ax2.plot(xs, [r[policy]["cost_per_step"] for r in rows], "o-", color=c, label=f"{policy} simulated")
        ax2.plot(
            xs,
            [r[policy]["predicted_cost_per_step"] for r in rows],
            "x--",
            color=c,
            label=f"{policy} formula",
        )
    ax1.set_xlabel("workers offering")
    ax1.set_ylabel("learner utilization")
    ax1.set_ylim(0, 1.05)
    ax1.set_title("utilization vs workers")
    ax1.legend(fontsize=7)
    ax2.set_xlabel("workers offering")
    ax2.set_ylabel("cost per learner step")
    ax2.set_title("cost vs workers")
    ax2.legend(fontsize=7)
    spread_rows = results["by_price_spread"]
    sx = [r["price_spread"] for r in spread_rows]
    for i, policy in enumerate(policies):
        c = f"C{i}"
        ax3.plot(
            sx, [r[policy]["cost_per_step"] for r in spread_rows], "o-", color=c, label=f"{policy} simulated"
        )
        ax3.plot(sx, [r[policy]["predicted_cost_per_step"] for r in spread_rows], "x--", color=c,
                 label=f"{policy} formula")  # fmt: skip
    ax3.set_xlabel("price spread s (prices uniform in [10-s, 10+s])")
    ax3.set_ylabel("cost per learner step")
    ax3.set_title("cost vs price heterogeneity")
    ax3.legend(fontsize=7)
    for ax in (ax1, ax2, ax3):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
