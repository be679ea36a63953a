"""The node home directory: where every file a node owns lives.

HOME/swarmnode.toml      config (written by `swarmnode init`)
HOME/identity.key        Ed25519 node key, mode 0600
HOME/ledger.sqlite       SQLite (WAL) ledger of rounds, bans, counters
HOME/checkpoints/        atomic training checkpoints (last K kept)
HOME/models/             built-in model, warm-start cache
HOME/p2p/                libp2p identity and runtime files
HOME/published_version   a learner's highest published policy version (never reused)
HOME/published/          a learner's served versions, one blob file each (memory-mapped)

Permissions: the home and every folder under it are 0700 and every file 0600
(``ensure`` tightens an existing home; the writers create files 0600). A node's
ledger, optimizer and trainer state say what it trained on and when: private to
its user, like its keys.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


@dataclass(frozen=True)
class NodeHome:
    root: Path

    @property
    def config_file(self) -> Path:
        return self.root / "swarmnode.toml"

    @property
    def identity_key(self) -> Path:
        return self.root / "identity.key"

    @property
    def ledger(self) -> Path:
        return self.root / "ledger.sqlite"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def models(self) -> Path:
        return self.root / "models"

    @property
    def p2p(self) -> Path:
        return self.root / "p2p"

    @property
    def published(self) -> Path:
        return self.root / "published"

    @property
    def published_version(self) -> Path:
        return self.root / "published_version"

    def ensure(self) -> NodeHome:
        for path in (self.root, self.checkpoints, self.models, self.p2p):
            path.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
        restrict_tree(self.root)
        return self


def restrict_tree(root: Path) -> None:
    """Make ``root`` and every folder under it 0700 and every regular file 0600.

    Symlinks are neither followed nor changed; entries owned by another user
    (a shared model folder mounted in) are left as they are.
    """
    uid = os.getuid()
    _restrict(root, uid)
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            _restrict(Path(folder) / name, uid)


def _restrict(path: Path, uid: int) -> None:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if st.st_uid != uid or stat.S_ISLNK(st.st_mode):
        return
    if stat.S_ISDIR(st.st_mode):
        wanted = DIR_MODE
    elif stat.S_ISREG(st.st_mode):
        wanted = FILE_MODE
    else:
        return  # sockets, fifos: p2pd's own
    if stat.S_IMODE(st.st_mode) != wanted:
        try:
            os.chmod(path, wanted)
        except PermissionError:
            return
