"""Finding the p2pd daemons of a libp2p identity, to kill any that outlived their node.

p2pd runs in a process group of its own (``swarmnode.net.child_guard``), so stopping a node's
group does not reach it; its control sockets' directory names the identity it serves.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import tempfile
from pathlib import Path


def p2pd_socket_dir(identity_path: Path) -> str:
    """The private directory of p2pd's control sockets for this identity (``hivemind_runtime``'s rule)."""
    digest = hashlib.sha256(str(identity_path.resolve()).encode()).hexdigest()[:16]
    return str(Path(tempfile.gettempdir()) / f"swarmnode-p2p-{os.getuid()}-{digest}")


def p2pd_pids(identity_path: Path) -> list[int]:
    """Live p2pd processes whose control sockets are this identity's (whoever their parent is)."""
    marker = p2pd_socket_dir(identity_path)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if state != "Z" and argv and argv[0].endswith(b"p2pd") and marker.encode() in b" ".join(argv):
            found.append(int(entry.name))
    return found


def kill_pids(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def kill_p2pd_of(identity_path: Path) -> None:
    """SIGKILL every p2pd still serving this identity."""
    kill_pids(p2pd_pids(identity_path))
