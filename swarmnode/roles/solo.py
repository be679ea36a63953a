"""Solo training: one node, no network. Builds the parts from a config and a home, then loops.

Ctrl-C (SIGINT) or SIGTERM finishes the round in progress, writes a checkpoint
and returns; nothing committed is lost.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from swarmnode.config import Config
from swarmnode.home import NodeHome
from swarmnode.roles.common import StopFlag, build_mixture, build_policy, configure_threads, role_engine
from swarmnode.store import CheckpointStore, Ledger
from swarmnode.train import RoundMetrics, Trainer

log = logging.getLogger(__name__)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def progress_line(m: RoundMetrics, heldout: float | None) -> str:
    return (
        f"round {m.round:5d} | reward {m.mean_reward:5.3f} | acc {m.accuracy:5.3f} | "
        f"held-out {_fmt(heldout, '5.3f')} | loss {_fmt(m.loss, '+7.4f')} | "
        f"{m.tokens_per_second:7.0f} tok/s | {m.seconds:5.2f} s"
    )


@dataclass
class SoloResult:
    rounds: list[RoundMetrics]
    start_heldout: float | None
    end_heldout: float | None
    stopped_by_user: bool


def run_solo(
    config: Config,
    home: NodeHome,
    *,
    max_rounds: int | None = None,
    max_seconds: float | None = None,
    summary_json: Path | None = None,
    out: TextIO = sys.stdout,
    install_signals: bool = True,
) -> SoloResult:
    home.ensure()
    configure_threads(config)
    mixture = build_mixture(config)
    policy = build_policy(config, home, mixture)
    engine = role_engine(config, policy)
    stop = StopFlag()
    if install_signals:
        stop.install()
    with Ledger(home.ledger) as ledger:
        trainer = Trainer(
            config, policy, engine, mixture, ledger, CheckpointStore(home.checkpoints, config.checkpoint.keep)
        )
        resumed = trainer.resume()
        first_round = trainer.round
        start_heldout = trainer.evaluate() if trainer.heldout else None
        print(
            f"{'resumed at' if resumed else 'starting'} round {first_round}; model {policy.model_id} "
            f"({sum(p.numel() for p in policy.model.parameters()) / 1e6:.2f} M params); "
            f"held-out accuracy {_fmt(start_heldout, '.3f')} on {len(trainer.heldout)} tasks",
            file=out,
            flush=True,
        )
        rounds: list[RoundMetrics] = []
        t0 = time.monotonic()
        stopped_by_user = False
        try:
            while True:
                if max_rounds is not None and len(rounds) >= max_rounds:
                    break
                if max_seconds is not None and time.monotonic() - t0 >= max_seconds:
                    break
                if stop.event.is_set():
                    stopped_by_user = True
                    break
                metrics = trainer.run_round()
                rounds.append(metrics)
                print(progress_line(metrics, metrics.heldout_accuracy), file=out, flush=True)
        finally:
            # Whatever stopped us (limit, Ctrl-C, an error), the committed work is kept; a round
            # cut short is not (it is redone from the last checkpoint).
            if rounds:
                trainer.save_checkpoint_if_consistent()
        end_heldout = trainer.evaluate() if trainer.heldout else None
        print(
            f"done: {len(rounds)} rounds in {time.monotonic() - t0:.1f} s; held-out accuracy "
            f"{_fmt(start_heldout, '.3f')} -> {_fmt(end_heldout, '.3f')}; "
            f"checkpoint at round {trainer.round}",
            file=out,
            flush=True,
        )
        if trainer.heldout and rounds:
            # The line above is one greedy pass over the node's few held-out tasks (a spread of about
            # +-7 points at 200): it read the chat model's real gain as flat (README, "Solo GRPO").
            print(
                "to measure the change against the start on more tasks, paired, greedy and sampled: "
                f"swarmnode evaluate --home {home.root} --tasks 1000 "
                "(with this run's --seed and --set flags)",
                file=out,
                flush=True,
            )
    result = SoloResult(rounds, start_heldout, end_heldout, stopped_by_user)
    if summary_json is not None:
        write_summary(summary_json, result)
    return result


def write_summary(path: Path, result: SoloResult) -> None:
    payload = {
        "start_heldout_accuracy": result.start_heldout,
        "end_heldout_accuracy": result.end_heldout,
        "stopped_by_user": result.stopped_by_user,
        "rounds": [
            {
                "round": m.round,
                "mean_reward": m.mean_reward,
                "accuracy": m.accuracy,
                "heldout_accuracy": m.heldout_accuracy,
                "tokens_generated": m.tokens_generated,
                "seconds": m.seconds,
                "loss": None if math.isnan(m.loss) else m.loss,
            }
            for m in result.rounds
        ],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1), encoding="utf-8")
