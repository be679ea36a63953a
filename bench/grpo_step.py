"""One full GRPO iteration (generate, score, update) on the tiny model: ours vs TRL's GRPOTrainer.

Same model weights, same tokenizer, same prompts per step (8), group size (8),
completion cap, temperature 1, one AdamW step per iteration, no KL. Reports
completions (samples) per second, median over the timed iterations, after warm-up.
Run it alone: on 2 cores any other busy process distorts the figures.

    python bench/grpo_step.py [--repeats 10] [--json out.json]
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import base_parser, machine, median, print_table, write_json

from swarmnode.config import Config, load_config
from swarmnode.policy import build_tiny_policy, load_policy, save_policy
from swarmnode.rollout import make_engine
from swarmnode.store import CheckpointStore, Ledger
from swarmnode.tasks import default_mixture, score_completion
from swarmnode.train import Trainer

PROMPTS, G, MAX_NEW = 8, 8, 8


def bench_ours(model_dir: Path, repeats: int, warmup: int) -> list[float]:
    config: Config = load_config(
        None,
        environ={},
        overrides={
            "rollout.prompts_per_round": PROMPTS,
            "rollout.group_size": G,
            "rollout.max_new_tokens": MAX_NEW,
            "tasks.heldout_size": 0,
            "checkpoint.every_rounds": 10**6,
            "learn.drop_zero_advantage": False,  # TRL trains on every group; so do we here
        },
    )
    policy = load_policy(model_dir)
    with tempfile.TemporaryDirectory() as tmp:
        with Ledger(Path(tmp) / "ledger.sqlite") as ledger:
            trainer = Trainer(
                config,
                policy,
                make_engine("torch", policy),
                default_mixture(0),
                ledger,
                CheckpointStore(Path(tmp) / "ckpt"),
            )
            times = []
            for i in range(warmup + repeats):
                t0 = time.perf_counter()
                trainer.run_round()
                if i >= warmup:
                    times.append(time.perf_counter() - t0)
    return times


def bench_trl(model_dir: Path, repeats: int, warmup: int) -> list[float]:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    policy = load_policy(model_dir)
    mixture = default_mixture(0)
    tasks = [t for r in range(warmup + repeats + 2) for t in mixture.sample(r, PROMPTS)]
    by_prompt = {t.prompt: t for t in tasks}
    dataset = Dataset.from_list([{"prompt": t.prompt} for t in tasks])

    def reward(prompts: list[str], completions: list[str], **_: object) -> list[float]:
        return [score_completion(by_prompt[p], c) for p, c in zip(prompts, completions, strict=True)]

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
            max_completion_length=MAX_NEW,
            learning_rate=1e-4,
            beta=0.0,
            temperature=1.0,
            max_steps=warmup + repeats,
            logging_steps=10**6,
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            bf16=False,
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


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    logging.disable(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "tiny"
        save_policy(build_tiny_policy(0), model_dir)
        ours = bench_ours(model_dir, args.repeats, args.warmup)
        trl = bench_trl(model_dir, args.repeats, args.warmup)
    n = PROMPTS * G
    ours_sps, trl_sps = n / median(ours), n / median(trl)
    info = machine()
    print_table(
        f"GRPO iteration, tiny model, {PROMPTS} prompts x {G} samples, {MAX_NEW} new tokens max",
        ["implementation", "median s/iter", "samples/s", "vs TRL"],
        [
            [
                "swarmnode (torch engine)",
                f"{median(ours):.3f}",
                f"{ours_sps:.1f}",
                f"{ours_sps / trl_sps:.2f}x",
            ],
            ["TRL GRPOTrainer", f"{median(trl):.3f}", f"{trl_sps:.1f}", "1.00x"],
        ],
        [
            f"machine: {info['cores']} cores, torch {info['torch']} ({info['torch_threads']} threads), "
            f"{args.repeats} timed iterations after {args.warmup} warm-up"
        ],
    )
    write_json(
        args.json,
        {
            "bench": "grpo_step",
            "settings": {"prompts": PROMPTS, "group_size": G, "max_new_tokens": MAX_NEW},
            "machine": info,
            "ours_seconds": ours,
            "trl_seconds": trl,
            "ours_samples_per_s": ours_sps,
            "trl_samples_per_s": trl_sps,
            "ratio": ours_sps / trl_sps,
        },
    )


if __name__ == "__main__":
    main()
