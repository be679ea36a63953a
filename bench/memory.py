"""Peak memory of one GRPO update at Qwen2.5-0.5B's shape: full fine-tuning vs LoRA vs LoRA + gradient
checkpointing (#15 item 4).

Question: how much RAM does a node need to train a model of the size its users bring? Each case runs
in a fresh process (``--case NAME``) and reports its resident set before the step and the peak during
the step (VmHWM, reset just before it: a random init's own transient peak is not the step's); it
builds a Qwen2
model from Qwen2.5-0.5B's config (random weights: no download; same tensors, same memory),
applies the case's ``learn`` settings through ``roles.common.train_setup`` (the node's own path),
and runs the node's ``Trainer.train_round`` on 8 groups x 8 completions of 128 random tokens
(64-token prompts; rewards 1/0 alternating so every group has an advantage): the real loss, the
real optimizer step (AdamW: its moments are created in this step, as in a node's first round).

Reference: the parameter memory itself (fp32 weights, printed as "model") and the 16 bytes per
parameter of full fine-tuning with AdamW (weights + gradients + two moments) that the README used
to quote; the targets of the issue: LoRA + checkpointing under 3 GiB.

    python bench/memory.py [--cases full,lora,lora+ckpt] [--shape 0.5b|small] [--json out.json]

One case takes 5-8 minutes on 2 cores at the 0.5 B shape (the step is compute-bound: ~17-26 TFLOP).
``--shape small`` is a 4-layer model of the same widths, a check that the script runs.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import base_parser, machine, print_table, write_json

#: Qwen2.5-0.5B-Instruct's config.json (the architecture fields; the weights are random here).
QWEN25_05B: dict[str, Any] = {
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "attn_implementation": "sdpa",
}
SHAPES = {"0.5b": QWEN25_05B, "small": {**QWEN25_05B, "num_hidden_layers": 4}}
LORA = {"learn.lora_rank": 16, "learn.lora_alpha": 32.0}
CKPT = {"learn.gradient_checkpointing": True}
MICRO = {"learn.micro_batch_tokens": 1100}  # one group (64 + 8 x 128 tokens) at a time
CASES: dict[str, dict[str, Any]] = {
    "full": {},
    "full+ckpt+micro": {**CKPT, **MICRO},
    "lora": LORA,
    "lora+ckpt": {**LORA, **CKPT},
    "lora+micro": {**LORA, **MICRO},
    "lora+ckpt+micro": {**LORA, **CKPT, **MICRO},
    # glibc returns every freed block of 64 KiB or more to the kernel (node.malloc_mmap_threshold_kib)
    "lora+ckpt+micro+mmap64k": {**LORA, **CKPT, **MICRO, "node.malloc_mmap_threshold_kib": 64},
    "lora+ckpt+micro+mmap1m": {**LORA, **CKPT, **MICRO, "node.malloc_mmap_threshold_kib": 1024},
    "full+ckpt+micro+mmap64k": {**CKPT, **MICRO, "node.malloc_mmap_threshold_kib": 64},
    # the update's forward and backward in bfloat16, float32 weights (learn.precision)
    "lora+ckpt+micro+bf16": {**LORA, **CKPT, **MICRO, "learn.precision": "bf16"},
    "full+ckpt+micro+bf16": {**CKPT, **MICRO, "learn.precision": "bf16"},
}
GROUPS, GROUP_SIZE, PROMPT_TOKENS, COMPLETION_TOKENS = 8, 8, 64, 128
GIB = 1024**3


def rss_gib() -> float:
    """This process's peak resident set so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB


def reset_peak() -> None:
    """Start VmHWM (the peak resident set) afresh from the current RSS (Linux >= 4.0)."""
    Path("/proc/self/clear_refs").write_text("5")


