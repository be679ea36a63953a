"""A learner's spot check of one worker group: one forward pass for both halves, against one each.

Question (#20): the spot check recomputes the sampled tokens' log-probs and checks the tokens
themselves against keyed sampling under each of the worker's seeds (two at most). Both read the
same logits: the learner takes them from one forward pass over the group (``scan_group``: the
log-probs at the drawn tokens, and the tokens to check with their logits; then ``tokens_at`` per
seed). Reference: the previous path, still in the package,
a forward pass of its own for the log-probs (``recompute_request``) and one per seed for the
token checks (``check_request_tokens``). Reported: CPU seconds per spot check (median), and the
ratio. Same model, groups, requests and seeds for both; alternated run by run.

Setup: the built-in tiny model (random init), G = 8 completions of up to 16 tokens sampled by the
torch engine, reasoning-gym chain_sum prompts (``compact`` or ``question``), a request of 8
tokens (the learner's ``max_tokens``), 2 seeds (a worker re-activated once), 1 torch thread.

Second table (``--long``): a group of G = 8 completions of T tokens each (random tokens; a worker
that runs every completion to the length limit), scanned in packs of at most ``MAX_PACK_TOKENS``
(ours) against one pack per group (before: attention over P + G*T tokens, quadratic in G*T).
Wall seconds of one scan, median of 3.

    python bench/spot_check.py [--repeats 15] [--formats compact,question] [--long 512,1024,2048]
        [--json out.json]

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

from swarmnode.admit.recompute import check_request_tokens, recompute_request, scan_group, tokens_at
from swarmnode.admit.spotcheck import SpotCheckConfig, SpotChecker
from swarmnode.policy.model import build_tiny_policy
from swarmnode.rollout import SamplingParams, make_engine
from swarmnode.tasks import DatasetSpec, TaskMixture
from swarmnode.train.batch import MAX_PACK_TOKENS, completion_logits

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
    parser.add_argument("--long", default="512,1024,2048", help="completion lengths T ('' to skip)")
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
                scan = scan_group(
                    policy, request, prompt, completions, PARAMS.temperature, token_checks=8, draw_seed=1
                )
                for seed in SEEDS:
                    tokens_at(scan.token_logits, scan.tokens, completions, PARAMS, seed, key)

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
            "ours: scan_group + tokens_at per seed; before: "
            "recompute_request + "
            "check_request_tokens per seed (each its own forward pass)"
        ],
    )
    if args.long:
        report["long_groups"] = long_groups(policy, checker, [int(t) for t in args.long.split(",")])
    write_json(args.json, report)
    return 0


def long_groups(policy: Any, checker: SpotChecker, lengths: list[int]) -> list[dict[str, Any]]:
    """Scan time of a group of 8 completions of T tokens: packs of at most MAX_PACK_TOKENS vs one."""
    vocab = policy.model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompt = [1, *torch.randint(3, vocab, (31,), generator=g).tolist()]
    rows, out = [], []
    for t in lengths:
        completions = [torch.randint(3, vocab, (t,), generator=g).tolist() for _ in range(8)]
        request = checker.select("worker", t, [t] * 8)
        assert request is not None

        def ours(request: Any = request, completions: list[list[int]] = completions) -> None:
            scan_group(policy, request, prompt, completions, 1.0, token_checks=8, draw_seed=1)

        def one_pack(completions: list[list[int]] = completions) -> None:
            with torch.no_grad():
                completion_logits(policy.model, [prompt] * 8, completions, pack_tokens=1 << 30)

        times: dict[str, list[float]] = {"ours": [], "one_pack": []}
        for _ in range(3):
            for name, run in (("ours", ours), ("one_pack", one_pack)):
                started = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - started)
        o, r = median(times["ours"]), median(times["one_pack"])
        out.append({"tokens_per_completion": t, "packed_scan_s": o, "one_pack_s": r, "ratio": r / o})
        rows.append([str(t), str(32 + 8 * t), f"{o:.3f}", f"{r:.3f}", f"{r / o:.2f}x"])
    print_table(
        f"scan of a long group (G = 8, prompt 32 tokens), wall s, median of 3, packs <= {MAX_PACK_TOKENS}",
        ["T", "group tokens", "packs (ours)", "one pack (before)", "saved"],
        rows,
        ["one pack: attention over the whole group in one sequence, quadratic in G*T"],
    )
    return out


if __name__ == "__main__":
    raise SystemExit(main())
