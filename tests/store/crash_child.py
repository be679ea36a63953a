"""Child process for test_crash_consistency: trains a small real model, recording every round.

Usage: python crash_child.py HOME [--stop-after-round N]   (one training run)
       python crash_child.py --serve                        (a fork launcher, see below)

The training run follows the restart recipe and the crash invariant documented in ``swarmnode.store``:
resume from the newest verified checkpoint (or from scratch), forget ledger rounds after it,
then for each round commit the ledger row first and write the checkpoint second. Prints
``ready <first round> <pid>`` once it starts looping, so the parent knows when to start its clock.
Each ledger row carries an exact fingerprint of the model after that round
(``extra["state_digest"]``), so the parent can match rows against checkpoints.

``--serve`` exists to keep the test fast on 2 cores: importing torch costs ~2 s, so one
launcher imports everything once and forks a fresh training process per stdin line
``run<TAB>HOME[<TAB>STOP]``, printing ``exit <status>`` when it ends (``-9`` once SIGKILLed).
It never runs a torch op itself, so forking it is safe.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

import torch
from tiny_tied_lm import TiedLM, make_optimizer, state_digest, train_step

from swarmnode.store import (
    CheckpointState,
    CheckpointStore,
    Ledger,
    RoundRecord,
    capture_rng_state,
    restore_rng_state,
)

KEEP = 2


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("home", type=Path)
    parser.add_argument("--stop-after-round", type=int, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # bit-for-bit reproducible steps, and polite to the shared cores

    torch.manual_seed(0)
    model = TiedLM()
    optimizer = make_optimizer(model)
    store = CheckpointStore(args.home / "checkpoints", keep=KEEP)
    with Ledger(args.home / "ledger.sqlite") as ledger:
        state = store.load_latest()
        if state is None:
            start = 1
        else:
            model.load_state_dict(state.model_state)
            optimizer.load_state_dict(state.optimizer_state)
            restore_rng_state(state.rng_state)
            start = state.round + 1
        ledger.truncate_after(start - 1)
        print(f"ready {start} {os.getpid()}", flush=True)

        r = start
        while args.stop_after_round is None or r <= args.stop_after_round:
            began = time.time()
            loss = train_step(model, optimizer)
            model_state = model.state_dict()
            ledger.record_round(  # 1. the ledger first ...
                RoundRecord(
                    round=r,
                    started_at=began,
                    seconds=time.time() - began,
                    mean_reward=-loss,
                    accuracy=0.0,
                    tokens_generated=16 * 8,
                    loss=loss,
                    policy_version=r,
                    extra={"state_digest": state_digest(model_state)},
                )
            )
            store.save(  # 2. ... the checkpoint second
                CheckpointState(
                    round=r,
                    policy_version=r,
                    model_state=model_state,
                    optimizer_state=optimizer.state_dict(),
                    rng_state=capture_rng_state(),
                )
            )
            r += 1
    return 0


def serve() -> int:
    # Constructing an optimizer imports torch._dynamo (~3 s here): pay for it once, before forking.
    import torch._dynamo

    torch.set_num_threads(1)
    for line in sys.stdin:
        words = line.rstrip("\n").split("\t")
        if not words[0]:
            continue
        argv = [words[1]] + (["--stop-after-round", words[2]] if len(words) > 2 else [])
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = main(argv)
            except BaseException:
                traceback.print_exc()  # to the test's log; the exit status says it failed
                raise
            finally:
                # Whatever happened, the forked process ends here: it must never fall back
                # into the launcher's loop.
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(f"exit {os.waitstatus_to_exitcode(status)}", flush=True)
    # Skip interpreter teardown (over a second with torch loaded): nothing is left to flush.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(serve() if sys.argv[1:] == ["--serve"] else main(sys.argv[1:]))
