"""Named fault points: the windows a crash test kills the node in, marked by the node's own code.

Owns: ``fault_point(phase)``, called where the node enters a window whose interruption must be
safe (between writing a checkpoint's files and renaming them, say). Must not: change what the node
does when no test asks for it (a fault point is then one dictionary lookup).

Seams, not patches: the SIGKILL tests (``tests/fault``) used to wrap private functions of the
trainer, the checkpoint store and the drivers from outside, so a rename there silently moved or
removed the window under test. Each window is now named where it happens:

``generate``        the trainer starts a round's rollouts (before publishing them)
``train``           the trainer starts an update (ledger commit and checkpoint follow)
``ckpt_partial``    a checkpoint's temporary directory holds the model file only
``ckpt_unrenamed``  every checkpoint file and its manifest are written and synced, not yet renamed
``ckpt_unpruned``   the new checkpoint has its final name, the oldest are not yet pruned
``receive``         admission of a group pulled from a peer begins (gossip driver)
``receive_chunk``   a weight-broadcast chunk fetch begins (runs on the event loop: never paused)

Testing only, read once at import: ``SWARMNODE_FAULT_DIR=DIR`` makes each entry create
``DIR/<phase>.<n>`` (n counts from 1 per process), so a test knows the process is in that window
now; ``SWARMNODE_FAULT_PAUSE=phase=seconds,...`` sleeps that long in the window after its marker,
holding it open for a kill at a random instant.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

PHASES = frozenset(
    {"generate", "train", "ckpt_partial", "ckpt_unrenamed", "ckpt_unpruned", "receive", "receive_chunk"}
)
_DIR = os.environ.get("SWARMNODE_FAULT_DIR") or None  # empty: off
_PAUSES: dict[str, float] = {
    name: float(seconds)
    for name, seconds in (
        item.split("=", 1) for item in os.environ.get("SWARMNODE_FAULT_PAUSE", "").split(",") if "=" in item
    )
}
_SEEN: Counter[str] = Counter()


def fault_point(phase: str, *, may_pause: bool = True) -> None:
    """This process enters ``phase`` (one of ``PHASES``): mark it, and pause if a test asked to.

    ``may_pause``: False where a pause would block the event loop (the marker is still written)."""
    if _DIR is None:
        return
    if phase not in PHASES:  # a misspelt window would silently never be entered
        raise ValueError(f"unknown fault point {phase!r}; known: {sorted(PHASES)}")
    _SEEN[phase] += 1
    directory = Path(_DIR)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{phase}.{_SEEN[phase]}").write_text(f"{os.getpid()} {time.time()}\n")
    pause = _PAUSES.get(phase, 0.0)
    if may_pause and pause > 0:
        time.sleep(pause)  # in a worker thread (torch work) or a sync step: blocks only that


__all__ = ["PHASES", "fault_point"]
