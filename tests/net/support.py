"""Helpers for network tests: loopback-only peers (in-process or subprocess) and their cleanup.

In-process runtimes run either in each test's own event loop (``run``) or on a
module-shared loop thread (``LoopThread``); subprocess peers are started in
their own process group and stopped with SIGTERM, then SIGKILL, each step
with a deadline (``PeerProcess.stop``, by the package's harness, ``swarmnode.testing``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from swarmnode.net.config import NetConfig
from swarmnode.net.hivemind_runtime import HivemindRuntime
from swarmnode.testing import Proc, pid_alive, wait_gone, wait_until

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]
LOOPBACK = ("/ip4/127.0.0.1/tcp/0",)
alive = pid_alive  # the tests' name: whether a pid runs (a zombie counts as gone)
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
    identity = tmp / name / "p2p" / "libp2p.key" if tmp is not None else None
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


@dataclass
class PeerProcess:
    """A peer in a subprocess; ``ready`` is the JSON it wrote once up."""

    proc: subprocess.Popen[bytes]
    ready_file: Path
    log: Path
    ready: dict[str, Any] = field(default_factory=dict)

    def harness(self) -> Proc:
        """The same process as the package's harness sees one."""
        return Proc("peer", self.proc, self.log, self.ready_file)

    def wait_ready(self, timeout: float = START_TIMEOUT) -> dict[str, Any]:
        proc = self.harness()
        self.ready = wait_until(proc.ready, timeout, "the peer to be ready", procs=[proc], interval=0.05)
        return self.ready

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM, wait, then SIGKILL the process group; also kill a p2pd left behind."""
        code = self.harness().stop(timeout, sig=signal.SIGTERM)
        p2pd = self.ready.get("p2pd_pid")
        if p2pd and wait_gone(p2pd, 5.0) is False:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p2pd, signal.SIGKILL)
        return code


def sybil(runtime: HivemindRuntime) -> Any:
    """A fresh RSA identity for ``runtime`` to store as: a context manager that makes its DHT node
    sign (and validate) records with that key, with the validators every swarmnode peer runs.
    Identities cost an attacker one key generation: that is what the tests of issue 19 spend."""
    from hivemind.dht.crypto import RSASignatureValidator
    from hivemind.dht.validation import CompositeValidator
    from hivemind.utils.crypto import RSAPrivateKey

    from swarmnode.net.record_rules import RecordRulesValidator
    from swarmnode.net.records import OwnedRecordsOnlyValidator

    signer = RSASignatureValidator(RSAPrivateKey())
    validator = CompositeValidator([signer, OwnedRecordsOnlyValidator(), RecordRulesValidator()])
    dht = runtime._dht
    assert dht is not None

    @contextlib.contextmanager
    def as_identity() -> Any:
        saved = dht.protocol.record_validator
        dht.protocol.record_validator = validator
        try:
            yield signer.local_public_key  # the owner marker to prefix subkeys with
        finally:
            dht.protocol.record_validator = saved

    return as_identity()
