"""The reference for the specialists testbed (#14): how fast plain supervised training teaches a
specialist its peers' families, with nothing in the way (no swarm, no RL, fresh tasks every step).

A sharing rule learns from its peers' verified answers; the most it can hope for at a given step
size is what supervised training on the correct answers of the union gets in as many steps. This
starts from the testbed's warm start of one specialist (``simulations/scenarios/specialists.toml``,
the same cache), trains it with AdamW at ``--lr`` on ``--batch`` fresh tasks of the union a step
(loss on the answer and EOS tokens, as the warm start), and prints greedy held-out accuracy per
family (the testbed's held-out sets) every ``--eval-every`` steps:

    python simulations/imitation_bound.py --agent 0 --lr 1e-4 --steps 1000
    python simulations/imitation_bound.py --agent 0 --lr 1e-4 --steps 1000 --json

Writes ``simulations/results/specialists/imitation-bound/agent-<a>-lr-<lr>.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "simulations" / "results" / "specialists" / "imitation-bound"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agent", type=int, default=0, help="which specialist (its warm-start family)")
    p.add_argument("--lr", type=float, default=1e-4, help="AdamW lr (the testbed's RL step: 1e-4)")
    p.add_argument("--batch", type=int, default=64, help="distinct tasks per step")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--json", action="store_true", help="print the record as JSON at the end")
    args = p.parse_args(argv)

    from swarmnode.policy import load_policy
    from swarmnode.policy.evaluate import evaluate_accuracy
    from swarmnode.policy.warmstart import _batch
    from swarmnode.rollout.torch_engine import TorchEngine
    from swarmnode.sim.learning import _heldout_sets, cache_of, parse_learning, warm_policy, warm_start_keys

    torch.set_num_threads(1)  # as the testbed's runs
    scenario = tomllib.loads((ROOT / "simulations" / "scenarios" / "specialists.toml").read_text())
    spec = parse_learning(scenario)
    keys = warm_start_keys(spec)
    if not 0 <= args.agent < len(keys):
        p.error(f"--agent must be in [0, {len(keys) - 1}]")
    key = keys[args.agent]
    policy = load_policy(warm_policy(spec, key, cache_of(spec, ROOT), print))
    engine = TorchEngine(policy)
    sets = _heldout_sets(spec)
    mixture = spec.training_mixture(7)  # fresh tasks, a stream of their own

    def accuracy() -> dict[str, float]:
        policy.model.eval()
        scores = {
            family: evaluate_accuracy(policy, tasks, engine, max_new_tokens=spec.max_new_tokens)
            for family, tasks in sets.items()
        }
        policy.model.train()
        return scores

    curve: dict[int, dict[str, float]] = {0: accuracy()}
    print(f"{key[1]} specialist, step 0: {curve[0]}", flush=True)
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=args.lr, weight_decay=0.01)
    policy.model.train()
    started = time.perf_counter()
    for step in range(1, args.steps + 1):
        input_ids, labels = _batch(policy, mixture.sample(step, args.batch, stream="imitation-bound"))
        loss = policy.model(input_ids=input_ids, labels=labels).loss  # type: ignore[operator]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % args.eval_every == 0 or step == args.steps:
            curve[step] = accuracy()
            print(
                f"step {step}: loss {float(loss.detach()):.3f}, "
                + ", ".join(f"{f} {v:.2f}" for f, v in curve[step].items()),
                flush=True,
            )
    record: dict[str, Any] = {
        "specialist": key[1],
        "lr": args.lr,
        "batch": args.batch,
        "steps": args.steps,
        "heldout_size": spec.heldout_size,
        "heldout_by_step": curve,
        "train_seconds": round(time.perf_counter() - started, 1),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch thread, torch {torch.__version__}",
    }
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"agent-{args.agent}-lr-{args.lr:g}.json"
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path.relative_to(ROOT)}")
    if args.json:
        print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
