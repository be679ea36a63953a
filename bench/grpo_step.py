"""One full GRPO iteration (generate, score, update) on a built-in model: ours vs TRL's GRPOTrainer.

Same model weights, same tokenizer, same prompts per step (8), group size (8),
completion cap, temperature 1, one AdamW step per iteration, no KL, every group
trained on. Three prompt formats: ``compact`` (``58+26=``, what the tiny model
trains on; 8 new tokens) and ``question`` (reasoning-gym's chain_sum question,
about 70 tokens; 16 new tokens) on the tiny model, and ``chat`` (the question as the user
turn after the default system prompt, through the built-in chat model's ChatML template;
128 new tokens: at random init rows run to the cap, the long completions of a real model).
Ours runs twice, with the shared-prefix update
(``learn.shared_prefix``, the default: each group's prompt scored once) and
without it (one row per completion), alternating iteration by iteration so both
see the same background load. Reports completions per second (median over the
timed iterations, after warm-up), the update's share of an iteration, and the
update's achieved GFLOP/s beside a matmul roofline measured in the same run on
the same threads: ``6 * N * T`` FLOPs (N non-embedding parameters, T the tokens
the update must score: each group's prompt once plus its completions; attention
and the lm head are left out), against ``torch.mm`` at the model's own
``(tokens x hidden) @ (hidden x intermediate)`` shape and at 1024^3.
Run it alone: on 2 cores any other busy process distorts the figures.

    python bench/grpo_step.py [--repeats 7] [--formats compact,question] [--json out.json]
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    base_parser,
    machine,
    matmul_gflops,
    median,
    non_embedding_parameters,
    print_table,
    write_json,
)

from swarmnode.config import DEFAULT_SYSTEM_PROMPT, Config, load_config
from swarmnode.policy import build_tiny_policy, load_policy, save_policy
from swarmnode.policy.chat import chat_messages
from swarmnode.policy.chat_model import build_chat_policy
from swarmnode.rollout import make_engine
from swarmnode.store import CheckpointStore, Ledger
from swarmnode.tasks import DatasetSpec, TaskMixture, score_completion
from swarmnode.train import Trainer

PROMPTS, G = 8, 8
NEW_TOKENS = {"compact": 8, "question": 16, "chat": 128}
#: The task prompt format of each bench format: ``chat`` asks reasoning-gym's question through the
#: built-in chat model's template and default system prompt (our policy renders it; TRL gets the
#: same system and user turns as a conversational dataset and renders it with the same template).
TASK_FORMAT = {"compact": "compact", "question": "question", "chat": "question"}
CHAIN_SUM = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}


def mixture(prompt_format: str) -> TaskMixture:
    return TaskMixture([DatasetSpec("chain_sum", CHAIN_SUM, 1.0, TASK_FORMAT[prompt_format])], seed=0)


def ours_config(max_new: int, shared: bool, precision: str = "fp32") -> Config:
    return load_config(
        None,
        environ={},
        overrides={
            "rollout.prompts_per_round": PROMPTS,
            "rollout.group_size": G,
            "rollout.max_new_tokens": max_new,
            "tasks.heldout_size": 0,
            "checkpoint.every_rounds": 10**6,
            "learn.drop_zero_advantage": False,  # TRL trains on every group; so do we here
            "learn.shared_prefix": shared,
            "learn.precision": precision,
        },
    )


def every_row(advantages: torch.Tensor, *, every_row: bool) -> list[int]:
    """``Trainer._rows_to_score`` that runs every row, as TRL does (like for like)."""
    return list(range(len(advantages)))


def bench_ours(
    model_dir: Path, prompt_format: str, repeats: int, warmup: int, precision: str = "fp32"
) -> dict[str, dict[str, Any]]:
    """Per variant: seconds per iteration, per update, and the tokens each update scored."""
    max_new = NEW_TOKENS[prompt_format]
    variants = {"shared": True, "unshared": False}
    out: dict[str, dict[str, Any]] = {
        name: {"iteration_s": [], "update_s": [], "tokens_needed": [], "tokens_run": []} for name in variants
    }
    with tempfile.TemporaryDirectory() as tmp:
        trainers = {}
        for name, shared in variants.items():
            policy = load_policy(model_dir)
            ledger = Ledger(Path(tmp) / f"{name}.sqlite")
            trainers[name] = (
                Trainer(
                    ours_config(max_new, shared, precision),
                    policy,
                    make_engine("torch", policy),
                    mixture(prompt_format),
                    ledger,
                    CheckpointStore(Path(tmp) / f"ckpt-{name}"),
                ),
                ledger,
            )
        for trainer, _ in trainers.values():
            # TRL runs every row through the model; ours skips rows whose advantage is 0 (most of
            # them at random init), which would time a smaller update than the FLOPs counted here.
            trainer._rows_to_score = every_row  # type: ignore[method-assign]
        for i in range(warmup + repeats):
            for name, (trainer, _) in trainers.items():
                t0 = time.perf_counter()
                own, tokens, gen_seconds = trainer.generate_groups(trainer.round + 1)
                t1 = time.perf_counter()
                trainer.train_round(own, tokens=tokens, gen_seconds=gen_seconds)
                t2 = time.perf_counter()
                if i >= warmup:
                    record = out[name]
                    record["iteration_s"].append(t2 - t0)
                    record["update_s"].append(t2 - t1)
                    completion = sum(len(c) for g in own for c in g.completion_ids)
                    record["tokens_needed"].append(sum(len(g.prompt_ids) for g in own) + completion)
                    record["tokens_run"].append(
                        sum(len(g.prompt_ids) * g.size for g in own) + completion
                        if name == "unshared"
                        else sum(len(g.prompt_ids) for g in own) + completion
                    )
        for _, ledger in trainers.values():
            ledger.close()
    return out


def bench_trl(
    model_dir: Path, prompt_format: str, repeats: int, warmup: int, precision: str = "fp32"
) -> list[float]:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    policy = load_policy(model_dir)
    tasks = [t for r in range(warmup + repeats + 2) for t in mixture(prompt_format).sample(r + 1, PROMPTS)]
    by_prompt = {t.prompt: t for t in tasks}
    if prompt_format == "chat":  # conversational: TRL renders the turns with the model's template
        dataset = Dataset.from_list(
            [{"prompt": chat_messages(t.prompt, DEFAULT_SYSTEM_PROMPT)} for t in tasks]
        )
    else:
        dataset = Dataset.from_list([{"prompt": t.prompt} for t in tasks])

    def text(turns: Any) -> str:  # a conversational prompt or completion is a list of turns
        return str(turns if isinstance(turns, str) else turns[-1]["content"])

    def reward(prompts: list[Any], completions: list[Any], **_: object) -> list[float]:
        return [
            score_completion(by_prompt[text(p)], text(c)) for p, c in zip(prompts, completions, strict=True)
        ]

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self._t0 = 0.0

        def on_step_begin(self, *args: object, **kwargs: object) -> None:
            self._t0 = time.perf_counter()

        def on_step_end(self, *args: object, **kwargs: object) -> None:
            self.times.append(time.perf_counter() - self._t0)

    timer = StepTimer()
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=PROMPTS * G,
            num_generations=G,
            max_completion_length=NEW_TOKENS[prompt_format],
            learning_rate=1e-4,
            beta=0.0,
            temperature=1.0,
            max_steps=warmup + repeats,
            logging_steps=10**6,
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            bf16=precision == "bf16",  # autocast on CPU, as ours
            shuffle_dataset=False,
            dataloader_num_workers=0,
            disable_tqdm=True,
        )
        trainer = GRPOTrainer(
            model=policy.model,
            reward_funcs=reward,
            args=args,
            train_dataset=dataset,
            processing_class=policy.tokenizer,
            callbacks=[timer],
        )
        trainer.train()
    return timer.times[warmup:]


def model_shape(model_dir: Path) -> tuple[int, int, int]:
    """(non-embedding parameters, hidden size, intermediate size) of the saved model."""
    model = load_policy(model_dir).model
    config: Any = model.config
    return non_embedding_parameters(model), int(config.hidden_size), int(config.intermediate_size)


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        default="fp32",
        help="the updates' arithmetic, both sides (ours: learn.precision; TRL: bf16=True)",
    )
    parser.add_argument(
        "--formats", default="compact,question,chat", help="comma list of: compact, question, chat"
    )
    parser.set_defaults(repeats=7)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    logging.disable(logging.WARNING)
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    for f in formats:
        if f not in NEW_TOKENS:
            parser.error(f"--formats: unknown format {f!r}; choose from {', '.join(NEW_TOKENS)}")
    info = machine()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for prompt_format in formats:
            model_dir = Path(tmp) / ("chat" if prompt_format == "chat" else "tiny")
            if not model_dir.exists():
                # chat: the built-in chat model (random init: rows run to the 128-token cap on both sides)
                built = build_chat_policy(0) if prompt_format == "chat" else build_tiny_policy(0)
                # Question prompts run past the tiny config's 64 positions; RoPE has no table limit.
                built.model.config.max_position_embeddings = max(
                    built.model.config.max_position_embeddings, 512
                )
                save_policy(built, model_dir)
            params, hidden, intermediate = model_shape(model_dir)
            ours = bench_ours(model_dir, prompt_format, args.repeats, args.warmup, args.precision)
            trl = bench_trl(model_dir, prompt_format, args.repeats, args.warmup, args.precision)
            tokens = int(median([float(t) for t in ours["shared"]["tokens_run"]]))
            roofline_shape = matmul_gflops(tokens, hidden, intermediate)
            roofline_peak = matmul_gflops(1024, 1024, 1024)
            n = PROMPTS * G
            trl_sps = n / median(trl)
            row: dict[str, Any] = {
                "prompt_format": prompt_format,
                "model": "built-in chat" if prompt_format == "chat" else "tiny",
                "max_new_tokens": NEW_TOKENS[prompt_format],
                "trl_seconds": trl,
                "trl_samples_per_s": trl_sps,
                "roofline_gflops_model_shape": roofline_shape,
                "roofline_gflops_1024": roofline_peak,
                "roofline_shape": [tokens, hidden, intermediate],
            }
            for name, record in ours.items():
                update = median(record["update_s"])
                needed = median([float(t) for t in record["tokens_needed"]])
                gflops = 6 * params * needed / update / 1e9
                row[name] = {
                    **record,
                    "samples_per_s": n / median(record["iteration_s"]),
                    "update_median_s": update,
                    "update_share": update / median(record["iteration_s"]),
                    "update_gflops": gflops,
                    "update_fraction_of_roofline": gflops / roofline_shape,
                    "vs_trl": n / median(record["iteration_s"]) / trl_sps,
                }
            row["shared_vs_unshared_update"] = (
                row["unshared"]["update_median_s"] / row["shared"]["update_median_s"]
            )
            results.append(row)
    for row in results:
        print_table(
            f"GRPO iteration, {row['model']} model, {PROMPTS} prompts x {G} samples, "
            f"{row['prompt_format']} prompts, "
            f"{row['max_new_tokens']} new tokens max",
            ["implementation", "s/iter", "samples/s", "vs TRL", "update s", "update GFLOP/s", "of roofline"],
            [
                *(
                    [
                        f"swarmnode, {name} prefix",
                        f"{median(row[name]['iteration_s']):.3f}",
                        f"{row[name]['samples_per_s']:.1f}",
                        f"{row[name]['vs_trl']:.2f}x",
                        f"{row[name]['update_median_s']:.3f}",
                        f"{row[name]['update_gflops']:.2f}",
                        f"{row[name]['update_fraction_of_roofline']:.1%}",
                    ]
                    for name in ("shared", "unshared")
                ),
                [
                    "TRL GRPOTrainer",
                    f"{median(row['trl_seconds']):.3f}",
                    f"{row['trl_samples_per_s']:.1f}",
                    "1.00x",
                    "",
                    "",
                    "",
                ],
            ],
            [
                f"shared-prefix update {row['shared_vs_unshared_update']:.2f}x faster than unshared; "
                f"matmul roofline {row['roofline_gflops_model_shape']:.1f} GFLOP/s at "
                f"{'x'.join(map(str, row['roofline_shape']))}, {row['roofline_gflops_1024']:.1f} at 1024^3",
                f"machine: {info['cores']} cores, torch {info['torch']} ({info['torch_threads']} threads), "
                f"{args.repeats} timed iterations after {args.warmup} warm-up; updates in {args.precision} "
                "(the roofline is float32 torch.mm's)",
                "",
            ],
        )
    write_json(
        args.json,
        {
            "bench": "grpo_step",
            "settings": {
                "prompts": PROMPTS,
                "group_size": G,
                "max_new_tokens": NEW_TOKENS,
                "precision": args.precision,
            },
            "machine": info,
            "non_embedding_parameters": params,
            "results": results,
        },
    )


if __name__ == "__main__":
    main()
