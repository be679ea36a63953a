"""SAPO's local/external ablation (arXiv 2509.08721, ALGORITHMS.md §2) on the built-in tiny model.

8 agents, each generating 8 groups (G = 8) a round and training on I local + J external groups with
I + J = 8: configurations 8/0, 6/2, 4/4, 2/6, and 4/4 with the anchored and replay rules (the
transfer rules of the specialists testbed, #14), and replay's control 8/0 replay (no exchange:
replaying only the agent's own successes), several seeds each. Learners are real (warm-started
tiny Llama, GRPO, no KL) and exchange rollouts through the gossip core and admission pipeline
(``swarmnode.sim.learning``). Prints each configuration's total reward (sum over agents and rounds
of each agent's mean reward on its own completions) and its gain over 8/0 beside the paper's, and
plots mean reward over rounds. Each gain also comes per seed (paired with 8/0 on the same seed)
with a 95% t-interval of its mean.

    python simulations/sapo_ablation.py --reduced          # <= 15 min on 2 cores: fewer rounds
    python simulations/sapo_ablation.py                    # full: the scenarios' 500 rounds
    python simulations/sapo_ablation.py --reduced --jobs 2 # configurations in parallel processes
    python simulations/sapo_ablation.py --configs "8/0,4/4 replay" --jobs 2  # some of them (8/0 first)

Writes ``simulations/results/sapo_ablation/{reduced,full}.json`` and ``.png`` and each configuration's
``learning.json`` under ``{reduced,full}/<I>_<J>/``. The scenarios are
``simulations/scenarios/sapo_<I>_<J>.toml``.
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

RESULTS = ROOT / "simulations" / "results" / "sapo_ablation"
#: name -> (I, J, [learning] overrides): SAPO's four, and 4/4 with the best transfer rule of the
#: specialists testbed (#14) in SAPO's homogeneous setting.
CONFIGS: dict[str, tuple[int, int, dict[str, Any]]] = {
    "8/0": (8, 0, {}),
    "6/2": (6, 2, {}),
    "4/4": (4, 4, {}),
    "2/6": (2, 6, {}),
    "4/4 anchored": (4, 4, {"mixing": "anchored"}),
    "4/4 replay": (4, 4, {"mixing": "replay"}),
    # replay's control: no exchange, the memory holds only the agent's own verified successes,
    # so 4/4 replay's gain over it is what the peers' data adds to plain experience replay
    "8/0 replay": (8, 0, {"mixing": "replay"}),
}
#: The paper's Table (Qwen2.5-0.5B, 8 agents, 2000 rounds): total reward and gain over 8/0.
PAPER = {"8/0": (561.79, None), "6/2": (854.43, 0.52), "4/4": (1093.31, 0.94), "2/6": (945.87, 0.68)}
REDUCED_ROUNDS = 20
FULL_ROUNDS = 500  # the scenarios' rounds (the paper ran 2000 on Qwen2.5-0.5B)
#: Student t quantiles (two-sided 95%) by degrees of freedom, for the per-seed gain intervals.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def config_scenario(name: str, rounds: int | None, seeds: list[int] | None) -> dict[str, Any]:
    local, external, overrides = CONFIGS[name]
    # Held-out accuracy at start and end only when the rounds are overridden.
    scenario = load_scenario(f"sapo_{local}_{external}.toml", rounds, seeds, eval_every=lambda r: 0)
    scenario["learning"].update(overrides)
    return scenario


def run_config(name: str, rounds: int | None, seeds: list[int] | None, out: Path) -> dict:
    return run_logged(name, config_scenario(name, rounds, seeds), out / folder(name))


def folder(name: str) -> str:
    return name.replace("/", "_").replace(" ", "_")


def gain_interval(totals: list[float], base: list[float]) -> dict[str, Any]:
    """Each seed's gain over 8/0 on the same seed (total / base - 1), their mean, sd and a 95%
    t-interval of the mean (None with one seed)."""
    gains = [t / b - 1.0 for t, b in zip(totals, base, strict=True)]
    mean = statistics.fmean(gains)
    if len(gains) < 2:
        return {"per_seed": gains, "mean": mean, "sd": None, "ci95": None}
    sd = statistics.stdev(gains)
    half = T95.get(len(gains) - 1, 1.96) * sd / len(gains) ** 0.5
    return {"per_seed": gains, "mean": mean, "sd": sd, "ci95": [mean - half, mean + half]}


def moving_average(values: list[float], window: int) -> list[float]:
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1) : i + 1]
        out.append(sum(chunk) / len(chunk))
    return out


def plot(path: Path, table: list[dict[str, Any]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for row in table:
        curve = row["mean_reward_per_round"]
        window = max(1, len(curve) // 20)
        ax.plot(
            range(1, len(curve) + 1),
            moving_average(curve, window),
            label=f"{row['config']} (moving average of {window})" if window > 1 else row["config"],
        )
    ax.set_xlabel("round")
    ax.set_ylabel("mean reward of own completions (agents, seeds)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(title="local/external")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = parser(
        __doc__,
        reduced_rounds=REDUCED_ROUNDS,
        full_rounds=FULL_ROUNDS,
        unit="configurations",
        results=RESULTS,
    )
    p.add_argument(
        "--configs",
        default=",".join(CONFIGS),
        help="comma-separated configurations to run, 8/0 first (the gains' base); default: all",
    )
    args = p.parse_args(argv)
    configs = [c.strip() for c in args.configs.split(",")]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown or not configs or configs[0] != "8/0":
        p.error(f"--configs must start with 8/0 and name only {sorted(CONFIGS)}; got {configs}")
    rounds = args.rounds if args.rounds is not None else (REDUCED_ROUNDS if args.reduced else None)
    kind = "reduced" if args.reduced else "full"
    results_dir: Path = args.out
    out = results_dir / kind
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    names = {folder(name): (name, rounds, args.seeds, out) for name in configs}
    if not args.summarize_only:
        warm_all([config_scenario(name, rounds, args.seeds) for name in configs], args.jobs)
    by_name = read_results(out, list(names)) if args.summarize_only else run_all(run_config, names, args.jobs)
    results = list(by_name.values())
    wall = time.perf_counter() - started

    base = results[0]["summary"]["total_reward_mean"]
    base_per_seed = results[0]["summary"]["total_reward_per_seed"]
    table = []
    for config, result in zip(configs, results, strict=True):
        summary = result["summary"]
        heldout = summary["by_model"]["tiny"]
        paper = PAPER.get(config, (None, None))
        table.append(
            {
                "config": config,
                "total_reward_mean": summary["total_reward_mean"],
                "total_reward_stdev": summary["total_reward_stdev"],
                "total_reward_per_seed": summary["total_reward_per_seed"],
                "gain_vs_8_0": summary["total_reward_mean"] / base - 1.0 if base else None,
                "gain_vs_8_0_by_seed": gain_interval(summary["total_reward_per_seed"], base_per_seed),
                "paper_total_reward": paper[0],
                "paper_gain_vs_8_0": paper[1],
                "heldout_start_mean": heldout["heldout_start_mean"],
                "heldout_end_mean": heldout["heldout_end_mean"],
                "external_used_per_agent_round": statistics.fmean(
                    u for run in result["runs"] for a in run["agents"] for u in a["external_used"]
                ),
                "own_used_per_agent_round": statistics.fmean(
                    u for run in result["runs"] for a in run["agents"] for u in a["own_used"]
                ),
                "mean_reward_per_round": summary["mean_reward_per_round"],
                "seconds": sum(t["seconds"] for t in result["timing"]["runs"]),
                "seconds_per_round": result["timing"]["seconds_per_round_mean"],
                "cpu_seconds_per_round": cpu_per_round(result),
            }
        )
    learning = learning_of(results[0])
    n_rounds, seeds = learning["rounds"], learning["seeds"]
    length = f"{n_rounds} rounds, not {FULL_ROUNDS}" if args.reduced else f"{n_rounds} rounds"
    print(
        f"SAPO ablation on the tiny model ({kind}: {length}; 8 agents, {len(seeds)} seeds {list(seeds)}, "
        "G = 8, 8 groups generated per agent-round)"
    )
    header = ("I/J", "total reward", "gain vs 8/0 [95% CI]", "paper gain", "held-out start -> end")
    print("{:>12} {:>18} {:>28} {:>11} {:>22}".format(*header))
    for row in table:
        g = row["gain_vs_8_0_by_seed"]
        gain = (
            "-"
            if row["config"] == "8/0"
            else f"{g['mean']:+.1%}" + (f" [{g['ci95'][0]:+.1%}, {g['ci95'][1]:+.1%}]" if g["ci95"] else "")
        )
        paper = "-" if row["paper_gain_vs_8_0"] is None else f"{row['paper_gain_vs_8_0']:+.0%}"
        total = f"{row['total_reward_mean']:.2f} ± {row['total_reward_stdev']:.2f}"
        print(
            f"{row['config']:>12} {total:>18} {gain:>28} {paper:>11} "
            f"{row['heldout_start_mean']:>10.3f} -> {row['heldout_end_mean']:.3f}"
        )
    wall, args.jobs = recorded_wall(results_dir / f"{kind}.json", wall, args.jobs, args.summarize_only)
    per_round = statistics.fmean(row["seconds_per_round"] for row in table)
    cpu = [row["cpu_seconds_per_round"] for row in table]
    basis = "CPU" if all(c is not None for c in cpu) else "wall"
    cost = (
        sum(c for c in cpu if c is not None) if basis == "CPU" else sum(r["seconds_per_round"] for r in table)
    )
    full_estimate = cost * FULL_ROUNDS * len(seeds)
    print(
        f"wall {wall:.0f} s with --jobs {args.jobs} on {os.cpu_count()} cores; mean {per_round:.2f} s wall "
        f"per 8-agent round; the full version ({FULL_ROUNDS} rounds x {len(seeds)} seeds x {len(configs)} "
        "configurations) "
        f"extrapolates to {full_estimate / 3600:.1f} h of single-thread work ({basis} s per round x rounds)"
    )
    summary = {
        "kind": kind,
        "rounds": n_rounds,
        "seeds": list(seeds),
        "agents": learning["agents"],
        "table": table,
        "wall_seconds": wall,
        "jobs": args.jobs,
        "cpu_count": os.cpu_count(),
        "machine": platform.platform(),
        "full_estimate_seconds_single_job": full_estimate,
        "full_estimate_basis": basis,
        "note": "total reward = sum over agents and rounds of each agent's mean own-completion reward",
    }
    write_summary(results_dir, kind, summary, args.json)
    plot(
        results_dir / f"{kind}.png",
        table,
        f"SAPO I/J on the tiny model ({kind}: {n_rounds} rounds, 8 agents, {len(seeds)} seeds)",
    )
    print(f"wrote {results_dir / (kind + '.json')} and {results_dir / (kind + '.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
