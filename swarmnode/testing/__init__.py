"""The process harness for local swarms, shared by ``swarmnode swarm``, the tests and ``bench/``.

Owns: starting bootstrap and node processes on 127.0.0.1 with a log each, waiting for a
condition (a predicate with a timeout, never a fixed sleep), stopping them (SIGINT, SIGKILL
after a grace period, leftover p2pd), and the peers that attack a swarm (``adversary``,
``attacker``, ``adversarial``, ``corrupting``, ``hooked_node``), run as modules of this package.
Must not: be imported by anything in swarmnode except ``swarmnode.tools.launch``
(tests/test_layers.py); this package may import every other swarmnode module.

Only the process plumbing is imported here; the attacking peers import hivemind, so import
them by their module.
"""

from __future__ import annotations

from swarmnode.testing.p2pd import kill_p2pd_of, kill_pids, p2pd_pids
from swarmnode.testing.process import (
    POLL,
    START_TIMEOUT,
    STOP_TIMEOUT,
    HarnessError,
    Proc,
    ProcessExited,
    WaitTimedOut,
    pid_alive,
    spawn,
    wait_gone,
    wait_until,
)
from swarmnode.testing.swarm import HOOKED_NODE, SMALL_ENV, SMALL_NODE, LocalSwarm, metric, summary

__all__ = [
    "HOOKED_NODE",
    "POLL",
    "SMALL_ENV",
    "SMALL_NODE",
    "START_TIMEOUT",
    "STOP_TIMEOUT",
    "HarnessError",
    "LocalSwarm",
    "Proc",
    "ProcessExited",
    "WaitTimedOut",
    "kill_p2pd_of",
    "kill_pids",
    "metric",
    "p2pd_pids",
    "pid_alive",
    "spawn",
    "summary",
    "wait_gone",
    "wait_until",
]
