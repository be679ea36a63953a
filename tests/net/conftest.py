"""Fixtures for network tests: hivemind peers on 127.0.0.1 only, always cleaned up."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from swarmnode.roles.bootstrap import BootstrapInfo, run_bootstrap
from swarmnode.testing import spawn as spawn_child

from .support import LOOPBACK, REPO, START_TIMEOUT, LoopThread, PeerProcess, Swarm, Trio


@pytest.fixture(scope="module")
def trio() -> Iterator[Trio]:
    """Runtimes shared by a module's tests: use keys and handler names unique to each test."""
    loop = LoopThread()
    swarm = Swarm(None)

    async def start() -> Trio:
        boot = await swarm.add("boot")
        a = await swarm.add("a", boot.visible_maddrs)
        b = await swarm.add("b", boot.visible_maddrs)
        return Trio(loop, boot, a, b)

    try:
        yield loop.run(start())
    finally:
        loop.run(swarm.close())
        loop.close()


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Any]:
    """Start peer subprocesses (``spawn(kind, home, *args)``); all are stopped at teardown."""
    started: list[PeerProcess] = []

    def start(module: str, home: Path, *args: str) -> PeerProcess:
        home.mkdir(parents=True, exist_ok=True)
        ready = home / f"ready-{len(started)}.json"
        log = home / f"log-{len(started)}.txt"
        proc = spawn_child(
            f"peer-{len(started)}",
            ["-m", module, "--home", str(home), "--ready-file", str(ready), *args],
            log,
            env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
            cwd=REPO,
            ready_file=ready,
        )
        peer = PeerProcess(proc.popen, ready, log)
        started.append(peer)
        return peer

    yield start
    for peer in reversed(started):
        peer.stop()


@pytest.fixture
def threaded_bootstrap(tmp_path: Path) -> Iterator[BootstrapInfo]:
    """``run_bootstrap`` on a loop thread of this process (cheaper than a subprocess)."""
    loop = LoopThread()
    stop = asyncio.Event()
    ready: concurrent.futures.Future[BootstrapInfo] = concurrent.futures.Future()
    running = asyncio.run_coroutine_threadsafe(
        run_bootstrap(tmp_path / "bootstrap", LOOPBACK, (), "127.0.0.1", 0, stop, on_ready=ready.set_result),
        loop.loop,
    )
    try:
        either: list[concurrent.futures.Future[Any]] = [ready, running]
        concurrent.futures.wait(either, timeout=START_TIMEOUT, return_when="FIRST_COMPLETED")
        if running.done():
            running.result()  # raises what made it stop
        yield ready.result(timeout=0)
    finally:
        loop.loop.call_soon_threadsafe(stop.set)
        running.result(timeout=60)
        loop.close()
