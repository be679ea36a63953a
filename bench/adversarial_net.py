"""Attacks on records and connections (issue 19), against a real bootstrap process and DataPlane.

Question: can a few cheap identities grow a bootstrap without bound (store flood, and reading
a stuffed key), or lock honest clients out of the data plane by hoarding connections?

Figures (``run_all(quick)`` returns them; ``main`` prints a table and writes ``--json PATH``):

* ``flood``: one client-mode attacker rotating through many RSA identities stores 4 KB records
  over distinct keys as fast as it can (legal expirations); the bootstrap's resident memory
  (Python + its p2pd) is sampled as records go in. Before the record rules (issue 19): 20,000
  records, 363 -> 463 MiB, linear, no bound.
* ``read_amplification``: one key filled to its cap (256 records of 4 KB from 32 identities),
  then 3 x 30 gets by an honest reader; RSS after each batch. Before: +148 MiB per 30 gets
  (463 -> 624 -> 772 -> 920 MiB) on a key stuffed past the 4 MiB answer cap.
* ``hoarding``: 520 connections without identity, each sending an empty request, against a
  ``DataPlane``; median latency of 5 honest requests on fresh connections. Before: every
  honest connection refused for the 80 s tried.

Runs alone (2 cores: another busy process distorts timings). ``bench/adversarial.py`` imports
``run_all`` and ``table``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

BEFORE = {
    "flood_rss_mib": "363 -> 463 (20,000 records, linear)",
    "read_amplification_rss_mib": "463 -> 624 -> 772 -> 920",
    "hoarding": "every honest connection refused (80 s)",
}


def _rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return float("nan")


class _Bootstrap:
    """A real bootstrap subprocess on 127.0.0.1."""

    def __init__(self, home: Path) -> None:
        from swarmnode.testing import spawn, wait_until

        ready = home / "ready.json"
        args = ["-m", "swarmnode.roles.bootstrap", "--home", str(home), "--listen", "/ip4/127.0.0.1/tcp/0"]
        env = {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        self.proc = spawn(
            "bootstrap",
            [*args, "--ready-file", str(ready)],
            home / "log.txt",
            env=env,
            cwd=REPO,
            ready_file=ready,
        )
        self.info = wait_until(self.proc.ready, 120, "the bootstrap", procs=[self.proc], interval=0.1)

    def rss_mib(self) -> float:
        """Python process + its p2pd."""
        return _rss_mib(self.proc.pid) + _rss_mib(int(self.info["p2pd_pid"]))

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.info["http_url"] + "/status", timeout=10) as r:
            return json.loads(r.read())  # type: ignore[no-any-return]

    def healthz(self) -> int:
        try:
            with urllib.request.urlopen(self.info["http_url"] + "/healthz", timeout=10) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return int(e.code)

    def stop(self) -> None:
        import signal

        self.proc.stop(20, sig=signal.SIGTERM)


def _identities(n: int) -> list[Any]:
    """``n`` record-signing validators of fresh RSA identities (cheap Sybils)."""
    from hivemind.dht.crypto import RSASignatureValidator
    from hivemind.dht.validation import CompositeValidator
    from hivemind.utils.crypto import RSAPrivateKey

    from swarmnode.net.record_rules import RecordRulesValidator
    from swarmnode.net.records import OwnedRecordsOnlyValidator

    out = []
    for _ in range(n):
        signer = RSASignatureValidator(RSAPrivateKey())
        out.append((signer.local_public_key, CompositeValidator([signer, OwnedRecordsOnlyValidator(),
                                                                 RecordRulesValidator()])))  # fmt: skip
    return out


async def _store_as(attacker: Any, identity: Any, keys: list[str], subkeys: list[bytes], exp: float) -> int:
    marker, validator = identity
    dht = attacker._dht
    saved = dht.protocol.record_validator
    dht.protocol.record_validator = validator
    try:
        stored = await dht.store_many(
            keys=keys, values=[b"x" * 4000] * len(keys), expiration_time=exp,
            subkeys=[marker + s for s in subkeys],
        )  # fmt: skip
    finally:
        dht.protocol.record_validator = saved
    return sum(1 for ok in stored.values() if ok)


async def _flood(boot: _Bootstrap, identities: int, per_identity: int) -> dict[str, Any]:
    from swarmnode.net.config import NetConfig
    from swarmnode.net.hivemind_runtime import HivemindRuntime

    attacker = await HivemindRuntime.create(
        NetConfig(initial_peers=tuple(boot.info["maddrs"]), client_mode=True)
    )
    curve = [(0, round(boot.rss_mib(), 1))]
    attempted = accepted = 0
    t0 = time.perf_counter()
    try:
        ids = _identities(identities)
        for n, identity in enumerate(ids):
            for start in range(0, per_identity, 64):
                count = min(64, per_identity - start)
                keys = [f"flood/{n}/{start + i}" for i in range(count)]
                accepted += await _store_as(
                    attacker, identity, keys, [b"s0"] * count, HivemindRuntime.dht_time() + 890
                )
                attempted += count
            curve.append((attempted, round(boot.rss_mib(), 1)))
    finally:
        await attacker.stop()
    status = boot.status()
    return {
        "identities": identities,
        "records_attempted": attempted,
        "records_accepted_by_some_replica": accepted,
        "seconds": round(time.perf_counter() - t0, 1),
        "rss_curve_mib": curve,
        "rss_max_mib": max(r for _, r in curve),
        "storage": status["dht_storage"].get("storage"),
        "healthz": boot.healthz(),
    }


async def _read_amplification(boot: _Bootstrap, batches: int, gets: int) -> dict[str, Any]:
    from swarmnode.net.config import NetConfig
    from swarmnode.net.hivemind_runtime import HivemindRuntime

    peers = tuple(boot.info["maddrs"])
    attacker = await HivemindRuntime.create(NetConfig(initial_peers=peers, client_mode=True))
    reader = await HivemindRuntime.create(NetConfig(initial_peers=peers, client_mode=True))
    key = "stuffed/key"
    try:
        for identity in _identities(40):  # 40 x 8 subkeys tried: the key caps at 256
            await _store_as(attacker, identity, [key] * 8, [b"s%d" % i for i in range(8)],
                            HivemindRuntime.dht_time() + 890)  # fmt: skip
        curve = [round(boot.rss_mib(), 1)]
        seen = []
        failures = 0
        for _ in range(batches):
            for _ in range(gets):
                try:
                    seen.append(len(await reader.dht_get(key, timeout=10)))
                except Exception:  # noqa: BLE001 - a failed read is a figure here
                    failures += 1
            curve.append(round(boot.rss_mib(), 1))
    finally:
        await reader.stop()
        await attacker.stop()
    return {
        "records_in_key": max(seen) if seen else 0,
        "gets": batches * gets,
        "failed_gets": failures,
        "rss_after_each_batch_mib": curve,
        "healthz": boot.healthz(),
    }


async def _hoarding(connections: int, samples: int) -> dict[str, Any]:
    import struct

    from swarmnode.identity import NodeIdentity
    from swarmnode.net.dataplane import DataPlane
    from swarmnode.wire.kinds import Kind
    from swarmnode.wire.messages import ChunkHave

    have = ChunkHave(b"\x07" * 32, (1,))
    server = DataPlane(NodeIdentity.generate())

    async def echo(sender: str, envelope: Any, message: Any) -> Any:
        return have

    server.register(Kind.CHUNK_HAVE, echo)
    await server.start()
    writers = []
    latencies = []
    served = 0
    try:
        for _ in range(connections):
            _, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(struct.pack(">BI", 1, 0))  # a bare END: an empty request
            writers.append(writer)
        await asyncio.sleep(0.5)  # let the server take them all in (a benchmark, not a test)
        for _ in range(samples):
            client = DataPlane(NodeIdentity.generate())
            t0 = time.perf_counter()
            try:
                if await client.request(server.address, have, timeout=5.0) == have:
                    served += 1
                    latencies.append(time.perf_counter() - t0)
            except Exception:  # noqa: BLE001 - a refused honest request is the figure
                pass
            finally:
                await client.close()
    finally:
        for writer in writers:
            writer.close()
        stats = server.stats
        await server.close()
    return {
        "hostile_connections": connections,
        "honest_served": f"{served}/{samples}",
        "honest_latency_median_ms": round(statistics.median(latencies) * 1000, 1) if latencies else None,
        "honest_latency_max_ms": round(max(latencies) * 1000, 1) if latencies else None,
        "connections_evicted": stats.connections_evicted,
        "connections_refused": stats.connections_refused,
        "connections_struck_out": stats.connections_struck_out,
    }


def run_all(quick: bool = True) -> dict[str, Any]:
    """Every attack of this module; ``quick``: smaller floods (about a minute in all)."""
    figures: dict[str, Any] = {"machine": {"cores": os.cpu_count()}, "before": BEFORE}
    with tempfile.TemporaryDirectory(prefix="adv-net-") as tmp:
        boot = _Bootstrap(Path(tmp))
        try:
            figures["bootstrap_rss_start_mib"] = round(boot.rss_mib(), 1)
            ids, per = (40, 512) if quick else (120, 512)
            figures["flood"] = asyncio.run(_flood(boot, ids, per))
            figures["read_amplification"] = asyncio.run(_read_amplification(boot, 3, 30))
        finally:
            boot.stop()
    figures["hoarding"] = asyncio.run(_hoarding(520, 5))
    return figures


def table(figures: dict[str, Any]) -> str:
    flood, amp, hoard = figures["flood"], figures["read_amplification"], figures["hoarding"]
    storage = flood.get("storage") or {}
    rows = [
        ("attack", "now", "before (issue 19)"),
        (
            f"store flood: {flood['identities']} identities, {flood['records_attempted']:,} x 4 KB",
            f"RSS {figures['bootstrap_rss_start_mib']} -> max {flood['rss_max_mib']} MiB; storage "
            f"{storage.get('records', '?')} records / {storage.get('bytes', 0) >> 20} MiB (cap "
            f"{storage.get('max_bytes', 0) >> 20} MiB); /healthz {flood['healthz']}",
            BEFORE["flood_rss_mib"],
        ),
        (
            f"read amplification: {amp['gets']} gets of a full key ({amp['records_in_key']} records)",
            f"RSS {' -> '.join(str(x) for x in amp['rss_after_each_batch_mib'])} MiB; "
            f"{amp['failed_gets']} failed gets",
            BEFORE["read_amplification_rss_mib"],
        ),
        (
            f"data-plane hoarding: {hoard['hostile_connections']} connections",
            f"honest {hoard['honest_served']} served, median {hoard['honest_latency_median_ms']} ms, "
            f"max {hoard['honest_latency_max_ms']} ms",
            BEFORE["hoarding"],
        ),
    ]
    width = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [" | ".join(c.ljust(w) for c, w in zip(r, width, strict=True)) for r in rows]
    lines.insert(1, "-+-".join("-" * w for w in width))
    return "\n".join(lines) + f"\n(cores: {figures['machine']['cores']}; run alone)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", metavar="PATH", help="also write the figures here as JSON")
    parser.add_argument("--full", action="store_true", help="larger flood (120 identities)")
    args = parser.parse_args(argv)
    figures = run_all(quick=not args.full)
    print(table(figures))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
