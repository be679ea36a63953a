"""Specialists testbed (#14): does a sharing rule teach each node what its peers know?

4 tiny agents, each warm-started on one family the tiny alphabet writes (1-digit additions,
subtractions, products, 1-decimal sums: ``simulations/scenarios/specialists.toml``), all training
on the union of the four and answering the same prompts each round, exchanging rollouts through
the real gossip core and admission (``swarmnode.sim.learning``). Every rule runs on the same
scenario and seeds: solo (no exchange), SAPO (the paper's rule), HACPO (ALGORITHMS.md §3), and the
transfer rules of ``swarmnode.learn.transfer`` (joint groups, receiver baseline, positive only,
and anchored: receiver baseline plus a replay of our own successes).
Prints, per rule, each specialist's held-out accuracy on its own family and on its peers'
families (mean over the other three), start -> end, mean and sd over seeds, and plots both over
rounds.

    python simulations/specialists.py --reduced --jobs 2   # 200 rounds, 1 seed
    python simulations/specialists.py --jobs 2             # the scenario's 1,000 rounds, 3 seeds, J = 8
    python simulations/specialists.py --rules solo,receiver_baseline --rounds 300 --seeds 0

``--jobs`` runs that many (rule, seed) runs at once, longest first, one thread each. Writes
``simulations/results/specialists/{reduced,full}.json`` and ``.png``, and each rule's
``learning.json`` (its seeds merged) under ``{reduced,full}/<rule>/``, beside each seed's own
record under ``<rule>/seed-<s>/``.
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

from swarmnode.cli import parse_set
from swarmnode.errors import ConfigError
from swarmnode.sim.learning import merge_seeds

RESULTS = ROOT / "simulations" / "results" / "specialists"
#: rule name -> [learning] overrides
RULES: dict[str, dict[str, Any]] = {
    "solo": {"mixing": "none", "external_groups": 0},
    "sapo": {"mixing": "sapo"},
    "hacpo": {"mixing": "hacpo"},
    "joint": {"mixing": "joint"},
    "receiver_baseline": {"mixing": "receiver_baseline"},
    "positive_only": {"mixing": "positive_only"},
    "anchored": {"mixing": "anchored"},
    "replay": {"mixing": "replay"},
}
#: CPU seconds per agent-round of each rule at J = 8 (1,000 rounds, 1 thread, alone: the table in
#: simulations/README.md): only to start the longest runs first, so that ``--jobs`` processes
#: finish together.
COST = {
    "replay": 0.146,
    "hacpo": 0.103,
    "joint": 0.080,
    "anchored": 0.069,
    "receiver_baseline": 0.067,
    "positive_only": 0.066,
    "sapo": 0.049,
    "solo": 0.024,
}
REDUCED_ROUNDS = 200
FULL_ROUNDS = 1000


def scenario_of(
    rule: str, rounds: int | None, seeds: list[int] | None, settings: dict[str, Any]
) -> dict[str, Any]:
    scenario = load_scenario("specialists.toml", rounds, seeds, eval_every=lambda r: max(1, r // 10))
    scenario["learning"].update(RULES[rule])
    scenario["learning"].update(settings)
    return scenario


def run_seed(rule: str, rounds: int | None, seed: int, out: Path, settings: dict[str, Any]) -> dict[str, Any]:
    """One rule on one seed (the unit ``--jobs`` runs in parallel), under ``out/<rule>/seed-<s>/``."""
    return run_logged(
        f"{rule} seed {seed}", scenario_of(rule, rounds, [seed], settings), out / rule / f"seed-{seed}"
    )


def run_rules(
    rules: list[str], rounds: int | None, seeds: list[int], out: Path, settings: dict[str, Any], jobs: int
) -> dict[str, dict[str, Any]]:
    """Every rule on every seed, longest runs first; each rule's seeds merged into
    ``out/<rule>/learning.json`` (the same record as one run over all its seeds)."""
    warm_all([scenario_of(rule, rounds, seeds, settings) for rule in rules], jobs)
    units = sorted(((r, s) for r in rules for s in seeds), key=lambda u: -COST.get(u[0], 1.0))
    parts = run_all(run_seed, {f"{r}/{s}": (r, rounds, s, out, settings) for r, s in units}, jobs)
    return {
        rule: merge_seeds(
            scenario_of(rule, rounds, seeds, settings), [parts[f"{rule}/{s}"] for s in seeds], out / rule
        )
        for rule in rules
    }


def curves(result: dict[str, Any]) -> tuple[list[int], list[float], list[float]]:
    """Rounds evaluated, and the mean over seeds and agents of own-family and peers'-family accuracy."""
    rounds = sorted(int(r) for r in result["runs"][0]["agents"][0]["heldout"])
    own, others = [], []
    for r in rounds:
        o, x = [], []
        for run in result["runs"]:
            for a in run["agents"]:
                fam = a["heldout_by_family"]
                o.append(fam[a["warm_family"]][str(r)])
                x.append(statistics.fmean(fam[f][str(r)] for f in fam if f != a["warm_family"]))
        own.append(statistics.fmean(o))
        others.append(statistics.fmean(x))
    return rounds, own, others


