"""The bootstrap daemon: a DHT-only peer that new nodes dial first.

Owns: running one ``HivemindRuntime`` (DHT server, no handlers, no training)
with a persistent identity under ``home``, announcing its full multiaddrs
(stdout and ``<home>/peers.txt``, in peers-file format), and a small HTTP
endpoint on 127.0.0.1: ``/healthz`` and ``/status`` (JSON).

Memory: the DHT storage and cache are bounded (``swarmnode.net.record_rules``: 128 MiB + 32 MiB
of records, each refused or evicted fairly beyond that), so the process stays under
``MEMORY_CEILING`` however fast any number of identities store and read. ``/healthz`` answers
503 ("memory") once the resident set passes ``memory_limit`` (default ``MEMORY_LIMIT``, below
the ceiling), so a supervisor sees trouble before an out-of-memory kill; ``/status`` reports the
resident set and what the storage holds, refused and evicted.
Must not: hold any swarm state beyond hivemind's DHT records, or listen for
HTTP on a public address unless the operator asks for it.

``swarmnode bootstrap --home DIR --listen MULTIADDR [--announce MULTIADDR]``
(swarmnode.cli) calls ``run_bootstrap``; ``python -m swarmnode.roles.bootstrap``
runs it directly with the same flags.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from swarmnode.errors import SwarmError
from swarmnode.net.config import NetConfig, default_identity_path
from swarmnode.net.hivemind_runtime import HivemindRuntime
from swarmnode.ops.api import ApiServer, build_http_app
from swarmnode.ops.dashboard import CounterHistory, Dashboard, Section, fmt, key_value_table
from swarmnode.ops.metrics import Metrics
from swarmnode.ops.supervise import stop_on_signals
from swarmnode.store.atomic import atomic_write_text

logger = logging.getLogger(__name__)

STATUS_PEERS_TIMEOUT = 5.0
MEMORY_CEILING = 1024 * 1024 * 1024  # the documented bound: the bootstrap process stays below it
MEMORY_LIMIT = 768 * 1024 * 1024  # /healthz turns 503 above this resident set


def resident_bytes() -> int | None:
    """This process's resident set in bytes (Linux /proc), None where unknown."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class BootstrapInfo:
    """What a started bootstrap tells the world."""

    peer_id: str
    maddrs: list[str]  # full multiaddrs with /p2p/<peer id>
    http_url: str  # e.g. http://127.0.0.1:8700
    p2pd_pid: int | None  # for supervision: the daemon dies with this process


async def run_bootstrap(
    home: Path,
    listen: Sequence[str],
    announce: Sequence[str],
    http_host: str,
    http_port: int,
    stop_event: asyncio.Event,
    *,
    initial_peers: Sequence[str] = (),
    on_ready: Callable[[BootstrapInfo], None] | None = None,
    memory_limit: int = MEMORY_LIMIT,
) -> None:
    """Run a bootstrap peer until ``stop_event`` is set, then stop cleanly.

        ``listen``: multiaddrs p2pd listens on (e.g. /ip4/0.0.0.0/tcp/8765);
        ``announce``: multiaddrs to tell peers (explicit ports), empty for the
        listen addresses; ``initial_peers``: other bootstrap peers to link with;
        ``http_port`` 0 picks a free port (reported in ``BootstrapInfo.http_url``).
        Prints the multiaddrs and writes them to ``<home>/peers.txt``; calls
        ``on_ready`` once everything is up; ``/healthz`` fails above ``memory_limit`` bytes of
    resident memory. Raises SwarmError subclasses for bad
        settings or a failed start.
    """
    config = NetConfig(
        identity_path=default_identity_path(home),
        host_maddrs=tuple(listen),
        announce_maddrs=tuple(announce),
        initial_peers=tuple(initial_peers),
        ensure_bootstrap_success=False,  # bootstraps start in any order
    )
    runtime = await HivemindRuntime.create(config)
    try:
        history = BootstrapHistory()
        server = ApiServer(_make_app(runtime, memory_limit, history), http_host, http_port)
        await server.start()
        try:
            info = BootstrapInfo(
                runtime.peer_id, runtime.visible_maddrs, f"http://{http_host}:{server.port}", runtime.p2pd_pid
            )
            _write_peers_file(home / "peers.txt", info.maddrs)
            print(f"bootstrap peer id: {info.peer_id}", flush=True)
            for maddr in info.maddrs:
                print(f"bootstrap multiaddr: {maddr}", flush=True)
            print(f"bootstrap http: {info.http_url}", flush=True)
            if on_ready is not None:
                on_ready(info)
            async with asyncio.TaskGroup() as group:
                sampler = group.create_task(history.run(runtime))
                await stop_event.wait()
                sampler.cancel()
        finally:
            await server.stop()
    finally:
        await runtime.stop()


