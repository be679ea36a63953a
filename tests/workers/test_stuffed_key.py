"""A learner recruits a new worker although 256 Sybil identities fill its DHT offer key.

Specification (issue 19, "readers that cannot be starved"): the record rules cap one key at 256
records, so 256 fresh identities, each holding one valid-looking ``record``, make every DHT
replica refuse a new honest offer under ``workers/<learner>``. The worker also hands its offer
to the learner's data plane, which rations offers by network, not identity (workers/offers.py):
so the learner still sees, activates and trains on the new worker. Real processes on 127.0.0.1:
a bootstrap, a learner, a worker, and the attacker's hivemind peer in this process.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from swarmnode.activation.records import RECORD_SUBKEY, select_records, signed_record, workers_key
from swarmnode.identity import NodeIdentity, load_or_create_identity
from swarmnode.net.config import NetConfig
from swarmnode.net.hivemind_runtime import HivemindRuntime
from swarmnode.testing import LocalSwarm
from swarmnode.wire import PeerRecord, Role
from tests.net.support import LoopThread, sybil

pytestmark = [pytest.mark.network, pytest.mark.slow]

SYBILS = 256  # RecordRules.max_records_per_key


async def store_as_sybil(attacker: HivemindRuntime, key: str, value: bytes) -> bool:
    """Store ``value`` under ``key`` as a fresh identity's own ``record`` (hivemind's DHTNode directly)."""
    dht = attacker._dht
    assert dht is not None
    with sybil(attacker) as marker:
        async with asyncio.timeout(10):
            expiration = HivemindRuntime.dht_time() + 175.0
            return bool(await dht.store(key, value, expiration, subkey=marker + RECORD_SUBKEY))


def test_a_new_worker_is_recruited_while_sybils_fill_its_learners_offer_key(
    tmp_path: Path, worker_model: Path
) -> None:
    swarm = LocalSwarm(tmp_path / "swarm", worker_model, round_seconds=30.0)
    loop = LoopThread()
    attacker: HivemindRuntime | None = None
    try:
        maddrs = swarm.start_bootstrap()
        learner_home = swarm.write_node_config(
            "learner",
            0,
            **{"node.role": "learner", "learner.groups_per_step": 2, "learner.recruit_seconds": 1.0},
        )
        learner_id = load_or_create_identity(learner_home.identity_key).peer_id
        key = workers_key("default", learner_id)
        attacker = loop.run(
            HivemindRuntime.create(NetConfig(initial_peers=tuple(maddrs), client_mode=True)), timeout=90
        )
        stored = sum(loop.run(store_as_sybil(attacker, key, b"x" * 4000)) for _ in range(SYBILS))
        assert stored == SYBILS
        # The attack holds: one more identity's well-formed offer is refused by every replica.
        newcomer = NodeIdentity.from_seed(b"n" * 32)
        offer = PeerRecord(peer_id=newcomer.peer_id, addresses=("127.0.0.1:9",), roles=(Role.WORKER,))
        assert not loop.run(store_as_sybil(attacker, key, signed_record(newcomer, offer, time.time())))

        worker_home = swarm.write_node_config(
            "worker", 10, **{"node.role": "worker", "worker.learner": learner_id}
        )
        worker_id = load_or_create_identity(worker_home.identity_key).peer_id
        swarm.start_node("learner")
        swarm.start_node("worker")
        status = swarm.wait(
            lambda: (
                (s := swarm.status("learner")) is not None
                and s["steps_this_run"] >= 1
                and worker_id in s["offers"]
                and s
            ),
            "the learner to recruit the worker and take a step on its groups",
            timeout=150,  # the Sybils' records expire 175 s after they were stored
        )
        assert status["completions_by_worker"].get(worker_id, 0) > 0
        assert status["direct_offers"]["held"] == 1
        # And the worker's own DHT offer was indeed refused: the learner found it only directly.
        in_dht = select_records(loop.run(attacker.dht_get(key, timeout=10)), key)
        assert worker_id not in {r.peer_id for r in in_dht}
        worker = swarm.status("worker")
        assert worker is not None and worker["learner_address"] is not None
    finally:
        swarm.close()
        if attacker is not None:
            loop.run(attacker.stop(), timeout=30)
        loop.close()
