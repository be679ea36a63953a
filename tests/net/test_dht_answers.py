"""Issue 19, read amplification through hivemind's find requests (swarmnode/net/dht_answers.py):
a request that names a full key many times, many such requests at once, against a real bootstrap
subprocess. The bootstrap answers each key once, never builds an answer over 3 MiB, pays every
value from one byte budget, and its memory stays flat; an honest read still gets the key."""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.request
from pathlib import Path
from typing import Any

from hivemind.dht.routing import DHTID
from hivemind.p2p import PeerID
from hivemind.proto import dht_pb2

from swarmnode.net.dht_answers import DEFAULT_ANSWER_RULES
from swarmnode.net.hivemind_runtime import HivemindRuntime

from .support import LOOPBACK, Swarm, run, sybil

BOOTSTRAP = "swarmnode.roles.bootstrap"
OWNERS = 32  # x 8 `other` subkeys of 4,000 bytes: the key's 256-record cap, ~1 MiB per answer


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


async def fill(attacker: HivemindRuntime, key: str) -> int:
    dht = attacker._dht
    assert dht is not None
    stored = 0
    for _ in range(OWNERS):
        with sybil(attacker) as marker:
            for j in range(8):
                expiration = HivemindRuntime.dht_time() + 600
                stored += bool(await dht.store(key, os.urandom(4000), expiration, subkey=marker + b"x%d" % j))
    return stored


def test_find_requests_naming_a_full_key_many_times_cannot_grow_the_bootstrap(
    tmp_path: Path, spawn: Any
) -> None:
    boot = spawn(BOOTSTRAP, tmp_path / "boot", "--listen", LOOPBACK[0]).wait_ready()
    pids = (boot["pid"], boot["p2pd_pid"])

    async def scenario() -> dict[str, Any]:
        swarm = Swarm(tmp_path)
        try:
            attacker = await swarm.add("attacker", boot["maddrs"], client_mode=True)
            reader = await swarm.add("reader", boot["maddrs"], client_mode=True)
            key = "test/fat-key"
            assert await fill(attacker, key) == OWNERS * 8
            # Each store is preceded by hivemind's own lookup of the key, which the bootstrap answers
            # with the (growing) value from the same byte budget: 256 stores made in well under a
            # second spend it all (CI saw every key below answered NOT_FOUND). What is checked here
            # is the per-request rules, so start from a full budget (32 MiB at 16 MiB/s: 2 s).
            await asyncio.sleep(DEFAULT_ANSWER_RULES.burst / DEFAULT_ANSWER_RULES.rate + 0.5)
            dht = attacker._dht
            assert dht is not None
            peer, key_id = PeerID.from_base58(boot["peer_id"]), DHTID.generate(source=key)

            # One request naming the key 20 times: the value is sent once (before: a 20 MiB answer
            # that no client could receive; the request timed out).
            request = dht_pb2.FindRequest(keys=[key_id.to_bytes()] * 20, peer=dht.protocol.node_info)
            stub = dht.protocol.get_stub(peer)
            response = await stub.rpc_find(request, timeout=30)
            found = [r for r in response.results if r.type == dht_pb2.FOUND_DICTIONARY]
            assert len(found) == 1 and len(response.results) == 20
            assert 256 * 4000 < len(found[0].value) < 2 * 1024 * 1024

            async def flood_request() -> Any:
                return await stub.rpc_find(request, timeout=60)

            before = sum(rss_mib(p) for p in pids)
            peak = before
            t0 = time.monotonic()
            for _ in range(3):  # what grew the bootstrap 415 MiB -> 8.5 GiB: 3 x 40 such requests
                tasks = [asyncio.create_task(flood_request()) for _ in range(40)]
                while not all(t.done() for t in tasks):
                    peak = max(peak, sum(rss_mib(p) for p in pids))
                    await asyncio.sleep(0.1)
                await asyncio.gather(*tasks, return_exceptions=True)
            elapsed = time.monotonic() - t0
            # An honest read after the flood gets every record once the byte budget has refilled
            # (burst 32 MiB at 16 MiB/s: about 2 s). Read right away, it can find the budget still
            # spent: a flood answered in 0.5 s left it empty (seen in CI), one answered over ~15 s
            # had refilled it meanwhile. So: read until whole, within 10 s of the flood.
            honest: list[Any] = []
            deadline = time.monotonic() + 10
            while len(honest) < OWNERS * 8 and time.monotonic() < deadline:
                honest = await reader.dht_get(key, timeout=30)
                if len(honest) < OWNERS * 8:
                    await asyncio.sleep(0.5)
            waited = round(time.monotonic() - t0 - elapsed, 2)
            return {
                "before": before,
                "peak": peak,
                "elapsed": elapsed,
                "honest": len(honest),
                "waited": waited,
            }
        finally:
            await swarm.close()

    out = run(scenario(), timeout=240)
    answers = json.loads(urllib.request.urlopen(boot["http_url"] + "/status", timeout=10).read())
    assert out["peak"] - out["before"] < 300, out  # MiB; before the fix it grew by ~8 GiB
    assert out["honest"] == OWNERS * 8, out
    stats = answers["dht_storage"]["answers"]
    assert stats["duplicate_keys"] >= 19 * 121, stats  # every copy after the first, every request
    # The flood asked for more than the byte budget (16 MiB/s, burst 32 MiB): the rest was refused.
    assert stats["values_over_budget"] > 0, stats