def memory_status() -> dict[str, float]:
    """This process's peak and current resident memory from /proc (GiB): VmHWM (peak), VmRSS, and
    VmRSS split into RssAnon (private: what the process itself holds) and RssFile (pages of mapped
    files, e.g. an archived version being served: clean, the kernel may drop them)."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
            out[key] = round(int(value.split()[0]) * 1024 / GIB, 3)
    return out


def learner_case(archived: bool, shape: str, threads: int) -> dict[str, Any]:
    """A learner's memory at S = 8 (full fine-tuning, the learner's default): the live model, AdamW's
    state after a step, S + 1 = 9 published versions (``WeightPublisher``, on disk and memory-mapped,
    or in memory as before), and the spot checks' scratch copy loaded with the oldest version."""
    import asyncio

    import torch

    from swarmnode.broadcast.driver import load_blob_into
    from swarmnode.broadcast.weights import WeightPublisher
    from swarmnode.identity import NodeIdentity
    from swarmnode.net.dataplane import DataPlane
    from swarmnode.ops.metrics import Metrics
    from swarmnode.policy.lora import plain_copy

    if threads:
        torch.set_num_threads(threads)
    staleness = 8
    trainer, groups, parameters, _ = build_trainer(shape, {}, completion_tokens=16, groups=1)
    reset_peak()
    trainer.train_round(groups)  # AdamW's moments exist from here on, as in a running learner
    model = trainer.policy.model
    after_step = memory_status()
    reset_peak()  # from here: publishing S + 1 versions and a spot check's load
    scratch_dir = Path(tempfile.mkdtemp(prefix="swarmnode-bench-archive-"))

    async def publish_all() -> dict[str, float]:
        identity = NodeIdentity.from_seed(b"\x07" * 32)
        dataplane = DataPlane(identity)
        await dataplane.start()
        publisher = WeightPublisher(
            identity, dataplane, "bench", 1 << 20, keep=staleness + 1, metrics=Metrics(),
            archive=scratch_dir / "published" if archived else None,
        )  # fmt: skip
        await publisher.start()
        try:
            first = next(model.parameters())
            for version in range(staleness + 1):
                with torch.no_grad():
                    first.add_(1e-3)  # a new version (the bytes differ; the size is what counts)
                publisher.publish(version, model)
            scratch = plain_copy(model)
            oldest = publisher.weights_of(0)
            assert oldest is not None
            # a spot check of a group made under the oldest version
            load_blob_into(scratch, oldest[0], oldest[1].tensors)
            return memory_status()
        finally:
            await publisher.close()
            await dataplane.close()

    try:
        final = asyncio.run(publish_all())
    finally:
        shutil.rmtree(scratch_dir, ignore_errors=True)
    model_gib = parameters * 4 / GIB
    return {
        "case": "learner-archive-on-disk" if archived else "learner-archive-in-memory",
        "shape": shape,
        "parameters": parameters,
        "staleness_bound": staleness,
        "model_gib": round(model_gib, 3),
        "after_step": after_step,
        "after_publishing": final,
        "peak_rss_gib": final["VmHWM"],
        "target_gib": round(model_gib * 5, 3),  # model + AdamW (2 copies) + 2 copies
    }


