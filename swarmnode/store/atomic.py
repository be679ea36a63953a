"""Crash-safe file writes: a file is either its old content or its new content, never a mix.

Owns the write-temp / fsync / rename / fsync-directory sequence used by the checkpoint
store and by anything else that must survive a kill at any instant (config files, the
node key). It must not know what the bytes mean.

Why each step: the data is fsynced before the rename so that the rename can never expose
a name pointing at blocks that were not written yet; the directory is fsynced after the
rename so that the new name itself survives a power cut (POSIX: a rename is durable only
once its directory entry is). The temporary file lives in the target's directory because
a rename is atomic only within one filesystem.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = ["atomic_write_bytes", "atomic_write_text", "fsync_dir", "fsync_file"]


def fsync_dir(path: Path) -> None:
    """Make the directory entries of ``path`` (a directory) durable."""
    # O_DIRECTORY does not exist everywhere; where it is missing, O_RDONLY on a directory works.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    """Flush the content of an already written file at ``path`` to stable storage."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes, *, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` atomically and durably, with permission bits ``mode``.

    After a crash at any instant, ``path`` holds either its previous content (or does not
    exist, if it did not before) or exactly ``data``. The permission bits are set before
    any byte is written, so a secret written with ``mode=0o600`` is never readable by
    others, not even for a moment. On error the temporary file is removed and the
    previous content is left untouched.
    """
    path = Path(path)
    parent = path.parent
    # mkstemp creates the file with mode 0600, so nothing is exposed before fchmod.
    fd, tmp_name = tempfile.mkstemp(dir=parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        # The temporary name is ours alone; removing it never touches user data.
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    fsync_dir(parent)


def atomic_write_text(path: Path, text: str, *, mode: int = 0o600, encoding: str = "utf-8") -> None:
    """``atomic_write_bytes`` for text (UTF-8 unless told otherwise)."""
    atomic_write_bytes(path, text.encode(encoding), mode=mode)
