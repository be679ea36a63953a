"""Helpers for multi-process swarm tests: the package's process harness (``swarmnode.testing``).

Every process is started in its own session (process group) and stopped by
``LocalSwarm.close``: SIGINT, a deadline, then SIGKILL of the whole group, and finally SIGKILL of
any p2pd still holding one of the homes' libp2p identities. Nothing here sleeps for a fixed time
where a condition can be polled (``wait_until``).
"""

from __future__ import annotations

from pathlib import Path

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
    "spawn",
    "summary",
    "wait_until",
]
