"""SIGKILL a training process at random instants: the ledger and the checkpoints always reopen consistently.

The invariant under test (documented in ``swarmnode.store``): the ledger row of round r is
committed before the checkpoint of round r is written. The child checkpoints every round,
so after any kill, with c the newest verified checkpoint's round (0 if none) and l the
ledger's last round (0 if none): c <= l <= c + 1, and ledger row c describes exactly the
model in checkpoint c. A restarted child resumes from c and redoes later rounds; because
the checkpoint holds the RNG state, a redone round reproduces the lost one bit for bit.

The training processes are forked by one launcher (tests/store/crash_child.py --serve)
that imports torch once, which keeps this test to a few seconds.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmnode.store import CheckpointStore, Ledger

from .tiny_tied_lm import state_digest

CHILD = Path(__file__).with_name("crash_child.py")
REPO_ROOT = Path(__file__).resolve().parents[2]
TRIALS = 10
KEEP = 2  # as in crash_child.py


class Launcher:
    """Drives ``crash_child.py --serve``: one training process at a time."""

    def __init__(self, log: Path) -> None:
        self.log = log
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
        env["OMP_NUM_THREADS"] = "1"
        with log.open("a") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, str(CHILD), "--serve"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                env=env,
            )

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"launcher died:\n{self.log.read_text()}"
        return line

    def start(self, home: Path, stop_after_round: int | None = None) -> int:
        """Start a training run; return its pid once it has begun its rounds."""
        assert self.proc.stdin is not None
        stop = "" if stop_after_round is None else f"\t{stop_after_round}"
        self.proc.stdin.write(f"run\t{home}{stop}\n")
        self.proc.stdin.flush()
        words = self._line().split()
        assert words[0] == "ready", f"training run did not start: {words}\n{self.log.read_text()}"
        return int(words[2])

    def wait(self) -> int:
        """The exit code of the current run (negative: killed by that signal)."""
        words = self._line().split()
        assert words[0] == "exit", words
        return int(words[1])

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Launcher]:
    launcher = Launcher(tmp_path / "child-stderr.log")
    try:
        yield launcher
    finally:
        launcher.close()


def check_consistent(home: Path, seen: dict[int, tuple[float, float]]) -> tuple[int, int]:
    """Assert the invariant; remember each round's (loss, digest) and check redone rounds match."""
    store = CheckpointStore(home / "checkpoints", keep=KEEP)
    for path in store.paths():
        store.verify(path)  # no partial or corrupt checkpoint under a final name
    state = store.load_latest()
    with Ledger(home / "ledger.sqlite") as ledger:  # reopens: WAL recovery, integrity check
        rows = ledger.rounds()
        last = ledger.last_round() or 0
    ckpt_round = state.round if state is not None else 0

    assert ckpt_round <= last <= ckpt_round + 1, (ckpt_round, last)
    assert [r.round for r in rows] == list(range(1, last + 1))
    if state is not None:
        assert rows[ckpt_round - 1].extra["state_digest"] == state_digest(state.model_state)
    for row in rows:
        fingerprint = (row.loss, row.extra["state_digest"])
        assert seen.setdefault(row.round, fingerprint) == fingerprint, f"round {row.round} redone differently"
    return ckpt_round, last


def test_sigkill_at_random_instants_leaves_ledger_and_checkpoints_consistent(
    tmp_path: Path, launcher: Launcher
) -> None:
    home = tmp_path / "home"
    rng = random.Random(20240611)
    seen: dict[int, tuple[float, float]] = {}
    for trial in range(TRIALS):
        pid = launcher.start(home)
        time.sleep(rng.uniform(0.02, 0.3))
        os.kill(pid, signal.SIGKILL)
        assert launcher.wait() == -signal.SIGKILL, f"trial {trial}: run ended on its own"
        check_consistent(home, seen)

    # A last run restarts from whatever the kills left, then finishes cleanly.
    _, last = check_consistent(home, seen)
    stop = last + 3
    launcher.start(home, stop_after_round=stop)
    assert launcher.wait() == 0, launcher.log.read_text()
    assert check_consistent(home, seen) == (stop, stop)
    assert stop >= TRIALS, "the runs made too little progress for the test to mean anything"
    # Leftovers of interrupted writes are gone; exactly `keep` checkpoints remain.
    names = sorted(p.name for p in (home / "checkpoints").iterdir())
    assert len(names) == KEEP and all(n.startswith("ckpt-") for n in names), names
