"""Offers pushed to a learner (swarmnode/activation/offers.py): rationed by the network they come
from, so identities, which cost nothing, cannot crowd out a worker on another network."""

from __future__ import annotations

import asyncio
import time

from swarmnode.activation.offers import DirectOffers, network_of
from swarmnode.identity import NodeIdentity
from swarmnode.net.dataplane import DataPlane, PeerRefused, RefuseRequest, request_source
from swarmnode.wire import Envelope, Kind, PeerRecord, Role, seal, to_ms

NOW = 1_800_000_000.0


def worker(n: int) -> PeerRecord:
    identity = NodeIdentity.from_seed(n.to_bytes(4, "big") * 8)
    return PeerRecord(peer_id=identity.peer_id, addresses=(f"127.0.0.1:{1000 + n}",), roles=(Role.WORKER,))


def test_a_network_is_an_ipv4_slash_24_or_an_ipv6_slash_48_and_the_fallback_is_one_network() -> None:
    assert network_of("203.0.113.77") == "203.0.113.0/24"
    assert network_of("::ffff:203.0.113.9") == "203.0.113.0/24"
    assert network_of("2001:db8:1:2::5") == "2001:db8:1::/48"
    assert network_of("fe80::1%eth0") == "fe80::/48"
    assert network_of("p2p:QmWhoever") == network_of("p2p:QmSomeoneElse") == "p2p"
    assert network_of("not an address") == "p2p"


def test_sybils_on_one_network_hold_per_network_places_however_many_identities_they_make() -> None:
    offers = DirectOffers(max_offers=16, per_network=4)
    kept = [offers.put(worker(n), NOW, "10.0.0.0/24", NOW) for n in range(100)]
    assert kept.count(None) == 4
    assert all(r is not None and r.startswith("network_full") for r in kept[4:])
    assert offers.put(worker(1000), NOW, "192.0.2.0/24", NOW) is None
    assert worker(1000).peer_id in offers.live(NOW)
    assert offers.stats()["refused"] == {"network_full": 96}


def test_a_full_table_gives_a_newcomer_the_stalest_place_of_the_most_crowded_network() -> None:
    offers = DirectOffers(max_offers=8, per_network=4)
    for n in range(4):  # 4 Sybils on one network, signed at NOW + n
        assert offers.put(worker(n), NOW + n, "10.0.0.0/24", NOW) is None
    for n in range(4, 8):  # 4 workers, each on a network of its own
        assert offers.put(worker(n), NOW, f"10.0.{n}.0/24", NOW) is None
    assert offers.put(worker(99), NOW, "198.51.100.0/24", NOW) is None  # full: evicts a Sybil
    live = offers.live(NOW)
    assert worker(0).peer_id not in live, "the stalest offer of the most crowded network goes"
    assert worker(99).peer_id in live and len(live) == 8
    assert offers.evicted == 1
    # When no network holds two more than the newcomer's would, nobody is evicted for it.
    balanced = DirectOffers(max_offers=4, per_network=4)
    for n in range(4):
        assert balanced.put(worker(n), NOW, f"10.1.{n}.0/24", NOW) is None
    refusal = balanced.put(worker(50), NOW, "10.2.0.0/24", NOW)
    assert refusal is not None and refusal.startswith("offers_full")


def test_an_offer_is_refreshed_only_by_a_newer_one_and_lapses_after_one_lifetime() -> None:
    offers = DirectOffers(max_age=60.0)
    record = worker(1)
    assert offers.put(record, NOW, "10.0.0.0/24", NOW) is None
    replay = offers.put(record, NOW, "10.9.9.0/24", NOW + 1)
    assert replay is not None and replay.startswith("not_newer")
    assert offers.put(record, NOW + 5, "10.0.0.0/24", NOW + 5) is None
    assert record.peer_id in offers.live(NOW + 64)
    assert offers.live(NOW + 66) == {}, (
        "a worker that stops pushing is gone one lifetime after its last offer"
    )


def test_receive_checks_who_signed_what_and_when() -> None:
    offers = DirectOffers()
    record = worker(1)
    mismatch = offers.receive(worker(2).peer_id, NOW, record, "10.0.0.1", NOW)
    assert mismatch is not None and mismatch.startswith("sender_mismatch")
    learner_only = PeerRecord(peer_id=record.peer_id, roles=(Role.LEARNER,))
    not_worker = offers.receive(record.peer_id, NOW, learner_only, "10.0.0.1", NOW)
    assert not_worker is not None and not_worker.startswith("not_a_worker")
    old = offers.receive(record.peer_id, NOW - 61, record, "10.0.0.1", NOW)
    assert old is not None and old.startswith("too_old")
    future = offers.receive(record.peer_id, NOW + 11, record, "10.0.0.1", NOW)
    assert future is not None and future.startswith("from_future")
    assert len(offers) == 0
    assert offers.receive(record.peer_id, NOW, record, "10.0.0.1", NOW) is None
    assert offers.live(NOW)[record.peer_id][1] == record


async def _sybils_then_honest_over_loopback() -> tuple[list[str], str | None, dict[str, object]]:
    offers = DirectOffers(max_offers=16, per_network=4)

    async def on_offer(sender: str, envelope: Envelope, message: PeerRecord) -> None:
        refusal = offers.receive(sender, envelope.sent_at_ms / 1000.0, message, request_source(), time.time())
        if refusal is not None:
            reason, _, detail = refusal.partition(": ")
            raise RefuseRequest(reason, detail)

    learner = DataPlane(NodeIdentity.from_seed(b"L" * 32), host="127.0.0.1")
    learner.register(Kind.PEER_RECORD, on_offer)
    await learner.start()
    outcomes: list[str] = []

    async def push(identity: NodeIdentity, source_host: str) -> str:
        record = PeerRecord(peer_id=identity.peer_id, addresses=(f"{source_host}:9",), roles=(Role.WORKER,))
        client = DataPlane(identity, source_host=source_host)
        try:
            await client.request(
                learner.address, None, envelope=seal(identity, record, to_ms(time.time())), timeout=10
            )
            return "kept"
        except PeerRefused as e:
            return e.reason
        finally:
            await client.close()

    try:
        # 40 identities from one address (127.1.0.1), then one worker from another /24 (127.2.0.1).
        for n in range(40):
            outcomes.append(await push(NodeIdentity.from_seed(b"S" + n.to_bytes(31, "big")), "127.1.0.1"))
        honest = await push(NodeIdentity.from_seed(b"H" * 32), "127.2.0.1")
    finally:
        await learner.close()
    return outcomes, honest if honest != "kept" else None, offers.stats()


def test_over_loopback_forty_identities_from_one_address_keep_four_places_and_the_honest_worker_gets_in() -> (
    None
):
    # Linux routes all of 127.0.0.0/8 to loopback: 127.1.0.1 and 127.2.0.1 are two networks.
    outcomes, honest_refusal, stats = asyncio.run(asyncio.wait_for(_sybils_then_honest_over_loopback(), 60))
    assert outcomes.count("kept") == 4
    assert outcomes.count("network_full") == 36
    assert honest_refusal is None
    assert stats["held"] == 5 and stats["networks"] == 2
