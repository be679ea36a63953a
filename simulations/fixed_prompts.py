"""Does the GRPO update learn at all? The node's own Trainer on the same prompts every round.

A solo run on the default mixture draws fresh prompts every round, and on the built-in models
neither the training reward nor held-out accuracy moves in 1,000 rounds (README, the built-in
chat model). That is either an update that does not learn, or learning that does not carry to
prompts not seen. This tells them apart: the node's ``Trainer`` (engine, scoring, advantages,
loss, AdamW: everything ``swarmnode run --solo`` runs) trains a saved policy on the SAME
``--prompts`` tasks every round; a working update raises their reward towards 1. Greedy held-out
accuracy on fresh tasks (the node's held-out set) is measured before and after.

    python simulations/fixed_prompts.py --model-dir HOME/models/chat-warm-<key> --lr 1e-4
    python simulations/fixed_prompts.py --model-dir DIR --lr 1e-3 --json out.json

``--model-dir``: a saved policy, e.g. the warm start a solo run cached in its home
(``swarmnode run --solo --set model.builtin=chat`` writes ``HOME/models/chat-warm-*``). One
thread, as the simulator's runs.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", type=Path, required=True, help="a saved policy (HF directory)")
    p.add_argument("--lr", type=float, default=1e-4, help="AdamW lr (learn.lr; the node's default 1e-4)")
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--prompts", type=int, default=16, help="tasks, the same every round")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="also write the record here")
    args = p.parse_args(argv)
    if not (args.model_dir / "config.json").is_file():
        p.error(f"--model-dir {args.model_dir}: no config.json there (not a saved policy)")
    if args.rounds < 1 or args.prompts < 1 or args.group_size < 2:
        p.error("--rounds and --prompts must be >= 1, --group-size >= 2")

    from swarmnode.config import load_config
    from swarmnode.policy import load_policy
    from swarmnode.rollout import make_engine
    from swarmnode.store import CheckpointStore, Ledger
    from swarmnode.tasks import default_mixture
    from swarmnode.train import Trainer

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    cfg = load_config(
        None,
        environ={},
        overrides={
            "rollout.prompts_per_round": args.prompts,
            "rollout.group_size": args.group_size,
            "rollout.max_new_tokens": args.max_new_tokens,
            "learn.lr": args.lr,
        },
    )
    policy = load_policy(args.model_dir)
    with tempfile.TemporaryDirectory() as scratch, Ledger(Path(scratch) / "ledger.sqlite") as ledger:
        trainer = Trainer(
            cfg,
            policy,
            make_engine("torch", policy),
            default_mixture(args.seed),
            ledger,
            CheckpointStore(Path(scratch) / "checkpoints"),
            eval_every=10**9,
        )
        trainer.generator.manual_seed(args.seed)
        fixed = trainer.mixture.sample(0, args.prompts)
        heldout_start = trainer.evaluate()
        print(f"held-out greedy accuracy at start: {heldout_start:.3f}", flush=True)
        rewards: list[float] = []
        lengths: list[float] = []
        task_sets: set[tuple[str, ...]] = set()  # the tasks each round trained on: one set if fixed
        # Every round's draw is the fixed tasks (the held-out set was drawn at construction).
        trainer.mixture.sample = lambda _r, _n, **_kw: fixed  # type: ignore[method-assign]
        started = time.perf_counter()
        for round_index in range(1, args.rounds + 1):
            own, _, _ = trainer.generate_groups(round_index)
            task_sets.add(tuple(g.task.id.key() for g in own))
            rewards.append(statistics.mean(r for g in own for r in g.rewards))
            lengths.append(statistics.mean(len(c) for g in own for c in g.completion_ids))
            trainer.train_round(own, [])
            if round_index % 20 == 0 or round_index == args.rounds:
                print(
                    f"round {round_index}: reward on the fixed prompts {statistics.mean(rewards[-20:]):.3f} "
                    f"(mean of the last 20), completion {lengths[-1]:.1f} tokens, "
                    f"{time.perf_counter() - started:.0f} s",
                    flush=True,
                )
        heldout_end = trainer.evaluate()
    print(f"held-out greedy accuracy: {heldout_start:.3f} -> {heldout_end:.3f}")
    record: dict[str, Any] = {
        "model_dir": str(args.model_dir),
        "lr": args.lr,
        "rounds": args.rounds,
        "prompts": args.prompts,
        "group_size": args.group_size,
        "max_new_tokens": args.max_new_tokens,
        "seed": args.seed,
        "reward_per_round": rewards,
        "completion_tokens_per_round": lengths,
        "distinct_task_sets": len(task_sets),
        "heldout_start": heldout_start,
        "heldout_end": heldout_end,
        "seconds": round(time.perf_counter() - started, 1),
        "machine": f"{platform.machine()}, 1 torch thread, torch {torch.__version__}",
    }
    if args.json is not None:
        args.json.write_text(json.dumps(record) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
