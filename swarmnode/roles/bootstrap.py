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
import signal
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from swarmnode.errors import SwarmError
from swarmnode.net.config import NetConfig, default_identity_path
from swarmnode.net.hivemind_runtime import HivemindRuntime
from swarmnode.ops.metrics import Metrics

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
        runner = web.AppRunner(_make_app(runtime, memory_limit), access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, http_host, http_port)
            await site.start()
            host, port = runner.addresses[0][:2]
            info = BootstrapInfo(
                runtime.peer_id, runtime.visible_maddrs, f"http://{host}:{port}", runtime.p2pd_pid
            )
            _write_peers_file(home / "peers.txt", info.maddrs)
            print(f"bootstrap peer id: {info.peer_id}", flush=True)
            for maddr in info.maddrs:
                print(f"bootstrap multiaddr: {maddr}", flush=True)
            print(f"bootstrap http: {info.http_url}", flush=True)
            if on_ready is not None:
                on_ready(info)
            await stop_event.wait()
        finally:
            await runner.cleanup()
    finally:
        await runtime.stop()


def _make_app(runtime: HivemindRuntime, memory_limit: int = MEMORY_LIMIT) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        if not runtime.is_running:
            return web.Response(status=503, text="stopping\n")
        rss = resident_bytes()
        if rss is not None and rss > memory_limit:
            text = f"memory: {rss >> 20} MiB resident > {memory_limit >> 20} MiB\n"
            return web.Response(status=503, text=text)
        return web.Response(text="ok\n")

    async def status(_: web.Request) -> web.Response:
        return web.json_response(await bootstrap_status(runtime))

    async def metrics(_: web.Request) -> web.Response:
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
        return web.Response(text=registry.render(), content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/status", status)
    app.router.add_get("/metrics", metrics)
    return app


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
    fd, tmp = tempfile.mkstemp(prefix=".peers-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


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
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    def ready(info: BootstrapInfo) -> None:
        if args.ready_file is not None:
            payload = {**asdict(info), "pid": os.getpid()}
            tmp = args.ready_file.with_name(args.ready_file.name + ".tmp")
            tmp.write_text(json.dumps(payload) + "\n", encoding="utf-8")
            os.replace(tmp, args.ready_file)

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