def model_of_shape(shape: str) -> Any:
    """A Qwen2 model of ``SHAPES[shape]``'s config, random weights (seed 0): no download."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    fields = dict(SHAPES[shape])
    model_type, attn = fields.pop("model_type"), fields.pop("attn_implementation")
    return AutoModelForCausalLM.from_config(
        AutoConfig.for_model(model_type, **fields), attn_implementation=attn
    )


def build_trainer(
    shape: str, settings: dict[str, Any], *, completion_tokens: int = COMPLETION_TOKENS, groups: int = GROUPS
) -> tuple[Any, list[Any], int, int]:
    """A ``Trainer`` on a random model of ``shape`` with ``settings`` applied as a node applies
    them, ``groups`` groups of random tokens for it, the parameter and trainable counts."""
    import torch

    from swarmnode.config import load_config
    from swarmnode.policy.chat_model import load_chat_tokenizer
    from swarmnode.policy.model import Policy
    from swarmnode.roles.common import configure_threads, train_setup
    from swarmnode.rollout import make_engine
    from swarmnode.store import CheckpointStore, Ledger
    from swarmnode.tasks import default_mixture
    from swarmnode.train import ScoredGroup, Trainer

    model = model_of_shape(shape)
    parameters = sum(p.numel() for p in model.parameters())
    overrides: dict[str, Any] = {
        "rollout.group_size": GROUP_SIZE,
        "rollout.prompts_per_round": groups,
        "checkpoint.every_rounds": 1000,
        "tasks.heldout_size": 1,
        **settings,
    }
    config = load_config(None, environ={}, overrides=overrides)
    configure_threads(config)  # the node's process settings (node.malloc_mmap_threshold_kib)
    policy = Policy(model=model, tokenizer=load_chat_tokenizer(), model_id=f"bench-{shape}")
    train_setup(config, policy)
    trainable = sum(p.numel() for p in policy.model.parameters() if p.requires_grad)
    mixture = default_mixture(0)
    task = mixture.sample(1, 1)[0]  # the tokens are random; a task only labels the groups
    generator = torch.Generator().manual_seed(1)
    vocab = int(SHAPES[shape]["vocab_size"])

    def tokens(n: int) -> list[int]:
        return torch.randint(10, vocab, (n,), generator=generator).tolist()

    batch = [
        ScoredGroup(
            task=task,
            prompt_ids=tokens(PROMPT_TOKENS),
            completion_ids=[tokens(completion_tokens) for _ in range(GROUP_SIZE)],
            behaviour_logprobs=[[-1.0] * completion_tokens for _ in range(GROUP_SIZE)],
            texts=[""] * GROUP_SIZE,
            rewards=[float(i % 2) for i in range(GROUP_SIZE)],
            policy_version=0,
        )
        for _ in range(groups)
    ]
    scratch = Path(tempfile.mkdtemp(prefix="swarmnode-bench-memory-"))
    ledger = Ledger(scratch / "ledger.sqlite")
    checkpoints = CheckpointStore(scratch / "checkpoints")
    trainer = Trainer(
        config, policy, make_engine("torch", policy), mixture, ledger, checkpoints, eval_every=10**9
    )
    return trainer, batch, parameters, trainable


def one_case(case: str, shape: str, threads: int) -> dict[str, Any]:
    """Run ``case`` in this process; its figures."""
    import torch

    if case.startswith("learner"):
        return learner_case(case == "learner-archive-on-disk", shape, threads)
    if threads:
        torch.set_num_threads(threads)
    trainer, groups, parameters, trainable = build_trainer(shape, CASES[case])
    before = memory_status()
    reset_peak()  # the step's own peak, not the model's construction (random init has its own)
    started = time.perf_counter()
    metrics = trainer.train_round(groups)
    seconds = time.perf_counter() - started
    after = memory_status()
    shutil.rmtree(trainer.ledger.path.parent, ignore_errors=True)
    if not metrics.groups_used:
        raise SystemExit(f"{case}: the step trained on nothing")
    return {
        "case": case,
        "shape": shape,
        "parameters": parameters,
        "trainable": trainable,
        "settings": CASES[case],
        "rss_before_step_gib": before["VmRSS"],
        "step_peak_rss_gib": after["VmHWM"],
        "peak_rss_including_construction_gib": round(rss_gib(), 3),
        "step_seconds": round(seconds, 1),
        "loss": metrics.loss,
    }


LEARNER_CASES = ("learner-archive-in-memory", "learner-archive-on-disk")


def run_child(case: str, shape: str, threads: int) -> dict[str, Any]:
    """``case`` in a fresh process (its peak memory its own); its figures."""
    print(f"running {case} at the {shape} shape (a fresh process)...", file=sys.stderr, flush=True)
    command = [sys.executable, __file__, "--case", case, "--shape", shape, "--threads", str(threads)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:  # a result too: e.g. killed by the kernel for memory (exit -9)
        print(done.stderr[-4000:], file=sys.stderr)
        why = "killed (SIGKILL: out of memory?)" if done.returncode == -9 else f"exit {done.returncode}"
        return {"case": case, "shape": shape, "failed": why}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> int:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--cases",
        default="full+ckpt+micro,lora+ckpt,lora+ckpt+micro,learner",
        help=f"comma-separated, of {', '.join(CASES)} and learner (the learner's archive, both ways)",
    )
    parser.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # one case, in this process (the child)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(one_case(args.case, args.shape, args.threads)))
        return 0
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES and c != "learner"]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; choose from {', '.join(CASES)}, learner")
    learners: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    for case in [*(LEARNER_CASES if "learner" in cases else ()), *(c for c in cases if c in CASES)]:
        result = run_child(case, args.shape, args.threads)
        (learners if case in LEARNER_CASES else steps).append(result)
        # Written after every case: a long run keeps what it measured if a later case fails.
        write_json(
            args.json, {"machine": machine(), "shape": args.shape, "steps": steps, "learners": learners}
        )
    done = [r for r in [*steps, *learners] if "failed" not in r]
    if not done:
        raise SystemExit("every case failed")
    parameters = done[0]["parameters"]
    model_gib = parameters * 4 / GIB
    if steps:
        print_table(
            f"One GRPO update, {GROUPS} x {GROUP_SIZE} completions of {COMPLETION_TOKENS} tokens "
            f"({PROMPT_TOKENS}-token prompts), {args.shape} shape ({parameters:,} parameters, fp32)",
            ["case", "trainable", "RSS before the step GiB", "peak RSS during the step GiB", "step s"],
            [
                [
                    r["case"],
                    f"{r['trainable']:,}",
                    f"{r['rss_before_step_gib']:.2f}",
                    f"{r['step_peak_rss_gib']:.2f}",
                    f"{r['step_seconds']:.0f}",
                ]
                if "failed" not in r
                else [r["case"], r["failed"], "", "", ""]
                for r in steps
            ],
            [
                f"reference: fp32 weights {model_gib:.2f} GiB; full fine-tuning with AdamW at 16 bytes "
                f"per parameter {model_gib * 4:.2f} GiB before activations; target: LoRA + "
                "checkpointing under 3 GiB",
            ],
        )
    if learners:
        print_table(
            f"A learner at S = 8 (9 published versions, a spot check's scratch copy), {args.shape} shape, "
            "full fine-tuning after one step",
            ["archive", "peak RSS GiB", "RSS after GiB", "anonymous GiB", "file-backed GiB", "target GiB"],
            [
                [
                    r["case"].removeprefix("learner-archive-"),
                    f"{r['after_publishing']['VmHWM']:.2f}",
                    f"{r['after_publishing']['VmRSS']:.2f}",
                    f"{r['after_publishing']['RssAnon']:.2f}",
                    f"{r['after_publishing']['RssFile']:.2f}",
                    f"{r['target_gib']:.2f}",
                ]
                if "failed" not in r
                else [r["case"].removeprefix("learner-archive-"), r["failed"], "", "", "", ""]
                for r in learners
            ],
            [f"target: model + AdamW's two moments + 2 model copies = 5 x {model_gib:.2f} GiB"],
        )
    print(f"machine: {machine()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
