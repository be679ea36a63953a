"""A learner's spot check of one worker group: one forward pass for both halves, against one each.

Question (#20): the spot check recomputes the sampled tokens' log-probs and checks the tokens
themselves against keyed sampling under each of the worker's seeds (two at most). Both read the
same logits: the learner now takes them from one forward pass over the group (``group_logits``,
then ``logprobs_at`` at the drawn tokens, ``select_uncertain`` for the tokens to check, and
``tokens_at`` per seed). Reference: the previous path, still in the package,
a forward pass of its own for the log-probs (``recompute_request``) and one per seed for the
token checks (``check_request_tokens``). Reported: CPU seconds per spot check (median), and the
ratio. Same model, groups, requests and seeds for both; alternated run by run.

Setup: the built-in tiny model (random init), G = 8 completions of up to 16 tokens sampled by the
torch engine, reasoning-gym chain_sum prompts (``compact`` or ``question``), a request of 8
tokens (the learner's ``max_tokens``), 2 seeds (a worker re-activated once), 1 torch thread.

    python bench/spot_check.py [--repeats 15] [--formats compact,question] [--json out.json]

Run it alone: on a shared 2-core machine other work skews the figures.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import base_parser, machine, median, print_table, write_json

from swarmnode.admit.recompute import (
    check_request_tokens,
    group_logits,
    logprobs_at,
    pick,
    recompute_request,
    tokens_at,
    top_probabilities,
)
from swarmnode.admit.spotcheck import SpotCheckConfig, SpotChecker
from swarmnode.policy.model import build_tiny_policy
from swarmnode.rollout import SamplingParams, make_engine
from swarmnode.tasks import DatasetSpec, TaskMixture

CHAIN_SUM = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}
SEEDS = (b"\x01" * 32, b"\x02" * 32)
PARAMS = SamplingParams(temperature=1.0, max_new_tokens=16)


def cpu_seconds(run: Any) -> float:
    started = time.process_time()
    run()
    return time.process_time() - started


def main() -> int:
    parser = base_parser(__doc__.split("\n")[0])
    parser.add_argument("--formats", default="compact,question")
    parser.set_defaults(repeats=15, threads=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads or 1)
    policy = build_tiny_policy(0)
    # Question prompts run past the tiny config's 64 positions (RoPE has no table limit).
    policy.model.config.max_position_embeddings = 256  # type: ignore[union-attr]
    policy.model.eval()
    engine = make_engine("torch", policy)
    checker = SpotChecker(SpotCheckConfig(sample_rate=1.0, max_tokens=8))
    rows, report = [], {"machine": machine(), "formats": {}}
    for fmt in args.formats.split(","):
        mixture = TaskMixture([DatasetSpec("chain_sum", CHAIN_SUM, 1.0, fmt)], seed=0)
        prompts = [t.prompt for t in mixture.sample(0, 4, stream="bench")]
        result = engine.generate(prompts, 8, PARAMS, torch.Generator().manual_seed(0))
        cases = []
        for key, (prompt, group) in enumerate(zip(result.prompt_ids, result.completions, strict=True)):
            completions = [c.token_ids for c in group]
            request = checker.select("worker", key, [len(c) for c in completions])
            assert request is not None
            cases.append((str(key), prompt, completions, request))

        def one_forward(cases: list[Any] = cases) -> None:
            for key, prompt, completions, request in cases:
                logits, _ = group_logits(policy, prompt, completions)
                logprobs_at(pick(logits, request), request, completions, PARAMS.temperature)
                tokens = checker.select_uncertain(
                    request, top_probabilities(logits, completions, PARAMS.temperature)
                )
                for seed in SEEDS:
                    tokens_at(pick(logits, tokens), tokens, completions, PARAMS, seed, key)

        def a_forward_each(cases: list[Any] = cases) -> None:
            for key, prompt, completions, request in cases:
                recompute_request(policy, request, prompt, completions, PARAMS.temperature)
                for seed in SEEDS:
                    check_request_tokens(policy, request, prompt, completions, PARAMS, seed, key)

        with torch.no_grad():
            one_forward()  # warm-up
            a_forward_each()
            ours, reference = [], []
            for _ in range(args.repeats):
                ours.append(cpu_seconds(one_forward) / len(cases))
                reference.append(cpu_seconds(a_forward_each) / len(cases))
        o, r = median(ours), median(reference)
        report["formats"][fmt] = {
            "one_forward_cpu_ms": o * 1e3,
            "forward_each_cpu_ms": r * 1e3,
            "ratio": r / o,
        }
        rows.append([fmt, f"{o * 1e3:.2f}", f"{r * 1e3:.2f}", f"{r / o:.2f}x"])
    print_table(
        f"spot check of one group (8 tokens, 2 seeds), CPU ms, median of {args.repeats}, "
        f"{torch.get_num_threads()} thread(s)",
        ["prompts", "one forward (ours)", "a forward each (before)", "saved"],
        rows,
        [
            "ours: group_logits + logprobs_at + select_uncertain + tokens_at per seed; before: "
            "recompute_request + "
            "check_request_tokens per seed (each its own forward pass)"
        ],
    )
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