class BootstrapHistory:
    """The bootstrap's figures over time, for its page: peers (DHT routing table, open connections)
    and DHT health (records held, resident memory), sampled every ``every`` s (bounded)."""

    def __init__(self, every: float = 10.0) -> None:
        self.every = every
        self.peers = CounterHistory()
        self.records = CounterHistory()
        self.memory = CounterHistory()

    def add(self, doc: dict[str, Any]) -> None:
        minutes = doc["uptime_s"] / 60
        peers = {"DHT routing table": doc["dht_peers"]}
        if doc["connected_peers"] is not None:
            peers["open connections"] = doc["connected_peers"]
        self.peers.add(minutes, peers)
        storage = doc["dht_storage"]
        self.records.add(
            minutes, {name: storage[name]["records"] for name in ("storage", "cache") if name in storage}
        )
        if doc["rss_bytes"] is not None:
            self.memory.add(minutes, {"resident MiB": doc["rss_bytes"] / 2**20})

    async def run(self, runtime: HivemindRuntime) -> None:
        """Sample until cancelled. A failed sample is logged and skipped: this task runs beside
        the bootstrap's wait for its stop, and its exception would end the bootstrap itself."""
        while True:
            try:
                self.add(await bootstrap_status(runtime))
            except Exception:  # the page must never take the DHT peer down
                logger.warning("bootstrap page: sample failed", exc_info=True)
            await asyncio.sleep(self.every)

    def dashboard(self, doc: dict[str, Any], memory_limit: int) -> Dashboard:
        health = {
            "peer id": doc["peer_id"],
            **{f"listens on ({i + 1})": m for i, m in enumerate(doc["maddrs"])},
            "memory limit (MiB)": memory_limit >> 20,
        }
        for name, figures in doc["dht_storage"].items():
            for key, value in figures.items():
                if isinstance(value, dict):
                    text = ", ".join(f"{k} {v}" for k, v in value.items() if not isinstance(v, dict))
                    health[f"DHT {name} {key}"] = text or "-"
                else:
                    health[f"DHT {name} {key}"] = value
        return Dashboard(
            "swarmnode · bootstrap",
            "bootstrap",
            cards=[
                ("DHT peers", fmt(doc["dht_peers"])),
                ("open connections", fmt(doc["connected_peers"])),
                ("resident MiB", fmt(None if doc["rss_bytes"] is None else doc["rss_bytes"] >> 20)),
                ("up (min)", fmt(round(doc["uptime_s"] / 60, 1))),
            ],
            sections=[
                Section("Peers", charts=[self.peers.chart("peers", "Peers over time", "minutes", "peers")]),
                Section(
                    "DHT health",
                    charts=[
                        self.records.chart("records", "Records held", "minutes", "records"),
                        self.memory.chart("memory", "Resident memory", "minutes", "MiB"),
                    ],
                    tables=[key_value_table("dht", "Bootstrap and DHT", health)],
                ),
            ],
            links=[("status JSON", "/status"), ("metrics", "/metrics")],
        )


