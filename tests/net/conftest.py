"""Fixtures for network tests: hivemind peers on 127.0.0.1 only, always cleaned up.

In-process runtimes are started inside each test's own event loop (``run``);
subprocess peers are started in their own process group and stopped with
SIGTERM, then SIGKILL, each step with a deadline.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from swarmnode.net.bootstrap import BootstrapInfo, run_bootstrap
from swarmnode.net.config import NetConfig
from swarmnode.net.hivemind_runtime import HivemindRuntime

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]
LOOPBACK = ("/ip4/127.0.0.1/tcp/0",)
START_TIMEOUT = 90.0  # generous: 2 shared cores, each process imports torch via hivemind


def run(coro: Coroutine[Any, Any, T], timeout: float = 120.0) -> T:
    """Run one test scenario in a fresh event loop, bounded by ``timeout``."""

    async def bounded() -> T:
        async with asyncio.timeout(timeout):
            return await coro

    return asyncio.run(bounded())


def loopback_config(
    tmp: Path | None, name: str, peers: list[str] | tuple[str, ...] = (), **kw: Any
) -> NetConfig:
    identity = tmp / name / "net" / "libp2p.key" if tmp is not None else None
    kw.setdefault("host_maddrs", LOOPBACK)
    return NetConfig(identity_path=identity, initial_peers=tuple(peers), **kw)


class Swarm:
    """Runtimes started in the current loop; ``close`` stops them all (reverse order)."""

    def __init__(self, tmp: Path | None) -> None:
        self.tmp = tmp
        self.runtimes: list[HivemindRuntime] = []

    async def add(self, name: str, peers: list[str] | tuple[str, ...] = (), **kw: Any) -> HivemindRuntime:
        runtime = await HivemindRuntime.create(loopback_config(self.tmp, name, peers, **kw))
        self.runtimes.append(runtime)
        return runtime

    async def close(self) -> None:
        for runtime in reversed(self.runtimes):
            await runtime.stop()


class LoopThread:
    """An event loop in a daemon thread, shared by the tests of one module.

    Runtimes started on it live as long as the thread's loop (p2pd's death signal
    follows the thread that forked it, so the thread must outlive the runtimes).
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="net-tests-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 120.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        """Cancel what is left (as asyncio.run does), then stop and close the loop."""

        async def cancel_rest() -> None:
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)
            await self.loop.shutdown_asyncgens()

        self.run(cancel_rest(), timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()


@dataclass
class Trio:
    """Three runtimes on a shared loop thread: ``boot``, and ``a`` and ``b`` joined through it."""

    loop: LoopThread
    boot: HivemindRuntime
    a: HivemindRuntime
    b: HivemindRuntime

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 120.0) -> T:
        return self.loop.run(coro, timeout)


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


@dataclass
class PeerProcess:
    """A peer in a subprocess; ``ready`` is the JSON it wrote once up."""

    proc: subprocess.Popen[bytes]
    ready_file: Path
    log: Path
    ready: dict[str, Any] = field(default_factory=dict)

    def wait_ready(self, timeout: float = START_TIMEOUT) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready_file.exists():
                self.ready = json.loads(self.ready_file.read_text())
                return self.ready
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"peer exited with {self.proc.returncode}:\n{self.log.read_text()[-4000:]}"
                )
            time.sleep(0.05)
        raise AssertionError(f"peer not ready within {timeout} s:\n{self.log.read_text()[-4000:]}")

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM, wait, then SIGKILL the process group; also kill a p2pd left behind."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        p2pd = self.ready.get("p2pd_pid")
        if p2pd and wait_gone(p2pd, 5.0) is False:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p2pd, signal.SIGKILL)
        return self.proc.returncode


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return not alive(pid)


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Any]:
    """Start peer subprocesses (``spawn(kind, home, *args)``); all are stopped at teardown."""
    started: list[PeerProcess] = []

    def start(module: str, home: Path, *args: str) -> PeerProcess:
        home.mkdir(parents=True, exist_ok=True)
        ready = home / f"ready-{len(started)}.json"
        log = home / f"log-{len(started)}.txt"
        ready.unlink(missing_ok=True)
        env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", module, "--home", str(home), "--ready-file", str(ready), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=REPO,
                start_new_session=True,  # own process group: the fixture can always kill it all
            )
        peer = PeerProcess(proc, ready, log)
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
        concurrent.futures.wait([ready, running], timeout=START_TIMEOUT, return_when="FIRST_COMPLETED")
        if running.done():
            running.result()  # raises what made it stop
        yield ready.result(timeout=0)
    finally:
        loop.loop.call_soon_threadsafe(stop.set)
        running.result(timeout=60)
        loop.close()
