"""A solo training process killed with SIGKILL reopens consistently and resumes where it committed."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

from swarmnode.store import CheckpointStore, Ledger
from swarmnode.testing import Proc, spawn, wait_until

EVERY = 3


def start(home: Path, log: Path) -> Proc:
    return spawn("solo", start_args(home)[1:], log, env={"OMP_NUM_THREADS": "1"})


def committed_rounds(ledger_path: Path) -> int:
    if not ledger_path.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{ledger_path}?mode=ro", uri=True, timeout=1) as conn:
            row = conn.execute("SELECT max(round) FROM rounds").fetchone()
    except sqlite3.Error:
        return 0
    return int(row[0] or 0)


def test_sigkill_mid_run_then_restart_loses_no_committed_round(tmp_path: Path) -> None:
    home = tmp_path / "home"
    for trial, kill_after in enumerate((EVERY + 1, 2 * EVERY + 2)):
        proc = start(home, tmp_path / f"solo-{trial}.log")
        wait_until(
            lambda: committed_rounds(home / "ledger.sqlite") >= kill_after,  # noqa: B023 (called at once)
            120,
            f"{kill_after} committed rounds",
            procs=[proc],
            interval=0.05,
        )
        proc.kill_group(signal.SIGKILL)
        proc.popen.wait(timeout=30)

        state = CheckpointStore(home / "checkpoints").load_latest()
        assert state is not None, f"trial {trial}: no verified checkpoint after the kill"
        with Ledger(home / "ledger.sqlite") as ledger:
            last = ledger.last_round() or 0
            rows = [r.round for r in ledger.rounds()]
        assert rows == list(range(1, last + 1)), "committed rounds have no gaps"
        assert state.round <= last <= state.round + EVERY

        # Restart: it resumes from the checkpoint and the redone rounds continue the ledger.
        done = subprocess.run(
            [*start_args(home), "--max-rounds", "2"],
            capture_output=True,
            text=True,
            timeout=180,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"resumed at round {state.round}" in done.stdout
        with Ledger(home / "ledger.sqlite") as ledger:
            rows = [r.round for r in ledger.rounds()]
        assert rows == list(range(1, state.round + 3))


def start_args(home: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "swarmnode.cli",
        "run",
        "--home",
        str(home),
        "--solo",
        "--set",
        "model.warm_start=false",
        "--set",
        f"checkpoint.every_rounds={EVERY}",
        "--set",
        "tasks.heldout_size=8",
        "--set",
        "node.threads=1",
        "--set",
        "rollout.prompts_per_round=4",
        "--set",
        "rollout.group_size=4",
    ]
