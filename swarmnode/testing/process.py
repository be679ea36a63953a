"""Child processes of a harness: spawn one with its log, wait for a condition, stop it.

Every child runs in a session (process group) of its own, so a stop reaches everything it
started; it gets SIGTERM from the kernel if the harness dies first (``die_with_parent``), and
its stdout and stderr go to one log file whose tail every error quotes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from swarmnode.errors import SwarmError
from swarmnode.net.child_guard import die_with_parent

T = TypeVar("T")
START_TIMEOUT = 240.0  # generous: 2 shared cores, every process imports torch and loads a model
STOP_TIMEOUT = 30.0
KILL_TIMEOUT = 10.0  # after SIGKILL, only the kernel is left to wait for
POLL = 0.25


class HarnessError(SwarmError, AssertionError):
    """A child process did not do what the harness waited for (an assertion failure in a test)."""


class ProcessExited(HarnessError):
    """A child exited while the harness was waiting for something."""


class WaitTimedOut(HarnessError):
    """A condition did not hold within its timeout."""


@dataclass
class Proc:
    """A child in its own session; ``log`` has its stdout and stderr, ``ready_file`` what it wrote once up."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    ready_file: Path | None = None
    killed: bool = False  # the harness had to SIGKILL it: it did not stop in time

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError as exc:
            return f"(no log: {exc})"

    def ready(self) -> dict[str, Any] | None:
        """The JSON object in ``ready_file``, or None while there is none."""
        if self.ready_file is None or not self.ready_file.exists():
            return None
        info: dict[str, Any] = json.loads(self.ready_file.read_text())
        return info

    def wait_ready(self, timeout: float = START_TIMEOUT) -> dict[str, Any]:
        return wait_until(self.ready, timeout, f"{self.name} to be ready", procs=[self])

    def kill_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, sig)

    def wait_stopped(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """Wait for a process already sent its stop signal (a second SIGINT would abort a clean
        stop), SIGKILL its group after ``timeout``; then kill whatever is left in the group."""
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.killed = True
            self.kill_group(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(KILL_TIMEOUT)
        # Anything left in the group (a child that ignored the parent's exit) goes too.
        self.kill_group(signal.SIGKILL)
        return self.popen.returncode

    def stop(self, timeout: float = STOP_TIMEOUT, sig: int = signal.SIGINT) -> int | None:
        """``sig`` to the group (SIGINT: a clean stop, the node checkpoints), SIGKILL after ``timeout``."""
        if self.alive():
            self.kill_group(sig)
        return self.wait_stopped(timeout)


def spawn(
    name: str,
    args: Sequence[str],
    log: Path,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    prefix: Sequence[str] = (),
    ready_file: Path | None = None,
) -> Proc:
    """``python ARGS`` (under ``prefix``, e.g. ``ip netns exec NAME``, which execs: the pid stays the
    child's) in a new session, output appended to ``log``, ``env`` added to this process's own.

    Spawn from a thread that outlives the child: the kernel's death signal follows the thread that
    forked it (``swarmnode.net.child_guard``)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    if ready_file is not None:
        ready_file.unlink(missing_ok=True)  # a stale one would read as "ready" at once
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(log, "ab") as out:
        popen = subprocess.Popen(
            [*prefix, sys.executable, *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=full_env,
            cwd=cwd,
            start_new_session=True,  # own process group: a stop can always reach all of it
            preexec_fn=die_with_parent(),  # and if the harness dies anyway, the child gets SIGTERM
        )
    return Proc(name, popen, log, ready_file)


def wait_until(
    check: Callable[[], T | None],
    timeout: float,
    what: str,
    *,
    procs: Sequence[Proc] = (),
    interval: float = POLL,
) -> T:
    """Poll ``check`` until it returns something other than None/False, and return that.

    Raises ``ProcessExited`` (with its log's tail) as soon as one of ``procs`` exits meanwhile,
    and ``WaitTimedOut`` naming ``what`` (with every proc's tail) after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value is not None and value is not False:
            return value
        for proc in procs:
            if not proc.alive():
                code = proc.popen.returncode
                raise ProcessExited(
                    f"{proc.name} exited with {code} while waiting for {what} (log: {proc.log}):\n"
                    f"{proc.tail()}"
                )
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name} ({p.log})\n{p.tail(1500)}" for p in procs)
            raise WaitTimedOut(f"timed out after {timeout:.0f} s waiting for {what}\n{tails}")
        time.sleep(interval)


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pid: int, timeout: float) -> bool:
    """Whether ``pid`` is gone within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return not pid_alive(pid)
