"""Helpers for fault tests: hooked node processes and the on-disk consistency check after a kill."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from swarmnode.home import NodeHome
from swarmnode.store import CheckpointStore, Ledger, RoundRecord
from swarmnode.testing import SMALL_ENV, LocalSwarm, Proc, p2pd_pids, spawn, wait_until

LEFTOVER_PREFIXES = (".tmp-", ".trash-")


def spawn_env(name: str, args: list[str], log: Path, env: dict[str, str], prefix: Sequence[str] = ()) -> Proc:
    """``swarmnode.testing.spawn`` with a small swarm's environment plus ``env``, run under ``prefix``
    (e.g. ``ip netns exec NAME``, which execs the command: the pid is still the node's)."""
    return spawn(name, args, log, env={**SMALL_ENV, **env}, prefix=prefix)


def start_hooked_node(
    swarm: LocalSwarm,
    name: str,
    fault_dir: Path,
    pauses: dict[str, float] | None = None,
    env: dict[str, str] | None = None,
) -> Proc:
    """``swarmnode run`` for ``name`` under ``swarmnode.testing.hooked_node`` (markers in ``fault_dir``)."""
    return swarm.start_hooked_node(name, fault_dir, pauses, env)


def sigkill(proc: Proc, identity: Path | None = None) -> None:
    """SIGKILL the node process itself (not its group), as a crash would; wait for its p2pd to die."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.popen.wait(30)
    assert proc.popen.returncode == -signal.SIGKILL, (proc.popen.returncode, proc.tail())
    if identity is not None:
        wait_until(lambda: not p2pd_pids(identity), 10.0, "p2pd to die with its node")


@dataclass(frozen=True)
class DiskState:
    checkpoint_round: int  # 0: no checkpoint yet
    ledger_rounds: list[RoundRecord]
    leftovers: list[str]  # hidden temporary / trash directories of an interrupted write


def facts(record: RoundRecord) -> tuple[object, ...]:
    return (record.round, record.started_at, record.mean_reward, record.accuracy, record.policy_version)


def check_disk(home: NodeHome, *, keep: int = 3) -> DiskState:
    """What a kill may leave, and the rules it must obey (``swarmnode.store``'s crash invariant):
    every checkpoint under a final name verifies, the ledger opens (WAL recovery) with rounds
    1..l and no gap, policy version = round, and with c the newest checkpoint: c <= l <= c + 1."""
    store = CheckpointStore(home.checkpoints, keep)
    for path in store.paths():
        store.verify(path)  # raises, naming the file, for a partial or corrupt checkpoint
    state = store.load_latest()
    with Ledger(home.ledger) as ledger:
        rows = ledger.rounds()
    c = state.round if state is not None else 0
    rounds = [r.round for r in rows]
    assert rounds == list(range(1, len(rows) + 1)), f"ledger rounds have a gap or disorder: {rounds}"
    assert all(r.policy_version == r.round for r in rows), [(r.round, r.policy_version) for r in rows]
    last = rounds[-1] if rounds else 0
    assert c <= last <= c + 1, f"checkpoint round {c}, ledger's last round {last}"
    leftovers = (
        sorted(p.name for p in home.checkpoints.iterdir() if p.name.startswith(LEFTOVER_PREFIXES))
        if home.checkpoints.is_dir()
        else []
    )
    return DiskState(c, rows, leftovers)


def log_since(proc: Proc, offset: int) -> str:
    try:
        return proc.log.read_bytes()[offset:].decode(errors="replace")
    except OSError:
        return ""


def wait_for_marker(fault_dir: Path, phase: str, proc: Proc, timeout: float, nth: int = 1) -> Path:
    """Wait until ``proc`` enters ``phase`` for the ``nth`` time (see swarmnode.testing.hooked_node)."""
    marker = fault_dir / f"{phase}.{nth}"
    wait_until(lambda: marker.exists(), timeout, f"{proc.name} to enter {phase}", procs=[proc], interval=0.02)
    return marker


def now() -> float:
    return time.monotonic()
