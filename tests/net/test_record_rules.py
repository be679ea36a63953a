"""DHT record rules (swarmnode.net.record_rules): every limit, as plain calls on the storage."""

from __future__ import annotations

import time

from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord
from hivemind.utils.serializer import MSGPackSerializer
from hivemind.utils.timed_storage import get_dht_time

from swarmnode.net.record_rules import (
    PEER_RECORD,
    BoundedDHTStorage,
    RecordRules,
    RecordRulesValidator,
)

VALUE = b"v" * 4000


def owned(owner: str, subkey: bytes) -> bytes:
    return b"[owner:ssh-rsa " + owner.encode() + b"]" + subkey


def key(name: str) -> DHTID:
    return DHTID.generate(source=name)


def test_a_record_expiring_beyond_its_kinds_cap_is_refused_by_the_storage_and_the_validator() -> None:
    storage = BoundedDHTStorage()
    now = get_dht_time()
    ten_years = now + 10 * 365 * 86400
    assert not storage.store_subkey(key("k"), owned("m", b"record"), VALUE, ten_years)
    assert storage.refused["expiration_too_far"] == 1
    assert storage.store_subkey(key("k"), owned("h", b"record"), VALUE, now + PEER_RECORD.max_lifetime)
    validator = RecordRulesValidator()
    far = DHTRecord(b"k", MSGPackSerializer.dumps(owned("m", b"record")), VALUE, ten_years)
    near = DHTRecord(b"k", MSGPackSerializer.dumps(owned("m", b"record")), VALUE, now + 60)
    assert not validator.validate(far)
    assert validator.validate(near)
    assert not validator.validate(DHTRecord(b"k", b"\xc1garbage", VALUE, now + 60))  # no crash


def test_one_owner_keeps_at_most_its_kinds_subkeys_under_a_key_so_1200_subkeys_cannot_stuff_it() -> None:
    storage = BoundedDHTStorage()
    exp = get_dht_time() + 100
    workers = key("workers")
    stored = sum(storage.store_subkey(workers, owned("m", b"x%d" % i), VALUE, exp) for i in range(1200))
    assert stored == 8  # "other" kind: 8 subkeys per owner per key
    assert storage.refused["too_many_subkeys"] == 1192
    assert storage.store_subkey(key("workers"), owned("honest", b"record"), VALUE, exp)
    entries = storage.get(key("workers"))
    assert entries is not None and owned("honest", b"record") in entries.value.data


def test_a_full_key_makes_room_only_from_the_owner_holding_far_more_than_the_newcomer() -> None:
    storage = BoundedDHTStorage(RecordRules(max_records_per_key=16))
    exp = get_dht_time() + 100
    for i in range(8):
        assert storage.store_subkey(key("r"), owned("m", b"part%d" % i), VALUE, exp + i)
    for i in range(8):
        assert storage.store_subkey(key("r"), owned(f"s{i}", b"part0"), VALUE, exp)
    assert storage.records_under(key("r")) == 16
    # An honest newcomer takes the place of one of m's 8 records (m's earliest expiring goes).
    assert storage.store_subkey(key("r"), owned("honest", b"part0"), VALUE, exp)
    assert storage.records_under(key("r")) == 16
    data = storage.get(key("r")).value.data  # type: ignore[union-attr]
    assert owned("honest", b"part0") in data and owned("m", b"part0") not in data
    # A fresh Sybil cannot evict an owner holding a single record.
    full = BoundedDHTStorage(RecordRules(max_records_per_key=4))
    for i in range(4):
        assert full.store_subkey(key("r"), owned(f"h{i}", b"record"), VALUE, exp)
    assert not full.store_subkey(key("r"), owned("sybil", b"record"), VALUE, exp)
    assert full.refused["key_full"] == 1


def test_per_owner_quota_refuses_an_identity_spreading_records_over_many_keys() -> None:
    storage = BoundedDHTStorage(RecordRules(max_records_per_owner=100))
    exp = get_dht_time() + 100
    stored = sum(storage.store_subkey(key(f"k{i}"), owned("m", b"record"), VALUE, exp) for i in range(1000))
    assert stored == 100
    assert storage.refused["owner_records"] == 900
    assert storage.store_subkey(key("k0"), owned("honest", b"record"), VALUE, exp)


def test_a_full_storage_evicts_the_flooders_records_never_the_honest_ones() -> None:
    rules = RecordRules(max_total_records=1000, max_records_per_owner=400)
    storage = BoundedDHTStorage(rules)
    exp = get_dht_time() + 100
    honest = [(key(f"honest{i}"), owned(f"h{i}", b"record")) for i in range(50)]
    for k, sk in honest:
        assert storage.store_subkey(k, sk, VALUE, exp)
    for attacker in range(10):  # 10 identities x 400 records: 4x the storage
        for i in range(400):
            storage.store_subkey(key(f"a{attacker}-{i}"), owned(f"a{attacker}", b"record"), VALUE, exp)
    assert storage.total_records <= 1000
    assert storage.total_bytes <= rules.max_total_bytes
    for k, sk in honest:
        item = storage.get(k)
        assert item is not None and sk in item.value.data
    assert storage.evicted > 0


def test_expired_records_are_freed_on_the_next_store_not_kept_until_read() -> None:
    storage = BoundedDHTStorage()
    # Expiring a second ahead: at 0.05 s, storing the 100 records on a loaded CI machine outlasted
    # it, and a store of an already expired record is refused (seen once: k61 of 100).
    expires = get_dht_time() + 1.0
    for i in range(100):
        assert storage.store_subkey(key(f"k{i}"), owned("a", b"record"), VALUE, expires)
    assert storage.total_records == 100
    while get_dht_time() <= expires + 0.05:
        time.sleep(0.02)
    storage.store_subkey(key("other"), owned("b", b"record"), VALUE, get_dht_time() + 10)
    assert storage.total_records == 1
    assert len(storage.data) == 1  # memory freed, not only hidden


def test_a_whole_dictionary_cached_as_one_value_goes_through_the_same_rules() -> None:
    from hivemind.dht.storage import DictionaryDHTValue

    cache = BoundedDHTStorage()
    exp = get_dht_time() + 100
    found = DictionaryDHTValue()
    for i in range(50):
        found.store(owned("m", b"x%d" % i), VALUE, exp)
    found.store(owned("h", b"record"), VALUE, exp)
    assert cache.store(key("k"), found, exp)
    assert cache.records_under(key("k")) == 9  # 8 of m's, 1 honest
