"""HACPO between two heterogeneous tiny models vs each trained alone (arXiv 2603.02604, ALGORITHMS.md §3).

Arms, on the same prompts every round (shared task stream), several seeds each:

- ``hacpo``: the built-in tiny Llama (hidden 128, 4 layers) and a smaller variant (hidden 96,
  3 layers) answer each prompt G = 8 times, exchange their answers through the gossip core and
  admission, and train with HACPO (GSPO on own answers + capability-weighted, importance-clipped
  loss on the other's);
- ``gspo_x2``: each model alone with twice the rollouts (G = 16): the paper's GSPO x2 baseline;
- ``gspo_x1``: each model alone with the same G = 8 (what HACPO adds at equal own rollout cost).

Reports both models' greedy held-out accuracy (200 tasks of a separate stream) at the end of
training, beside the start, and plots it over rounds. The paper reports about +3 points over
GSPO x2 on average, at half the rollout cost.

    python simulations/hacpo_pair.py --reduced     # <= 15 min on 2 cores: fewer rounds
    python simulations/hacpo_pair.py               # full: the scenarios' 300 rounds

Writes ``simulations/results/hacpo_pair/{reduced,full}.json`` and ``.png`` and each arm's
``learning.json`` under ``{reduced,full}/<arm>/``.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from learning_runs import (
    ROOT,
    cpu_per_round,
    learning_of,
    load_scenario,
    parser,
    read_results,
    recorded_wall,
    run_all,
    run_logged,
    warm_all,
    write_summary,
)

RESULTS = ROOT / "simulations" / "results" / "hacpo_pair"
REDUCED_ROUNDS = 60
FULL_ROUNDS = 300
#: arm -> (scenario file, learning overrides)
ARMS: dict[str, tuple[str, dict[str, Any]]] = {
    "hacpo": ("hacpo_pair.toml", {}),
    "gspo_x2_tiny": ("hacpo_gspo2_tiny.toml", {}),
    "gspo_x2_small": ("hacpo_gspo2_small.toml", {}),
    "gspo_x1_tiny": ("hacpo_gspo2_tiny.toml", {"group_size": 8}),
    "gspo_x1_small": ("hacpo_gspo2_small.toml", {"group_size": 8}),
}


def scenario_for(arm: str, rounds: int | None, seeds: list[int] | None) -> dict[str, Any]:
    file, overrides = ARMS[arm]
    data = load_scenario(file, rounds, seeds, eval_every=lambda r: max(1, r // 4))
    data["learning"].update(overrides)
    data["simulation"]["name"] = arm
    return data


def run_arm(arm: str, rounds: int | None, seeds: list[int] | None, out: Path) -> dict[str, Any]:
    return run_logged(arm, scenario_for(arm, rounds, seeds), out / arm)


def heldout_curves(result: dict[str, Any]) -> dict[str, list[tuple[int, float]]]:
    """model -> [(round, mean held-out accuracy over seeds)]."""
    curves: dict[str, dict[int, list[float]]] = {}
    for run in result["runs"]:
        for agent in run["agents"]:
            for r, acc in agent["heldout"].items():
                curves.setdefault(agent["model"], {}).setdefault(int(r), []).append(acc)
    return {m: sorted((r, statistics.fmean(v)) for r, v in c.items()) for m, c in curves.items()}


def plot(path: Path, curves: dict[str, dict[str, list[tuple[int, float]]]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, model in zip(axes, ("tiny", "small"), strict=True):
        for arm, by_model in curves.items():
            if model in by_model:
                xs, ys = zip(*by_model[model], strict=True)
                ax.plot(xs, ys, marker="o", label=arm.replace(f"_{model}", ""))
        ax.set_title(f"{model} model", fontsize=9)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0].set_ylabel("greedy held-out accuracy (mean over seeds)")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parser(
        __doc__, reduced_rounds=REDUCED_ROUNDS, full_rounds=FULL_ROUNDS, unit="arms", results=RESULTS
    ).parse_args(argv)
    rounds = args.rounds if args.rounds is not None else (REDUCED_ROUNDS if args.reduced else None)
    kind = "reduced" if args.reduced else "full"
    results_dir: Path = args.out
    out = results_dir / kind
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    calls = {arm: (arm, rounds, args.seeds, out) for arm in ARMS}
    if not args.summarize_only:
        warm_all([scenario_for(arm, rounds, args.seeds) for arm in ARMS], args.jobs)
    results = read_results(out, list(ARMS)) if args.summarize_only else run_all(run_arm, calls, args.jobs)
    wall = time.perf_counter() - started

    rows = []
    for arm, result in results.items():
        for model, stats in result["summary"]["by_model"].items():
            ends = stats["heldout_end_per_agent"]
            rows.append(
                {
                    "arm": arm.replace(f"_{model}", ""),
                    "model": model,
                    "heldout_start": stats["heldout_start_mean"],
                    "heldout_end_mean": stats["heldout_end_mean"],
                    "heldout_end_stdev": statistics.stdev(ends) if len(ends) > 1 else 0.0,
                    "heldout_end_per_seed": ends,
                    "total_reward_mean": stats["total_reward_mean"],
                    "rollouts_per_round": learning_of(result)["prompts_per_round"]
                    * learning_of(result)["group_size"],
                    "seconds_per_round": result["timing"]["seconds_per_round_mean"],
                    "cpu_seconds_per_round": cpu_per_round(result),
                }
            )
    scenario = learning_of(results["hacpo"])
    n_rounds, seeds = scenario["rounds"], scenario["seeds"]
    note = f"{n_rounds} rounds, not {FULL_ROUNDS}" if args.reduced else f"{n_rounds} rounds"
    print(f"HACPO pair on tiny models ({kind}: {note}; {len(seeds)} seeds {list(seeds)}; 8 prompts a round)")
    print(
        f"{'model':>6} {'arm':>8} {'own rollouts/round':>19} {'held-out start':>15} {'end (mean ± sd)':>17}"
    )
    for model in ("tiny", "small"):
        for row in (r for r in rows if r["model"] == model):
            print(
                f"{model:>6} {row['arm']:>8} {row['rollouts_per_round']:>19} {row['heldout_start']:>15.3f} "
                f"{row['heldout_end_mean']:>9.3f} ± {row['heldout_end_stdev']:.3f}"
            )
        by_arm = {r["arm"]: r["heldout_end_mean"] for r in rows if r["model"] == model}
        print(
            f"{model:>6} HACPO - GSPO x2: {100 * (by_arm['hacpo'] - by_arm['gspo_x2']):+.1f} points "
            f"(paper: about +3); HACPO - GSPO x1: {100 * (by_arm['hacpo'] - by_arm['gspo_x1']):+.1f} points"
        )
    wall, args.jobs = recorded_wall(results_dir / f"{kind}.json", wall, args.jobs, args.summarize_only)
    cpu = {arm: cpu_per_round(result) for arm, result in results.items()}
    basis = "CPU" if all(c is not None for c in cpu.values()) else "wall"
    per_round = (
        sum(c for c in cpu.values() if c is not None)
        if basis == "CPU"
        else sum(r["timing"]["seconds_per_round_mean"] for r in results.values())
    )
    full_estimate = per_round * FULL_ROUNDS * len(seeds)
    print(
        f"wall {wall:.0f} s with --jobs {args.jobs} on {os.cpu_count()} cores; {per_round:.2f} s {basis} per "
        f"round of all arms; the full version ({FULL_ROUNDS} rounds x {len(seeds)} seeds, 5 arms) "
        f"extrapolates to {full_estimate / 60:.0f} min of single-thread work ({basis} time x rounds)"
    )
    summary = {
        "kind": kind,
        "rounds": n_rounds,
        "seeds": list(seeds),
        "rows": rows,
        "wall_seconds": wall,
        "jobs": args.jobs,
        "cpu_count": os.cpu_count(),
        "machine": platform.platform(),
        "full_estimate_seconds_single_job": full_estimate,
        "full_estimate_basis": basis,
    }
    write_summary(results_dir, kind, summary, args.json)
    plot(
        results_dir / f"{kind}.png",
        {arm: heldout_curves(result) for arm, result in results.items()},
        f"HACPO pair vs alone ({kind}: {n_rounds} rounds, {len(seeds)} seeds)",
    )
    print(f"wrote {results_dir / (kind + '.json')} and {results_dir / (kind + '.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
