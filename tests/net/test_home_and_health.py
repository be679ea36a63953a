"""Issue 19: a node home is private (0700/0600), and a bootstrap's /healthz fails before memory runs out."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from swarmnode.home import NodeHome
from swarmnode.roles import bootstrap
from swarmnode.store.atomic import atomic_write_text
from swarmnode.store.ledger import Ledger


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_home_and_everything_under_it_are_private_by_default(tmp_path: Path) -> None:
    root = tmp_path / "node"
    root.mkdir(mode=0o755)
    (root / "old.txt").write_text("left by an older version")
    (root / "old.txt").chmod(0o644)
    home = NodeHome(root).ensure()
    atomic_write_text(home.config_file, "[node]\n")
    with Ledger(home.ledger):
        pass
    for path in [root, home.checkpoints, home.models, home.p2p]:
        assert mode(path) == 0o700, path
    for path in [root / "old.txt", home.config_file, *root.glob("ledger.sqlite*")]:
        assert mode(path) == 0o600, path


class _FakeRuntime:
    is_running = True


def test_healthz_turns_503_once_resident_memory_passes_the_limit() -> None:
    async def scenario() -> tuple[int, str, int]:
        low = TestClient(TestServer(bootstrap._make_app(_FakeRuntime(), memory_limit=1)))  # type: ignore[arg-type]
        high = TestClient(TestServer(bootstrap._make_app(_FakeRuntime(), memory_limit=1 << 50)))  # type: ignore[arg-type]
        async with low, high:
            r1: Any = await low.get("/healthz")
            r2: Any = await high.get("/healthz")
            return r1.status, await r1.text(), r2.status

    status, text, healthy = asyncio.run(scenario())
    assert status == 503 and text.startswith("memory:")
    assert healthy == 200
    assert bootstrap.MEMORY_LIMIT < bootstrap.MEMORY_CEILING
