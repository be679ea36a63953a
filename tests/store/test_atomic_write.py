"""atomic_write_bytes: the target holds its old content or the new content, never a mix."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from swarmnode.store import atomic_write_bytes, atomic_write_text, fsync_dir


def test_atomic_write_creates_file_with_exact_content(tmp_path: Path) -> None:
    target = tmp_path / "config.toml"
    atomic_write_bytes(target, b"a = 1\n")
    assert target.read_bytes() == b"a = 1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.toml"]


def test_atomic_write_replaces_existing_content(tmp_path: Path) -> None:
    target = tmp_path / "config.toml"
    target.write_bytes(b"old content that is longer than the new one")
    atomic_write_text(target, "new")
    assert target.read_text() == "new"


def test_atomic_write_applies_mode_so_secrets_are_never_world_readable(tmp_path: Path) -> None:
    key = tmp_path / "node.key"
    atomic_write_bytes(key, b"\x01" * 32, mode=0o600)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600


def test_atomic_write_failing_midway_keeps_old_content_and_leaves_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "config.toml"
    target.write_bytes(b"old")

    def broken_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="No space left"):
        atomic_write_bytes(target, b"new content")
    monkeypatch.undo()
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.toml"]


def test_atomic_write_fsyncs_the_data_before_the_rename_and_the_directory_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def spy_fsync(fd: int) -> None:
        events.append("fsync-dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync-file")
        real_fsync(fd)

    def spy_replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        events.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", spy_fsync)
    monkeypatch.setattr(os, "replace", spy_replace)
    atomic_write_bytes(tmp_path / "f", b"x")
    assert events == ["fsync-file", "replace", "fsync-dir"]


def test_fsync_dir_accepts_a_directory(tmp_path: Path) -> None:
    fsync_dir(tmp_path)
