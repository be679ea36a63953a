"""Issue 19: which PeerRecords a reader accepts (swarmnode.activation.records.select_records)."""

from __future__ import annotations

import time

from swarmnode.activation.records import RECORD_SUBKEY, select_records, signed_record
from swarmnode.identity import NodeIdentity
from swarmnode.net.records import DhtRecord
from swarmnode.wire import PeerRecord, Role

LIBP2P = "QmWorkerLibp2pId"


def offer(identity: NodeIdentity, port: int, sent_at: float) -> bytes:
    record = PeerRecord(identity.peer_id, LIBP2P, (f"127.0.0.1:{port}",), (Role.WORKER,))
    return signed_record(identity, record, sent_at)


def test_only_the_owners_own_fresh_record_under_its_subkey_counts_and_the_newest_wins() -> None:
    worker = NodeIdentity.generate()
    now = time.time()
    a, b = offer(worker, 1, now - 20), offer(worker, 2, now - 1)
    replayed = DhtRecord("QmAttacker", RECORD_SUBKEY, a, now + 170)  # under another owner
    other_subkey = DhtRecord(LIBP2P, b"s7", a, now + 30)
    assert select_records([replayed, other_subkey], "k", now=now) == []
    records = [
        replayed,
        other_subkey,
        DhtRecord("QmAttacker", RECORD_SUBKEY, b, now + 170),
        DhtRecord(LIBP2P, RECORD_SUBKEY, a, now + 30),  # an older replica's copy
        DhtRecord(LIBP2P, RECORD_SUBKEY, b, now + 30),
    ]
    chosen = select_records(records, "k", now=now)
    assert [r.addresses for r in chosen] == [("127.0.0.1:2",)]  # newest sent_at wins


def test_an_offer_older_than_one_lifetime_or_from_the_future_is_dropped() -> None:
    worker = NodeIdentity.generate()
    now = time.time()
    old = DhtRecord(LIBP2P, RECORD_SUBKEY, offer(worker, 1, now - 61), now + 30)
    future = DhtRecord(LIBP2P, RECORD_SUBKEY, offer(worker, 1, now + 60), now + 30)
    garbage = DhtRecord(LIBP2P, RECORD_SUBKEY, b"\x00not an envelope", now + 30)
    assert select_records([old, future, garbage], "k", now=now) == []
    assert len(select_records([old], "k", now=now, max_age=120)) == 1
