"""Cheating rollout workers as real processes: how many batches a learner takes before it drops each.

Question (#20): a learner spot-checks 25% of each worker's batches, one group each, 16 tokens a
check (the defaults), and deactivates a worker at its first failed check. Each cheat is a real
worker process (``swarmnode.testing.cheaters``: the real ``WorkerNode`` with its engine wrapped)
that reports honest log-probs for what it sends, so only the token checks against keyed sampling
can catch it: greedy decoding, temperature 0.7, weights at least 2 versions older than the one
it claims, a cheaper network (the first layer of the claimed one), replaying its first batch; and a
log-prob liar for reference. Target: each caught within 3 spot-checked batches; an honest worker
never failed; the checking's share of the learner's busy time.

Setup: one swarm per run on 127.0.0.1 (bootstrap, learner with every worker activated and 4
groups per step, one honest worker, one worker of each cheat kind), the built-in tiny model
warm-started on the default mixture (cached under --cache), 4 groups of 4 completions per batch,
until every cheat is deactivated. "batches" counts the learner's batches from the cheat, from
the first one it cheated in (``stale`` is honest until it holds a version 2 behind, ``replay``
sends its first batch honestly), "checked" the spot-checked ones among them (the learner numbers
a worker's batches as they reach it, the cheat as it sends them: the same unless one was lost).

    python bench/cheaters.py [--runs 2] [--rate 0.25] [--tokens 16] [--json out.json]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import base_parser, machine, print_table, write_json

from swarmnode.policy import warm_start
from swarmnode.tasks import default_mixture
from swarmnode.testing.cheaters import KINDS, run_cheaters


def main() -> int:
    parser = base_parser(__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=2, help="swarms run (new seeds and secrets each)")
    parser.add_argument("--rate", type=float, default=0.25, help="share of batches spot-checked")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per spot check")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds per run")
    parser.add_argument("--cache", type=Path, default=Path("runs/bench"), help="warm-start cache")
    args = parser.parse_args()
    t0 = time.perf_counter()
    model = warm_start(args.cache, default_mixture(0), 0)
    kinds = args.kinds.split(",")
    runs: list[dict[str, Any]] = []
    for run in range(args.runs):
        print(f"run {run + 1}/{args.runs}", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            runs.append(
                run_cheaters(
                    Path(tmp),
                    model,
                    kinds,
                    rate=args.rate,
                    tokens=args.tokens,
                    timeout=args.timeout,
                    say=lambda line: print(line, flush=True),
                )
            )
    rows = []
    for kind in kinds:
        batches, checked, how, trained = [], [], set(), 0
        for r in runs:
            cheat = r["cheats"][kind]
            record = cheat["record"] or {}
            after = record.get("first_deactivated_after")
            trained += cheat["trained_completions"]
            if after is None:  # never reached a spot check: refused at intake
                how.add(f"intake ({cheat['deactivated_reason'] or 'refused'})")
                batches.append("-")
                checked.append("-")
                continue
            how.add("spot check: log-probs" if record.get("tokens_checked", 0) == 0 else "spot check: tokens")
            start = cheat["cheating_from_batch"] or 1
            batches.append(str(after["batches"] - start + 1))
            # checked batches from the first it cheated in (its recent ones: at most the last 16)
            recent = [b for b in record["recent_checked_batches"] if b <= after["batches"]]
            n = sum(1 for b in recent if b >= start)
            checked.append(f"{n}+" if n == len(recent) == 16 else str(n))  # the record keeps the last 16
        rows.append([kind, "; ".join(sorted(how)), " ".join(batches), " ".join(checked), str(trained)])
    honest = [r["honest"] or {} for r in runs]
    clean = all(not h.get("convictions") for h in honest)
    rows.append(
        [
            "honest",
            "never dropped" if clean else "DEACTIVATED",
            " ".join(str(h.get("batches", 0)) for h in honest),
            " ".join(str(h.get("checked_batches", 0)) for h in honest),
            f"fails: {sum(h.get('fails', 0) for h in honest)}",
        ]
    )
    share = [r["learner"]["spot_check_share_of_busy"] for r in runs]
    print_table(
        f"cheating workers as processes: spot-check rate {args.rate:.0%} of batches, {args.tokens} tokens "
        f"per check, deactivated at the first failed check ({args.runs} runs, one value per run)",
        ["worker", "caught by", "batches until deactivated", "of them checked", "completions trained on"],
        rows,
        [
            "target: caught within 3 spot-checked batches; honest: 0 fails (its row: batches and checked "
            "batches in all).",
            "refused at intake: replayed groups are duplicates of ones the learner already took from "
            "the same signer; the learner then bans it.",
            "checking's share of the learner's busy time: "
            + ", ".join(f"{s:.1%}" if s is not None else "-" for s in share),
        ],
    )
    write_json(args.json, {"machine": machine(), "runs": runs, "seconds": time.perf_counter() - t0})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
