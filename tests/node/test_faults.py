"""Fault points: the node's own code names the windows crash tests kill it in."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import time
from swarmnode.ops.faults import fault_point
t0 = time.monotonic()
fault_point("train")
fault_point("train")
fault_point("receive_chunk", may_pause=False)
print(round(time.monotonic() - t0, 2))
"""


def run(env: dict[str, str], cwd: Path) -> float:
    """The script's seconds in its fault points; a pause where none may be would time it out."""
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return float(done.stdout.strip())


def test_each_entry_leaves_a_numbered_marker_and_a_pause_holds_the_window_open(tmp_path: Path) -> None:
    pauses = "train=0.3,receive_chunk=600"  # receive_chunk may not pause (event loop): else a timeout
    faults = str(tmp_path / "faults")
    seconds = run({"SWARMNODE_FAULT_DIR": faults, "SWARMNODE_FAULT_PAUSE": pauses}, tmp_path)
    markers = sorted(p.name for p in (tmp_path / "faults").iterdir())
    assert markers == ["receive_chunk.1", "train.1", "train.2"]
    assert (tmp_path / "faults" / "train.1").read_text().split()[0] != str(os.getpid())  # the child's
    assert seconds >= 0.6  # the two pauses of 0.3 s held the window open


def test_without_the_variables_a_fault_point_does_nothing(tmp_path: Path) -> None:
    run({"SWARMNODE_FAULT_DIR": "", "SWARMNODE_FAULT_PAUSE": "train=600"}, tmp_path)  # no pause: no timeout
    assert list(tmp_path.iterdir()) == []
