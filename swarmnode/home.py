"""The node home directory: where every file a node owns lives.

HOME/swarmnode.toml      config (written by `swarmnode init`)
HOME/identity.key        Ed25519 node key, mode 0600
HOME/ledger.sqlite       SQLite (WAL) ledger of rounds, bans, counters
HOME/checkpoints/        atomic training checkpoints (last K kept)
HOME/models/             built-in model, warm-start cache
HOME/p2p/                libp2p identity and runtime files
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


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

    def ensure(self) -> NodeHome:
        for path in (self.root, self.checkpoints, self.models, self.p2p):
            path.mkdir(parents=True, exist_ok=True)
        return self
