"""One process at a time per libp2p identity.

Owns: an advisory ``flock`` on ``<identity file>.lock`` held while a runtime uses
the identity. The kernel drops it when the process dies (SIGKILL included), so
a restart never waits for a stale lock, and a second node started by mistake
on the same home gets a clear error instead of libp2p's "identity taken".
Must not: create or read the identity itself.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from swarmnode.net.errors import NetError


class IdentityLock:
    """An exclusive, non-blocking lock tied to one identity file."""

    def __init__(self, identity_path: Path, what: str = "libp2p identity") -> None:
        # ``what``: how the error names the locked thing (a learner's archive of served versions
        # takes the same lock on HOME/published).
        self.path = identity_path.with_name(identity_path.name + ".lock")
        self.what = what
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            os.close(fd)
            raise NetError(
                f"{self.what} {self.path.with_suffix('')} is in use by another process "
                f"(lock {self.path} is held); stop that node or give this one another home"
            ) from e
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None
