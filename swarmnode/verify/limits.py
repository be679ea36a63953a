"""The limits a verifier worker runs under, and the code that applies them inside the worker.

Applied by the worker to itself, after it has imported and warmed its scorers
and before it reads any peer text (so nothing a peer sends runs without them):

- ``RLIMIT_CPU``: the soft limit is raised before each batch to what the worker
  has used plus the batch's budget, so a scorer stuck in one C call (``9**9**9``)
  is killed by the kernel (SIGXCPU) even where no Python code runs;
- a per-completion CPU timer (``ITIMER_PROF``) whose handler ends the process:
  an exception would not do, since some upstream scorers use a bare ``except:``;
- ``RLIMIT_AS``: the address space it has after warm-up plus ``memory_bytes``;
- ``RLIMIT_FSIZE`` 0: no byte can be written to any file; ``RLIMIT_NPROC`` 0
  where allowed (not root): no fork;
- as root, a chroot into an empty directory and the ``nobody`` user, so no
  file can be read, created or written;
- a new network namespace (``unshare(CLONE_NEWNET)``) when the node runs as
  root: no interface but a down loopback. Without root this is not possible
  and ``VerifierPool.isolation()`` says so (the README's Reliability section too);
- the parent gives it a clean environment, no inherited descriptors beyond its
  two pipes, its own session, and a parent-death signal.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
from dataclasses import dataclass

CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
#: Exit code of a worker that ran past a per-completion CPU limit.
EXIT_COMPLETION_TIMEOUT = 75


@dataclass(frozen=True)
class VerifierLimits:
    completion_cpu_s: float = 1.0  # CPU one completion's scoring may take
    batch_cpu_s: float = 5.0  # CPU one batch (an envelope's groups) may take
    #: Wall time per batch beyond its CPU budget before the parent kills the worker (a scorer
    #: that sleeps uses no CPU; a busy machine slows honest work: both are covered).
    wall_slack_s: float = 5.0
    memory_bytes: int = 1 << 30  # address space beyond what the warmed-up worker has
    start_timeout_s: float = 60.0  # a worker imports reasoning-gym (~2 s) and warms its families

    def __post_init__(self) -> None:
        for name in ("completion_cpu_s", "batch_cpu_s", "wall_slack_s", "start_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"VerifierLimits.{name} must be > 0, got {getattr(self, name)}")
        if self.memory_bytes < 64 << 20:
            raise ValueError(f"VerifierLimits.memory_bytes must be >= 64 MiB, got {self.memory_bytes}")


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when its parent dies (Linux); exit now if it already has."""
    try:
        _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the parent's pipe closing still ends the worker's read loop
    if os.getppid() != parent_pid:
        os._exit(1)


def enter_network_namespace() -> bool:
    """Move into a new, empty network namespace; True if that worked (needs root on Linux)."""
    try:
        return int(_libc().unshare(CLONE_NEWNET)) == 0
    except (OSError, AttributeError):
        return False


def _address_space_bytes() -> int:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def lock_down(limits: VerifierLimits) -> None:
    """Apply the resource limits that hold for the rest of the worker's life."""
    ceiling = _address_space_bytes() + limits.memory_bytes
    resource.setrlimit(resource.RLIMIT_AS, (ceiling, ceiling))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    if os.geteuid() != 0:  # root ignores RLIMIT_NPROC; for others 0 forbids fork
        try:
            resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
        except (ValueError, OSError):
            pass
    signal.signal(signal.SIGPROF, lambda signum, frame: os._exit(EXIT_COMPLETION_TIMEOUT))


NOBODY = 65534


def jail(root: str | None) -> bool:
    """As root: chroot into the empty directory ``root`` and become ``nobody``; True if done.

    Everything a scorer needs is imported and warmed by then, so the worker needs no file;
    without root neither step is possible (``VerifierPool.isolation`` says so)."""
    if root is None or os.geteuid() != 0:
        return False
    try:
        os.chroot(root)
        os.chdir("/")
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    except OSError:
        return False
    return True


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def budget_batch(limits: VerifierLimits) -> None:
    """Let the kernel kill this process once the coming batch has used its CPU budget."""
    soft = int(cpu_seconds() + limits.batch_cpu_s) + 1
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def start_completion_timer(limits: VerifierLimits) -> None:
    """(Re)start one completion's CPU timer: its full limit from now. The worker's scoring loop makes
    this call inline, once per completion (re-arming resets it; stopped once, after the batch)."""
    signal.setitimer(signal.ITIMER_PROF, limits.completion_cpu_s)


def stop_completion_timer() -> None:
    signal.setitimer(signal.ITIMER_PROF, 0)


__all__ = [
    "EXIT_COMPLETION_TIMEOUT",
    "VerifierLimits",
    "budget_batch",
    "cpu_seconds",
    "die_with_parent",
    "enter_network_namespace",
    "jail",
    "lock_down",
    "start_completion_timer",
    "stop_completion_timer",
]
