"""What the learning-mode experiments (sapo_ablation.py, hacpo_pair.py) share: their command line,
loading a scenario with the run's overrides, running each arm (in parallel processes or not),
and reading timings back out of ``run_learning`` results.

Not a script: the experiments import it (``python simulations/X.py`` puts this folder first on
``sys.path``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "simulations" / "scenarios"

Result = dict[str, Any]


def parser(
    doc: str, *, reduced_rounds: int, full_rounds: int, unit: str, results: Path
) -> argparse.ArgumentParser:
    """The experiments' common options; ``unit`` names what ``--jobs`` runs in parallel."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reduced", action="store_true", help=f"{reduced_rounds} rounds, not {full_rounds}")
    p.add_argument("--rounds", type=int, default=None, help="override the number of rounds")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="default: the scenarios' [0, 1, 2]")
    p.add_argument("--jobs", type=int, default=1, help=f"{unit} run in parallel (1 thread each)")
    p.add_argument("--json", type=Path, default=None, help="also write the summary here")
    p.add_argument("--out", type=Path, default=results, help=f"results folder (default {results})")
    p.add_argument(
        "--summarize-only", action="store_true", help=f"re-read the {unit}' learning.json, run nothing"
    )
    return p


def load_scenario(
    file: str, rounds: int | None, seeds: list[int] | None, *, eval_every: Callable[[int], int]
) -> dict[str, Any]:
    """``simulations/scenarios/FILE`` with ``--rounds`` (and ``eval_every(rounds)``) and ``--seeds``
    applied, and its cache folder made absolute."""
    data = tomllib.loads((SCENARIOS / file).read_text(encoding="utf-8"))
    learning = data["learning"]
    if rounds is not None:
        learning["rounds"] = rounds
        learning["eval_every"] = eval_every(rounds)
    if seeds is not None:
        learning["seeds"] = seeds
    learning["cache_dir"] = str(ROOT / learning.get("cache_dir", "runs/sim-cache"))
    return data


def run_logged(label: str, scenario: dict[str, Any], out: Path) -> Result:
    """``run_learning`` with its progress lines prefixed by ``[label]`` on stderr."""
    from swarmnode.sim.learning import run_learning  # in the worker: torch threads are per process

    def say(line: str) -> None:
        print(f"[{label}] {line}", file=sys.stderr, flush=True)

    return run_learning(scenario, out, say)


def warm_one(scenario: dict[str, Any], key: tuple[str, str | None]) -> str:
    """One warm start of ``scenario`` into its cache (a ``warm_all`` unit, in a worker process)."""
    import torch

    from swarmnode.sim.learning import cache_of, parse_learning, warm_policy

    spec = parse_learning(scenario)
    torch.set_num_threads(spec.threads)  # as run_learning: the warm start depends on it

    def say(line: str) -> None:
        print(f"[warm start {key[1] or key[0]}] {line}", file=sys.stderr, flush=True)

    return str(warm_policy(spec, key, cache_of(spec, ROOT), say))


def warm_all(scenarios: list[dict[str, Any]], jobs: int) -> None:
    """Build every warm start the scenarios need, ``jobs`` at a time, before their runs start.

    Otherwise each of ``--jobs`` processes would build the same warm starts at once on a fresh
    cache (4 x 130 s each for the specialists), and a scenario's warm starts one after another."""
    from swarmnode.sim.learning import cache_of, parse_learning, warm_policy_dir, warm_start_keys

    units: dict[str, tuple[Any, ...]] = {}
    for scenario in scenarios:
        spec = parse_learning(scenario)
        if not spec.cache_dir:
            continue  # no shared cache: each run builds its own in its results folder
        for key in warm_start_keys(spec):
            units.setdefault(str(warm_policy_dir(spec, key, cache_of(spec, ROOT))), (scenario, key))
    run_all(warm_one, units, jobs)  # type: ignore[arg-type]


def run_all(run: Callable[..., Result], calls: Mapping[str, tuple[Any, ...]], jobs: int) -> dict[str, Result]:
    """``{name: run(*args)}`` for every call, in ``jobs`` processes when ``jobs > 1``."""
    if jobs <= 1:
        return {name: run(*args) for name, args in calls.items()}
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {name: pool.submit(run, *args) for name, args in calls.items()}
        return {name: f.result() for name, f in futures.items()}


def read_results(out: Path, names: list[str]) -> dict[str, Result]:
    """``--summarize-only``: each name's ``learning.json`` under ``out``."""
    return {name: json.loads((out / name / "learning.json").read_text(encoding="utf-8")) for name in names}


def recorded_wall(summary_file: Path, wall: float, jobs: int, summarize_only: bool) -> tuple[float, int]:
    """A re-summary keeps the wall time and ``--jobs`` its runs were measured with."""
    if summarize_only and summary_file.is_file():
        previous = json.loads(summary_file.read_text(encoding="utf-8"))
        return previous["wall_seconds"], previous["jobs"]
    return wall, jobs


def learning_of(result: Result) -> dict[str, Any]:
    """The parsed [learning] keys of a run_learning result (older results kept them under "scenario")."""
    value = result["learning"] if "learning" in result else result["scenario"]
    assert isinstance(value, dict)
    return value


def cpu_per_round(result: Result) -> float | None:
    """CPU seconds per round of this process (None for results recorded before it was measured).
    On a busy machine wall time overstates what a run costs alone; CPU time does not."""
    runs = result["timing"]["runs"]
    rounds = learning_of(result)["rounds"]
    if not rounds or any("cpu_seconds" not in t for t in runs):
        return None
    return sum(t["cpu_seconds"] for t in runs) / (rounds * len(runs))


def write_summary(results_dir: Path, kind: str, summary: Mapping[str, Any], also: Path | None) -> Path:
    """``results_dir/KIND.json`` (and ``--json``'s path, when given); returns the first."""
    text = json.dumps(summary, indent=1)
    path = results_dir / f"{kind}.json"
    path.write_text(text, encoding="utf-8")
    if also is not None:
        also.write_text(text, encoding="utf-8")
    return path