def _make_app(
    runtime: HivemindRuntime, memory_limit: int = MEMORY_LIMIT, history: BootstrapHistory | None = None
) -> web.Application:
    """The bootstrap's documents in the one HTTP app (``ops.api.build_http_app``), with its page."""
    history = history if history is not None else BootstrapHistory()

    async def health() -> str | None:
        if not runtime.is_running:
            return "stopping"
        rss = resident_bytes()
        if rss is not None and rss > memory_limit:
            return f"memory: {rss >> 20} MiB resident > {memory_limit >> 20} MiB"
        return None

    async def status() -> dict[str, Any]:
        return await bootstrap_status(runtime)

    async def metrics() -> str:
        doc = await bootstrap_status(runtime)
        registry = Metrics()
        registry.set("dht_peers", "Peers in the DHT routing table", doc["dht_peers"])
        if doc["connected_peers"] is not None:
            registry.set("connected_peers", "Open libp2p connections", doc["connected_peers"])
        registry.set("uptime_seconds", "Seconds since the bootstrap peer started", doc["uptime_s"])
        registry.set("up", "1 while the bootstrap peer runs", 1.0 if runtime.is_running else 0.0)
        if doc["rss_bytes"] is not None:
            registry.set("resident_bytes", "Resident memory of the bootstrap process", doc["rss_bytes"])
        for name in ("storage", "cache"):
            figures = doc["dht_storage"].get(name)
            if figures is None:
                continue
            registry.set(f"dht_{name}_records", f"Records in the DHT {name}", figures["records"])
            registry.set(f"dht_{name}_bytes", f"Bytes of records in the DHT {name}", figures["bytes"])
            registry.set(f"dht_{name}_evicted", f"Records evicted from the DHT {name}", figures["evicted"])
        return registry.render()

    async def dashboard() -> Dashboard:
        return history.dashboard(await bootstrap_status(runtime), memory_limit)

    return build_http_app(status, metrics, health, dashboard=dashboard)


async def bootstrap_status(runtime: HivemindRuntime) -> dict[str, Any]:
    """The /status document: identity, addresses, peer counts, uptime."""
    try:
        connected: int | None = len(await runtime.connected_peers(timeout=STATUS_PEERS_TIMEOUT))
    except TimeoutError:
        connected = None  # p2pd did not answer in time; say so rather than guess
    return {
        "role": "bootstrap",
        "peer_id": runtime.peer_id,
        "maddrs": runtime.visible_maddrs,
        "dht_peers": runtime.dht_peer_count(),
        "connected_peers": connected,
        "uptime_s": round(runtime.uptime, 3),
        "rss_bytes": resident_bytes(),
        "dht_storage": runtime.dht_storage_stats(),
    }


def _write_peers_file(path: Path, maddrs: list[str]) -> None:
    """Write the addresses in peers-file format, atomically (nodes may read it at any time)."""
    text = "# swarmnode bootstrap peer: give this file to nodes as their peers file\n"
    text += "".join(f"{m}\n" for m in maddrs)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text, mode=0o644)  # world-readable: it holds only public addresses


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m swarmnode.roles.bootstrap", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--home", type=Path, required=True, help="directory for the identity and peers.txt")
    parser.add_argument(
        "--listen", action="append", required=True, help="multiaddr to listen on (repeatable)"
    )
    parser.add_argument("--announce", action="append", default=[], help="multiaddr to announce (repeatable)")
    parser.add_argument(
        "--initial-peer", action="append", default=[], help="another bootstrap's full multiaddr"
    )
    parser.add_argument("--http-host", default="127.0.0.1")
    parser.add_argument("--http-port", type=int, default=0, help="0 picks a free port")
    parser.add_argument(
        "--ready-file", type=Path, help="write a JSON line with peer id, maddrs, http url here"
    )
    parser.add_argument(
        "--memory-limit-mib",
        type=int,
        default=MEMORY_LIMIT >> 20,
        help="/healthz answers 503 above this resident memory (MiB)",
    )
    return parser.parse_args(argv)


async def _main(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    stop_on_signals(stop)

    def ready(info: BootstrapInfo) -> None:
        if args.ready_file is not None:
            payload = {**asdict(info), "pid": os.getpid()}
            atomic_write_text(args.ready_file, json.dumps(payload) + "\n", mode=0o644)

    await run_bootstrap(
        args.home,
        args.listen,
        args.announce,
        args.http_host,
        args.http_port,
        stop,
        initial_peers=args.initial_peer,
        on_ready=ready,
        memory_limit=args.memory_limit_mib << 20,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(_main(args))
    except SwarmError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