def plot(path: Path, results: dict[str, dict[str, Any]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for rule, result in results.items():
        rounds, own, others = curves(result)
        left.plot(rounds, others, marker=".", label=rule)
        right.plot(rounds, own, marker=".", label=rule)
    left.set_title("peers' families (mean of the other three)", fontsize=9)
    right.set_title("own family (warm-started on)", fontsize=9)
    for ax in (left, right):
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
        ax.set_ylim(0, 1.02)
    left.set_ylabel("greedy held-out accuracy (agents, seeds)")
    right.legend(title="rule", fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = parser(
        __doc__,
        reduced_rounds=REDUCED_ROUNDS,
        full_rounds=FULL_ROUNDS,
        unit="(rule, seed) runs",
        results=RESULTS,
    )
    p.add_argument("--rules", default=",".join(RULES), help=f"comma list of: {', '.join(RULES)}")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a [learning] key of the scenario for every rule, e.g. --set lr=3e-4 (repeatable)",
    )
    args = p.parse_args(argv)
    try:
        settings = parse_set(args.set)
    except ConfigError as exc:
        p.error(str(exc))
    rules = [r for r in args.rules.split(",") if r]
    unknown = sorted(set(rules) - set(RULES))
    if unknown:
        p.error(f"unknown rule(s) {unknown}; known: {', '.join(RULES)}")
    rounds = args.rounds if args.rounds is not None else (REDUCED_ROUNDS if args.reduced else None)
    seeds = args.seeds if args.seeds is not None else ([0] if args.reduced else None)
    kind = "reduced" if args.reduced else "full"
    results_dir: Path = args.out
    out = results_dir / kind
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if args.summarize_only:
        by_rule = read_results(out, rules)
    else:
        run_seeds = (
            seeds
            if seeds is not None
            else load_scenario("specialists.toml", None, None, eval_every=int)["learning"]["seeds"]
        )
        by_rule = run_rules(rules, rounds, run_seeds, out, settings, args.jobs)
    wall = time.perf_counter() - started
    learning = learning_of(next(iter(by_rule.values())))
    agents, n_rounds, run_seeds = learning["agents"], learning["rounds"], learning["seeds"]
    table = []
    for rule, result in by_rule.items():
        s = result["summary"]["specialists"]
        cpu = cpu_per_round(result)
        table.append(
            {
                "rule": rule,
                **{k: {"mean": v["mean"], "sd": v["sd"], "per_seed": v["per_seed"]} for k, v in s.items()},
                "cpu_seconds_per_agent_round": cpu / agents if cpu is not None else None,
                "cpu_seconds": cpu * n_rounds * len(result["runs"]) if cpu is not None else None,
                "seconds": sum(t["seconds"] for t in result["timing"]["runs"]),
            }
        )
    cpu_total = sum(row["cpu_seconds"] or 0.0 for row in table)
    print(
        f"Specialists on the tiny model ({kind}: {n_rounds} rounds, {agents} agents, "
        f"seeds {list(run_seeds)}); greedy held-out accuracy, mean ± sd over seeds"
    )
    print(
        "{:>18} {:>30} {:>30} {:>10}".format(
            "rule", "peers' families start -> end", "own family start -> end", "CPU s/a-r"
        )
    )
    for row in table:
        peers, own = (
            f"{row[k + '_start']['mean']:.3f} -> {row[k + '_end']['mean']:.3f} ± {row[k + '_end']['sd']:.3f}"
            for k in ("others", "own")
        )
        cpu = row["cpu_seconds_per_agent_round"]
        print(f"{row['rule']:>18} {peers:>30} {own:>30} {cpu if cpu is None else round(cpu, 3):>10}")
    measured: float | None
    recorded = (results_dir / f"{kind}.json").is_file()
    measured, args.jobs = recorded_wall(results_dir / f"{kind}.json", wall, args.jobs, args.summarize_only)
    if args.summarize_only and (not recorded or not measured):
        measured = None  # a summary of runs made apart has no wall time of its own
        print("wall: not measured (a summary of earlier runs)")
    else:
        print(f"wall {measured:.0f} s with --jobs {args.jobs} on {os.cpu_count()} cores")
    # What the table costs whoever runs it: its CPU over 2 cores, as if nothing else ran (a
    # summary of runs made at different times has no wall time of its own).
    print(f"CPU {cpu_total:.0f} s in all: {cpu_total / 2 / 60:.1f} min on 2 cores at best (target 60)")
    summary = {
        "kind": kind,
        "rounds": n_rounds,
        "seeds": list(run_seeds),
        "agents": agents,
        "lr": learning.get("lr"),
        "settings": settings,
        "families": [
            label or d["name"] for d, label in zip(learning["datasets"], learning["labels"], strict=True)
        ],
        "table": table,
        "curves": {
            rule: dict(zip(("rounds", "own", "peers"), curves(r), strict=True)) for rule, r in by_rule.items()
        },
        "wall_seconds": measured,
        "cpu_seconds": cpu_total,
        "jobs": args.jobs,
        "cpu_count": os.cpu_count(),
        "machine": platform.platform(),
    }
    write_summary(results_dir, kind, summary, args.json)
    plot(
        results_dir / f"{kind}.png",
        by_rule,
        f"Specialists ({kind}: {n_rounds} rounds, {agents} agents, {len(run_seeds)} seed(s))",
    )
    print(f"wrote {results_dir / (kind + '.json')} and {results_dir / (kind + '.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
