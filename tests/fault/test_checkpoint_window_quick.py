"""The default suite's share of the fault trials: SIGKILL inside a checkpoint write, in a solo run
(no network, random-init tiny model, so it stays short). The kill lands while every file of
the new checkpoint is written but not yet renamed (``swarmnode.testing.hooked_node`` holds that
window open); the restart ignores and then removes the leftover, resumes from the previous
checkpoint, and the ledger continues without a gap. The full set of windows, with a swarm
node: tests/fault/test_sigkill_phases.py (``scripts/test --fault``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from swarmnode.home import NodeHome
from tests.swarm.support import REPO

from .support import check_disk, facts, sigkill, spawn_env, wait_for_marker

SETTINGS = [
    "--set", "model.warm_start=false",
    "--set", "checkpoint.every_rounds=1",
    "--set", "tasks.heldout_size=0",
    "--set", "node.threads=1",
    "--set", "rollout.prompts_per_round=2",
    "--set", "rollout.group_size=2",
]  # fmt: skip
ONE_ROUND = ["--max-rounds", "1"]


def test_a_kill_inside_a_checkpoint_write_leaves_the_previous_checkpoint_as_the_resume_point(
    tmp_path: Path,
) -> None:
    home = NodeHome(tmp_path / "home")
    faults = tmp_path / "faults"
    args = ["-m", "swarmnode.testing.hooked_node", "run", "--home", str(home.root), "--solo", *SETTINGS]
    env = {"SWARMNODE_FAULT_DIR": str(faults), "SWARMNODE_FAULT_PAUSE": "ckpt_unrenamed=1.5"}
    proc = spawn_env("solo", args, tmp_path / "solo.log", env)
    try:
        # The second checkpoint's write: the first one (round 1) is complete by then.
        wait_for_marker(faults, "ckpt_unrenamed", proc, timeout=240, nth=2)
        time.sleep(0.5)
        sigkill(proc)
    finally:
        proc.kill_group(signal.SIGKILL)

    killed = check_disk(home)
    assert killed.checkpoint_round == 1 and len(killed.ledger_rounds) == 2
    assert len(killed.leftovers) == 1 and killed.leftovers[0].startswith(".tmp-ckpt-"), killed.leftovers

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "swarmnode.cli",
            "run",
            "--home",
            str(home.root),
            "--solo",
            *SETTINGS,
            *ONE_ROUND,
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "resumed at round 1" in done.stdout + done.stderr, done.stdout + done.stderr
    after = check_disk(home)
    assert after.leftovers == []
    assert after.checkpoint_round == 2 and [r.round for r in after.ledger_rounds] == [1, 2]
    assert facts(after.ledger_rounds[0]) == facts(killed.ledger_rounds[0])  # the committed round is untouched
