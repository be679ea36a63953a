"""Rollout throughput: our torch engine against transformers' ``generate`` on the same model.

Question: how many new tokens per second does ``TorchEngine`` sample, beside
``HFEngine`` (``model.generate``), on the same model, batch (prompts x samples),
lengths and sampling settings? Prints a table (median of ``--runs`` runs, the
engines interleaved run by run so both see the same background load) and, with
``--json PATH``, writes the same figures there.

Prompt formats: ``compact`` is what the tiny model trains on (``58+26=``, about 7
tokens with BOS); ``question`` is reasoning-gym's full chain_sum question (about
70 characters; DESIGN.md's reference setting). The tiny tokenizer has no letters,
so a question's letters encode as <unk>: the token count and cost are what
matter here, not the meaning. The default model is the tiny model at random init
(rows run to ``--new-tokens`` unless they sample EOS); ``--model-dir`` benches a
saved policy instead (e.g. a warm start, whose rows stop after a few tokens).

``--keyed`` also times the torch engine sampling by the keyed rule (``rollout.keyed``: one
SHA-256 per sampled token, the #20 check's price at generation) and prints it beside the plain
torch engine.

Timing on a shared machine is fragile: run alone. The load average at start is
printed so a noisy figure can be recognised.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import matmul_gflops, non_embedding_parameters

from swarmnode.policy.model import Policy, build_tiny_policy, load_policy
from swarmnode.policy.model import Policy as _Policy
from swarmnode.rollout.hf_engine import HFEngine
from swarmnode.rollout.keyed import SamplingKeys
from swarmnode.rollout.torch_engine import TorchEngine
from swarmnode.rollout.types import GenerationResult, RolloutEngine, SamplingParams
from swarmnode.tasks import DatasetSpec, TaskMixture

CHAIN_SUM = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}


def _prompts(prompt_format: str, count: int, seed: int) -> list[str]:
    mixture = TaskMixture([DatasetSpec("chain_sum", CHAIN_SUM, 1.0, prompt_format)], seed=seed)
    return [task.prompt for task in mixture.sample(0, count, stream="bench")]


def _policy(model_dir: Path | None) -> Policy:
    policy = load_policy(model_dir) if model_dir is not None else build_tiny_policy(0)
    # Question prompts run past the tiny config's 64 positions; RoPE has no table
    # limit, this only silences transformers' length reminder (speed is the question).
    policy.model.config.max_position_embeddings = max(policy.model.config.max_position_embeddings, 256)
    return policy


class KeyedTorchEngine:
    """The torch engine sampling by the keyed rule, with one task key per prompt."""

    name = "torch-keyed"

    def __init__(self, policy: _Policy) -> None:
        self.engine = TorchEngine(policy)

    def generate(
        self,
        prompts: list[str],
        n: int,
        params: SamplingParams,
        generator: torch.Generator | None = None,
        **_: Any,
    ) -> GenerationResult:
        keys = SamplingKeys(bytes(32), tuple(f"bench:{i}" for i in range(len(prompts))))
        return self.engine.generate(prompts, n, params, generator, keys=keys)

    def update_weights(self, policy: _Policy) -> None:
        self.engine.update_weights(policy)


def _time_runs(
    engines: list[RolloutEngine], prompts: list[str], n: int, params: SamplingParams, runs: int, warmup: int
) -> dict[str, list[tuple[float, int]]]:
    """(seconds, new tokens) per run per engine; engines alternate within each run."""
    results: dict[str, list[tuple[float, int]]] = {engine.name: [] for engine in engines}
    for run in range(warmup + runs):
        for engine in engines:
            generator = torch.Generator().manual_seed(run)
            started = time.perf_counter()
            result = engine.generate(prompts, n, params, generator)
            seconds = time.perf_counter() - started
            if run >= warmup:
                results[engine.name].append((seconds, result.tokens_generated))
    return results


def _summary(runs: list[tuple[float, int]]) -> dict[str, Any]:
    rates = [tokens / seconds for seconds, tokens in runs]
    return {
        "tokens_per_s": statistics.median(rates),
        "tokens_per_s_runs": [round(rate, 1) for rate in rates],
        "seconds_median": statistics.median(seconds for seconds, _ in runs),
        "new_tokens_mean": statistics.mean(tokens for _, tokens in runs),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=8, help="distinct prompts per batch (GRPO groups)")
    parser.add_argument("--samples", type=int, default=8, help="samples per prompt (group size)")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--formats", default="compact,question", help="comma list of: compact, question")
    parser.add_argument("--runs", type=int, default=7, help="timed runs per engine (median reported)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads")
    parser.add_argument(
        "--model-dir", type=Path, default=None, help="a saved policy (default: tiny, random init)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--keyed", action="store_true", help="also time keyed sampling (#20)")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    load_at_start = os.getloadavg()[0]
    policy = _policy(args.model_dir)
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.new_tokens)
    engines: list[RolloutEngine] = [TorchEngine(policy), HFEngine(policy)]
    if args.keyed:
        engines.append(KeyedTorchEngine(policy))
    rows = []
    for prompt_format in [f.strip() for f in args.formats.split(",") if f.strip()]:
        prompts = _prompts(prompt_format, args.prompts, seed=0)
        prompt_tokens = statistics.mean(len(policy.encode_prompt(p)) for p in prompts)
        timings = _time_runs(engines, prompts, args.samples, params, args.runs, args.warmup)
        ours, reference = _summary(timings["torch"]), _summary(timings["hf"])
        keyed = _summary(timings["torch-keyed"]) if args.keyed else None
        # Arithmetic done: 2 * N FLOPs per token through the non-embedding weights, each prompt
        # prefilled once and every new token decoded (attention left out), over the median run.
        tokens = args.prompts * prompt_tokens + ours["new_tokens_mean"]
        gflops = 2 * non_embedding_parameters(policy.model) * tokens / ours["seconds_median"] / 1e9
        config: Any = policy.model.config
        roofline = matmul_gflops(args.prompts * args.samples, config.hidden_size, config.intermediate_size)
        rows.append(
            {
                "prompt_format": prompt_format,
                "prompt_tokens_mean": round(prompt_tokens, 1),
                "ours": ours,
                "hf_generate": reference,
                "ratio": ours["tokens_per_s"] / reference["tokens_per_s"],
                "keyed": keyed,
                "keyed_vs_plain": keyed["tokens_per_s"] / ours["tokens_per_s"] if keyed else None,
                "ours_gflops": gflops,
                "roofline_gflops_decode_shape": roofline,
                "roofline_shape": [args.prompts * args.samples, config.hidden_size, config.intermediate_size],
                "roofline_gflops_1024": matmul_gflops(1024, 1024, 1024),
                "fraction_of_roofline": gflops / roofline,
            }
        )
    report = {
        "benchmark": "rollout engine: TorchEngine vs HF generate",
        "settings": {
            "model": str(args.model_dir) if args.model_dir else "tiny (random init, seed 0)",
            "parameters": sum(p.numel() for p in policy.model.parameters()),
            "batch": f"{args.prompts} prompts x {args.samples} samples",
            "new_tokens": args.new_tokens,
            "temperature": args.temperature,
            "top_p": args.top_p,
            "runs": args.runs,
            "warmup": args.warmup,
            "dtype": str(policy.model.dtype),
        },
        "machine": {
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "processor": platform.processor() or platform.machine(),
            "load_average_at_start": round(load_at_start, 2),
        },
        "results": rows,
    }
    _print_table(report)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


def _print_table(report: dict[str, Any]) -> None:
    settings, machine = report["settings"], report["machine"]
    print(f"{report['benchmark']}")
    print(
        f"model {settings['model']}, {settings['parameters']:,} params, {settings['dtype']}; batch "
        f"{settings['batch']}; {settings['new_tokens']} new tokens; T={settings['temperature']} "
        f"top_p={settings['top_p']}; median of {settings['runs']} runs"
    )
    print(
        f"machine: {machine['cpu_count']} cores, {machine['torch_threads']} torch threads, torch "
        f"{machine['torch']}; load average at start {machine['load_average_at_start']} (run alone)"
    )
    header = (
        f"{'prompts':<10}{'prompt tok':>11}{'ours tok/s':>12}{'HF generate tok/s':>19}{'ratio':>8}"
        f"{'ours GFLOP/s':>14}{'roofline':>10}{'share':>8}"
    )
    print(header)
    print("-" * len(header))
    for row in report["results"]:
        print(
            f"{row['prompt_format']:<10}{row['prompt_tokens_mean']:>11.1f}{row['ours']['tokens_per_s']:>12,.0f}"
            f"{row['hf_generate']['tokens_per_s']:>19,.0f}{row['ratio']:>7.2f}x{row['ours_gflops']:>14.2f}"
            f"{row['roofline_gflops_decode_shape']:>10.1f}{row['fraction_of_roofline']:>8.1%}"
        )
    for row in report["results"]:
        if row.get("keyed"):
            print(
                f"keyed sampling ({row['prompt_format']}): {row['keyed']['tokens_per_s']:,.0f} tok/s, "
                f"{row['keyed_vs_plain']:.2f}x the plain torch engine"
            )
    shape = "x".join(map(str, report["results"][0]["roofline_shape"])) if report["results"] else ""
    print(
        f"roofline: torch.mm at the decode shape {shape} (GFLOP/s, same threads, same run); "
        "ours: 2 * non-embedding parameters * tokens (prompts once + new tokens) / median seconds"
    )


if __name__ == "__main__":
    sys.exit(main())
