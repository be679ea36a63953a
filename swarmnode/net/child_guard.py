"""Make every p2pd this process starts die with it, SIGKILL included.

Owns: the one place where swarmnode reaches into how hivemind spawns p2pd.
Must not: touch any other subprocess, or change what hivemind passes to p2pd.

hivemind 1.1.12 starts p2pd in ``P2P.create`` with
``asyncio.subprocess.create_subprocess_exec(p2pd, ...)`` and offers no hook to
pass ``preexec_fn``. A SIGKILLed node therefore leaves p2pd running (measured:
still alive 30 s later), holding the libp2p identity, so the restarted node
fails with "Identity ... is already taken". We wrap that function so that,
only when the program is hivemind's own p2pd binary, the child

* asks the kernel to SIGKILL it when its parent dies: ``prctl(PR_SET_PDEATHSIG)``
  (Linux); the kernel does it, so it holds for SIGKILL and OOM kills too, and
* runs in its own process group, so a Ctrl-C in the terminal reaches only the
  node, which then shuts p2pd down in order instead of losing it mid-call.

Caveat (documented kernel behaviour): the death signal fires when the *thread*
that forked the child exits. asyncio forks from the event-loop thread, so run
the runtime's loop in a thread that lives as long as the node (normally the
main thread).
"""

from __future__ import annotations

import asyncio
import asyncio.subprocess
import ctypes
import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from importlib.resources import files
from pathlib import Path
from typing import Any

_PR_SET_PDEATHSIG = 1
_GUARD_MARK = "_swarmnode_p2pd_guard"

# Where the wrapper reports the p2pd processes it starts, per asyncio context, so a
# runtime whose start fails half-way (e.g. a timeout inside P2P.create) can still
# stop the daemons it started instead of leaking them for the life of the node.
_spawned: ContextVar[list[asyncio.subprocess.Process] | None] = ContextVar(
    "swarmnode_p2pd_spawned", default=None
)


def p2pd_binary() -> Path:
    """Path of the p2pd binary shipped in the hivemind wheel."""
    return Path(str(files("hivemind.hivemind_cli").joinpath("p2pd"))).resolve()


def _make_preexec(libc: ctypes.CDLL, parent_pid: int, sig: int = signal.SIGKILL) -> Callable[[], None]:
    def preexec() -> None:
        # Runs in the child between fork and exec: only async-signal-safe work here.
        if libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent_pid:
            # The parent died between fork and prctl: the signal will never come.
            os._exit(1)

    return preexec


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes a child get ``sig`` when this process dies (Linux; else None).

    ``swarmnode swarm`` starts its nodes with it, so killing the launcher in any way
    (SIGKILL included) stops every node it started, each cleanly on SIGTERM.
    """
    if not _death_signal_supported():
        return None
    return _make_preexec(ctypes.CDLL(None, use_errno=True), os.getpid(), sig)


def install_p2pd_death_signal() -> bool:
    """Install the wrapper once per process; return whether p2pd now gets a death signal.

    Returns False where ``prctl`` does not exist (not Linux): spawns are still
    tracked (``track_p2pd_spawns``) but a SIGKILLed node would leak p2pd there.
    """
    current = asyncio.subprocess.create_subprocess_exec
    if getattr(current, _GUARD_MARK, False):
        return _death_signal_supported()
    libc = ctypes.CDLL(None, use_errno=True) if _death_signal_supported() else None
    target = p2pd_binary()

    async def create_subprocess_exec(program: Any, *args: Any, **kwargs: Any) -> asyncio.subprocess.Process:
        is_p2pd = _is_same_file(program, target)
        if is_p2pd:
            if libc is not None and "preexec_fn" not in kwargs:
                kwargs["preexec_fn"] = _make_preexec(libc, os.getpid())
            kwargs.setdefault("process_group", 0)
        process = await current(program, *args, **kwargs)
        registry = _spawned.get()
        if is_p2pd and registry is not None:
            registry.append(process)
        return process

    setattr(create_subprocess_exec, _GUARD_MARK, True)
    # hivemind looks the function up as ``asyncio.subprocess.create_subprocess_exec`` at call time.
    setattr(asyncio.subprocess, "create_subprocess_exec", create_subprocess_exec)  # noqa: B010
    return _death_signal_supported()


def _death_signal_supported() -> bool:
    return sys.platform.startswith("linux")


def _is_same_file(program: Any, target: Path) -> bool:
    try:
        return Path(os.fspath(program)).resolve() == target
    except (TypeError, OSError):
        return False


@contextmanager
def track_p2pd_spawns() -> Iterator[list[asyncio.subprocess.Process]]:
    """Collect, into the yielded list, every p2pd started in this context (this task and
    the coroutines it awaits) while the block runs."""
    spawned: list[asyncio.subprocess.Process] = []
    token = _spawned.set(spawned)
    try:
        yield spawned
    finally:
        _spawned.reset(token)
