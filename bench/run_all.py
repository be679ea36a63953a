"""Run the performance benches one after another, write one JSON, and compare with a baseline.

Each bench runs alone in its own process (``--json`` to a temporary file); its headline figures
are picked out into one flat record ``{figure: value}`` (higher is better for every figure, so a
ratio below 1 is a slowdown). ``--baseline`` prints each figure beside the committed baseline
(``bench/baseline.json``) with the ratio now / baseline; ``--save-baseline`` writes this run as
the new baseline. Timing on a shared 2-core machine swings (up to 2x on this VM between runs):
run it alone, and read a ratio below about 0.8 as a lead to re-measure, not yet as a verdict.

    python bench/run_all.py [--only engine,grpo_step] [--baseline bench/baseline.json] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine

HERE = Path(__file__).resolve().parent
Figures = dict[str, float]


def _engine(report: dict[str, Any]) -> Figures:
    out: Figures = {}
    new_tokens = report["settings"]["new_tokens"]
    for row in report["results"]:
        # 16 new tokens (the default) keeps the figures' old names: the committed baseline's.
        fmt = row["prompt_format"] if new_tokens == 16 else f"{row['prompt_format']}_{new_tokens}"
        out[f"engine.{fmt}.tokens_per_s"] = row["ours"]["tokens_per_s"]
        out[f"engine.{fmt}.vs_hf_generate"] = row["ratio"]
    return out


def _grpo_step(report: dict[str, Any]) -> Figures:
    out: Figures = {}
    for row in report["results"]:
        fmt = row["prompt_format"]
        out[f"grpo_step.{fmt}.samples_per_s"] = row["shared"]["samples_per_s"]
        out[f"grpo_step.{fmt}.vs_trl"] = row["shared"]["vs_trl"]
        out[f"grpo_step.{fmt}.update_gflops"] = row["shared"]["update_gflops"]
        out[f"grpo_step.{fmt}.update_fraction_of_roofline"] = row["shared"]["update_fraction_of_roofline"]
        out[f"grpo_step.{fmt}.shared_vs_unshared_update"] = row["shared_vs_unshared_update"]
    return out


def _learning_round(report: dict[str, Any]) -> Figures:
    shared = report["results"]["shared"]
    return {
        "learning_round.agent_rounds_per_s": 1.0 / shared["wall_s_per_agent_round"],
        "learning_round.shared_vs_unshared": report["speedup"],
    }


def _admission(report: dict[str, Any]) -> Figures:
    out: Figures = {}
    for row in report["rows"]:
        per = row["groups_per_envelope"]
        out[f"admission.{per}_per_envelope.groups_per_s"] = row["admission_before_rescoring_groups_per_s"]
        out[f"admission.{per}_per_envelope.sandboxed_groups_per_cpu_s"] = row[
            "full_pipeline_sandboxed_groups_per_cpu_second"
        ]
    return out


#: name -> (script arguments after the script, the figure picker)
BENCHES: dict[str, tuple[list[str], Callable[[dict[str, Any]], Figures]]] = {
    "engine": (["--runs", "7"], _engine),
    # #16 asks for question prompts at 128 new tokens as well: rows run longer, attention grows.
    "engine_long": (["--formats", "question", "--new-tokens", "128", "--runs", "5"], _engine),
    "grpo_step": (["--repeats", "7"], _grpo_step),
    "learning_round": (["--rounds", "20", "--repeats", "3"], _learning_round),
    "admission": (["--repeats", "5"], _admission),
}


def script_of(name: str) -> str:
    """The bench script a ``BENCHES`` entry runs (``engine_long`` is ``engine.py`` with other arguments)."""
    return name.removesuffix("_long")


def run_bench(name: str, timeout: float) -> tuple[Figures, dict[str, Any], float]:
    args, pick = BENCHES[name]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / f"{name}.json"
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, str(HERE / f"{script_of(name)}.py"), *args, "--json", str(out)],
            check=True,
            timeout=timeout,
        )
        seconds = time.perf_counter() - started
        report = json.loads(out.read_text(encoding="utf-8"))
    return pick(report), report, seconds


def _show(value: float | None) -> str:
    return "-" if value is None else f"{value:,.3f}"


def compare(figures: Figures, baseline: Figures) -> None:
    width = max((len(k) for k in figures), default=10)
    print(f"\n{'figure':<{width}}  {'baseline':>12}  {'now':>12}  {'now / baseline':>14}")
    for key in sorted(set(figures) | set(baseline)):
        now, then = figures.get(key), baseline.get(key)
        ratio = f"{now / then:.2f}x" if now is not None and then else "-"
        flag = "  <- slower" if now is not None and then and now / then < 0.8 else ""
        print(f"{key:<{width}}  {_show(then):>12}  {_show(now):>12}  {ratio:>14}{flag}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help=f"comma list of: {', '.join(BENCHES)} (default: all)")
    parser.add_argument("--json", type=Path, default=None, help="write every bench's report and the figures")
    parser.add_argument("--baseline", type=Path, default=HERE / "baseline.json", help="compare with this")
    parser.add_argument("--save-baseline", action="store_true", help="write this run to --baseline")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per bench")
    args = parser.parse_args()
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(BENCHES)
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        parser.error(f"--only: unknown bench(es) {unknown}; choose from {', '.join(BENCHES)}")
    figures: Figures = {}
    reports: dict[str, Any] = {}
    for index, name in enumerate(names, 1):
        print(f"[{index}/{len(names)}] bench/{script_of(name)}.py {' '.join(BENCHES[name][0])}", flush=True)
        picked, report, seconds = run_bench(name, args.timeout)
        figures.update(picked)
        reports[name] = {"seconds": seconds, "report": report}
    record = {"machine": machine(), "figures": figures, "reports": reports}
    if args.json is not None:
        args.json.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    if args.baseline.exists():
        baseline = json.loads(args.baseline.read_text(encoding="utf-8"))
        compare(figures, {k: v for k, v in baseline["figures"].items() if k.split(".")[0] in names})
    else:
        print(f"\nno baseline at {args.baseline}: figures only")
        compare(figures, {})
    if args.save_baseline:
        args.baseline.write_text(
            json.dumps({"machine": record["machine"], "figures": figures}, indent=1) + "\n", encoding="utf-8"
        )
        print(f"wrote the baseline {args.baseline}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
