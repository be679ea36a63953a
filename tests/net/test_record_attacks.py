"""Issue 19 on a real bootstrap subprocess and real hivemind peers: no identity can hide
others' records under a key, and no replayed offer outlives its worker."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from swarmnode.activation.records import RECORD_SUBKEY, read_records, signed_record, workers_key
from swarmnode.identity import NodeIdentity
from swarmnode.net.hivemind_runtime import HivemindRuntime
from swarmnode.wire import PeerRecord, Role

from .support import LOOPBACK, Swarm, run

BOOTSTRAP = "swarmnode.roles.bootstrap"
TEN_YEARS = 10 * 365 * 86400.0


def offer(identity: NodeIdentity, runtime: HivemindRuntime, port: int) -> bytes:
    record = PeerRecord(
        peer_id=identity.peer_id,
        libp2p_peer_id=runtime.peer_id,
        addresses=(f"127.0.0.1:{port}",),
        roles=(Role.WORKER,),
    )
    return signed_record(identity, record, time.time())


async def stuff(attacker: HivemindRuntime, key: str, subkeys: int, expiration: float) -> int:
    """What the attack in issue 19 did: many owned subkeys of ~4 KB under one key (bypassing
    the runtime's own checks, straight into hivemind's DHTNode)."""
    dht = attacker._dht
    assert dht is not None
    marker = attacker.owner_marker
    accepted = 0
    for start in range(0, subkeys, 100):  # requests of ~400 KB, under hivemind's 4 MiB cap
        batch = range(start, min(subkeys, start + 100))
        stored = await dht.store_many(
            keys=[key] * len(batch),
            values=[b"x" * 4000] * len(batch),
            expiration_time=expiration,
            subkeys=[marker + b"s%d" % i for i in batch],
        )
        accepted += sum(1 for ok in stored.values() if ok)
    return accepted


async def poll(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(0.2)
    return False


def test_a_stuffed_key_still_reads_the_honest_offer_and_replays_die_with_their_worker(
    tmp_path: Path, spawn: Any
) -> None:
    boot = spawn(BOOTSTRAP, tmp_path / "boot", "--listen", LOOPBACK[0]).wait_ready()
    peers = boot["maddrs"]

    async def scenario() -> None:
        swarm = Swarm(tmp_path)
        try:
            learner = await swarm.add("learner", peers)
            worker = await swarm.add("worker", peers)
            attacker = await swarm.add("attacker", peers, client_mode=True)
            learner_id, worker_id = NodeIdentity.generate(), NodeIdentity.generate()
            key = workers_key("default", learner_id.peer_id)

            # 1. Stuffing: 1,200 subkeys x 4 KB, 10-year expiration. Refused by every replica.
            accepted = await stuff(attacker, key, 1200, HivemindRuntime.dht_time() + TEN_YEARS)
            assert accepted == 0
            # Through the runtime's own API the same store is a clear error, not a silent refusal.
            with pytest.raises(ValueError, match="may expire at most 180 s"):
                await attacker.dht_store(
                    key, RECORD_SUBKEY, b"x", HivemindRuntime.dht_time() + TEN_YEARS, timeout=5
                )
            # ... and with a legal expiration, one owner keeps at most 8 subkeys of that kind.
            await stuff(attacker, key, 200, HivemindRuntime.dht_time() + 100)
            found = await attacker.dht_get(key, timeout=10)
            assert 0 < len([r for r in found if r.owner == attacker.peer_id]) <= 8

            # 2. The honest offer is read (the get does not fail, nothing is hidden).
            now = HivemindRuntime.dht_time()
            data = offer(worker_id, worker, 4242)
            assert await worker.dht_store(key, RECORD_SUBKEY, data, now + 3, timeout=10)
            seen = await read_records(learner, key)
            assert [r.peer_id for r in seen] == [worker_id.peer_id]

            # 3. Replay: the attacker re-stores the worker's signed offer under its own owner.
            assert await attacker.dht_store(key, RECORD_SUBKEY, data, now + 170, timeout=10)
            raw = await learner.dht_get(key, timeout=10)
            assert any(r.owner == attacker.peer_id and r.value == data for r in raw), [
                (r.owner, r.subkey, len(r.value)) for r in raw
            ]
            # The worker stops refreshing (stops): gone from the reader within one lifetime
            # (here 4 s of max age, 3 s of TTL), though the attacker's copy lives on.
            await worker.stop()

            async def gone() -> bool:
                return not await read_records(learner, key, max_age=4.0)

            assert await poll(gone, timeout=15)
            raw = await learner.dht_get(key, timeout=10)
            assert any(r.owner == attacker.peer_id and r.value == data for r in raw)
        finally:
            await swarm.close()

    run(scenario(), timeout=150)
    with urllib.request.urlopen(boot["http_url"] + "/status", timeout=10) as response:
        status = json.loads(response.read())
    assert status["dht_storage"]["validator_refused"].get("expiration_too_far", 0) >= 1200
    assert status["dht_storage"]["storage"]["refused"].get("too_many_subkeys", 0) >= 1
