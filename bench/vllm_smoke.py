"""GPU smoke test of the ``vllm`` rollout engine (needs vllm and a CUDA GPU).

    PYTHONPATH=. python bench/vllm_smoke.py [--arch llama|qwen2] [--model-dir DIR]
                                            [--dtype float32|bfloat16] [--json PATH]

Question: does ``VLLMEngine`` sample with the log-prob convention of ``rollout.types``,
agree with the torch engine, and take new weights in place? Steps, on a tiny model
built here (``--arch``; the built-in tiny Llama or a tiny Qwen2) or a local HF
directory (``--model-dir``), saved locally with ``save_pretrained`` by the engine:

1. start the engine (enforce_eager, a small GPU memory share);
2. sample 16 prompts x 4 (T=1): each token's log-prob against a teacher-forced
   float32 forward of the same policy (the reference);
3. greedy: tokens and log-probs against the torch engine;
4. top-p 0.9: the re-scored log-probs against the reference;
5. update weights in place (another seed's weights, loaded into the same policy),
   then sample the same prompts again: the log-probs must match the *new*
   reference (so the weights and the prefix cache were both refreshed) and not
   the old one;
6. throughput of one larger batch (information only).

Prints one PASS/FAIL line per check and a JSON summary (``--json``). Exit 0 when
every check passes, 1 when one fails, 2 when it cannot run here (no vllm / CUDA).
float32 is tried first (tight tolerances); if vLLM cannot start in float32 on
this GPU, bfloat16 is used with looser ones, and the summary says so.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

try:
    import swarmnode  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from swarmnode.errors import EngineUnavailable
from swarmnode.policy.model import Policy, build_tiny_policy, load_policy
from swarmnode.policy.tokenizer import DEFAULT_ALPHABET, build_char_tokenizer
from swarmnode.rollout.torch_engine import TorchEngine
from swarmnode.rollout.types import SamplingParams, sequence_logprobs
from swarmnode.rollout.vllm_engine import VLLMEngine, require_vllm
from swarmnode.tasks import default_mixture

# (max abs, mean abs) log-prob differences allowed against the float32 reference.
TOLERANCE = {"float32": (2e-3, 2e-4), "bfloat16": (0.25, 0.03)}
PROMPTS, SAMPLES, NEW_TOKENS = 16, 4, 8


def tiny_qwen2(seed: int) -> Policy:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_char_tokenizer(DEFAULT_ALPHABET)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return Policy(model=model.eval(), tokenizer=tokenizer, model_id="smoke-qwen2")


def make_policy(args: argparse.Namespace, seed: int) -> Policy:
    if args.model_dir:
        policy = load_policy(args.model_dir)
        if seed:  # a different set of weights of the same shapes: perturb the loaded ones
            with torch.no_grad(), torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                for p in policy.model.parameters():
                    p.add_(torch.randn_like(p) * 0.02)
        return policy
    return tiny_qwen2(seed) if args.arch == "qwen2" else build_tiny_policy(seed)


def reference_logprobs(
    policy: Policy, prompt_ids: list[list[int]], rows: list[list[int]], n: int, params: SamplingParams
) -> list[list[float]]:
    """Teacher-forced log-probs of each row under ``policy`` (float32), by the convention."""
    out = []
    model = policy.model
    device = next(model.parameters()).device
    with torch.inference_mode():
        for i, tokens in enumerate(rows):
            prompt = prompt_ids[i // n]
            ids = torch.tensor([prompt + tokens], device=device)
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : len(prompt) - 1 + len(tokens)]
            picked = torch.tensor(tokens, device=device)
            out.append(sequence_logprobs(logits.float(), picked, params).tolist())
    return out


def flat(result: Any) -> tuple[list[list[int]], list[list[float]]]:
    rows = [c for group in result.completions for c in group]
    return [c.token_ids for c in rows], [c.logprobs for c in rows]


def diff(a: list[list[float]], b: list[list[float]]) -> tuple[float, float]:
    values = [abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True)]
    return (max(values), sum(values) / len(values)) if values else (0.0, 0.0)


class Report:
    def __init__(self) -> None:
        self.checks: list[dict[str, Any]] = []

    def check(self, name: str, ok: bool, **figures: Any) -> None:
        detail = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items())
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
        self.checks.append({"name": name, "ok": ok, **figures})

    @property
    def ok(self) -> bool:
        return all(c["ok"] for c in self.checks)


def start_engine(policy: Policy, dtype: str) -> tuple[VLLMEngine, str]:
    try:
        return VLLMEngine(policy, dtype=dtype, enforce_eager=True, gpu_memory_utilization=0.25), dtype
    except (ValueError, RuntimeError, NotImplementedError) as exc:
        if dtype != "float32":
            raise
        print(f"vLLM did not start in float32 ({exc}); retrying in bfloat16", flush=True)
        return VLLMEngine(
            policy, dtype="bfloat16", enforce_eager=True, gpu_memory_utilization=0.25
        ), "bfloat16"


def run(args: argparse.Namespace) -> dict[str, Any]:
    vllm = require_vllm()
    report = Report()
    device = torch.device("cuda")
    policy = make_policy(args, seed=0)
    policy.model.to(device)
    prompts = [task.prompt for task in default_mixture(0).sample(0, PROMPTS)]
    started = time.perf_counter()
    engine, dtype = start_engine(policy, args.dtype)
    startup_s = time.perf_counter() - started
    max_tol, mean_tol = TOLERANCE[dtype]
    print(
        f"vllm {vllm.__version__} on {torch.cuda.get_device_name()}, dtype {dtype}, start {startup_s:.1f} s"
    )

    # 2. sampled log-probs against the reference
    sample = SamplingParams(temperature=1.0, max_new_tokens=NEW_TOKENS)
    first = engine.generate(prompts, SAMPLES, sample, torch.Generator().manual_seed(0))
    tokens, logprobs = flat(first)
    worst, mean = diff(logprobs, reference_logprobs(policy, first.prompt_ids, tokens, SAMPLES, sample))
    report.check("sampled log-probs = reference", worst <= max_tol and mean <= mean_tol, max=worst, mean=mean)
    report.check(
        "n samples per prompt",
        all(len(g) == SAMPLES for g in first.completions),
        groups=len(first.completions),
    )

    # 3. greedy against the torch engine
    greedy = SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS)
    ours, theirs = (
        flat(engine.generate(prompts, 1, greedy)),
        flat(TorchEngine(policy).generate(prompts, 1, greedy)),
    )
    same = sum(a == b for a, b in zip(ours[0], theirs[0], strict=True)) / len(prompts)
    firsts = diff([lp[:1] for lp in ours[1]], [lp[:1] for lp in theirs[1]])
    report.check(
        "greedy = torch engine",
        same >= (1.0 if dtype == "float32" else 0.75) and firsts[0] <= max_tol,
        same_rows=same,
        first_token_max=firsts[0],
    )

    # 4. top-p < 1: re-scored to the pre-truncation convention
    nucleus = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=NEW_TOKENS)
    result = engine.generate(prompts, SAMPLES, nucleus, torch.Generator().manual_seed(1))
    tokens, logprobs = flat(result)
    worst, _ = diff(logprobs, reference_logprobs(policy, result.prompt_ids, tokens, SAMPLES, nucleus))
    report.check("top-p log-probs re-scored", worst <= 1e-4, max=worst)

    # 5. in-place weight update, same prompts again (the prefix cache must not serve old KV)
    old_state = {k: v.detach().clone() for k, v in policy.model.state_dict().items()}
    new_state = make_policy(args, seed=1).model.state_dict()
    policy.model.load_state_dict(new_state)
    policy.version += 1
    t0 = time.perf_counter()
    engine.update_weights(policy)
    torch.cuda.synchronize()
    update_s = time.perf_counter() - t0
    second = engine.generate(prompts, SAMPLES, sample, torch.Generator().manual_seed(0))
    tokens, logprobs = flat(second)
    new_worst, new_mean = diff(
        logprobs, reference_logprobs(policy, second.prompt_ids, tokens, SAMPLES, sample)
    )
    policy.model.load_state_dict(old_state)
    _, old_mean = diff(logprobs, reference_logprobs(policy, second.prompt_ids, tokens, SAMPLES, sample))
    policy.model.load_state_dict(new_state)
    report.check(
        "after update_weights: log-probs = new reference",
        new_worst <= max_tol and new_mean <= mean_tol and second.policy_version == policy.version,
        max=new_worst,
        mean=new_mean,
        update_s=update_s,
    )
    report.check(
        "after update_weights: not the old weights",
        old_mean > 10 * max(new_mean, mean_tol),
        old_mean=old_mean,
    )

    # 6. throughput (information)
    many = [task.prompt for task in default_mixture(0).sample(1, 256)]
    result = engine.generate(many, 8, sample, torch.Generator().manual_seed(2))
    rate = result.tokens_generated / result.seconds
    print(f"throughput: {rate:.0f} tokens/s (256 prompts x 8, {NEW_TOKENS} new tokens)")
    return {
        "vllm": vllm.__version__,
        "gpu": torch.cuda.get_device_name(),
        "arch": args.model_dir or args.arch,
        "dtype": dtype,
        "startup_s": startup_s,
        "update_weights_s": update_s,
        "tokens_per_s": rate,
        "checks": report.checks,
        "ok": report.ok,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", choices=["llama", "qwen2"], default="llama", help="tiny model built here")
    parser.add_argument("--model-dir", help="a local HF model directory instead of a tiny model")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--json", metavar="PATH", help="also write the summary here")
    args = parser.parse_args(argv)
    try:
        summary = run(args)
    except EngineUnavailable as exc:
        print(f"vllm smoke test not run: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({k: v for k, v in summary.items() if k != "checks"}))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1), encoding="utf-8")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
