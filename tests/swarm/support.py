"""Helpers for multi-process swarm tests: the package's process harness (``swarmnode.testing``).

Every process is started in its own session (process group) and stopped by
``LocalSwarm.close``: SIGINT, a deadline, then SIGKILL of the whole group, and finally SIGKILL of
any p2pd still holding one of the homes' libp2p identities. Nothing here sleeps for a fixed time
where a condition can be polled (``wait_until``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from swarmnode.testing import (
    POLL,
    START_TIMEOUT,
    STOP_TIMEOUT,
    LocalSwarm,
    Proc,
    kill_pids,
    metric,
    p2pd_pids,
    spawn,
    summary,
    wait_until,
)
from swarmnode.testing.swarm import LISTEN, ledger_rounds

REPO = Path(__file__).resolve().parents[2]


def read_json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def start_adversary(swarm: LocalSwarm, bootstrap: str, round_seconds: float) -> tuple[Path, dict[str, Any]]:
    """Start ``swarmnode.testing.adversary`` (driven through files in its home, see its docstring);
    return its home and its ``ready.json`` (its libp2p id and the Ed25519 ids it signs with)."""
    home = swarm.root / "adversary"
    home.mkdir(parents=True)
    args = ["-m", "swarmnode.testing.adversary", "--home", str(home), "--peer", bootstrap]
    swarm.start_process(
        "adversary",
        [*args, "--round-seconds", str(round_seconds)],
        home,
        identity=home / "p2p" / "libp2p.key",
    )
    return home, swarm.wait(lambda: read_json(home / "ready.json"), "the adversary to join")


__all__ = [
    "LISTEN",
    "POLL",
    "REPO",
    "START_TIMEOUT",
    "STOP_TIMEOUT",
    "LocalSwarm",
    "Proc",
    "kill_pids",
    "ledger_rounds",
    "metric",
    "p2pd_pids",
    "read_json",
    "spawn",
    "start_adversary",
    "summary",
    "wait_until",
]
