"""DHT record rules: how long a record may live, how many a peer may keep, how much a node stores.

Owns: the record kinds and their limits (``RecordRules``), the validator every swarmnode DHT
peer runs to refuse records beyond a kind's expiration cap or with an oversized subkey
(``RecordRulesValidator``), and the bounded local storage that replaces hivemind's
unbounded ``DHTLocalStorage`` for both the storage and the cache of a DHT node
(``BoundedDHTStorage``). protocol/SPEC.md "DHT record rules" is the normative text.
Must not: do I/O, read a clock other than hivemind's DHT time, or know what values mean.

Why: one identity stored 1,200 x 4 KB subkeys under one key with a 10-year expiration, so
every read of that key exceeded hivemind's 4 MiB answer cap and failed (the key was hidden
for good), and 20,000 x 4 KB records grew a bootstrap without bound (issue 19).

A record's *kind* comes from the caller's subkey (after the owner marker): ``record`` is a
PeerRecord (learner/worker offers), ``part<N>`` a gossip announcement part, anything else
(other applications sharing a bootstrap) the default kind. Rules, on every store:

* expiration at most ``kind.max_lifetime`` (+ clock slack) after now (validator and storage);
* at most ``kind.subkeys_per_owner`` subkeys of a kind per owner under one key (1 for ``record``);
* at most ``max_records_per_key`` records under one key; when full, a newcomer may take the
  place of the earliest-expiring record of the owner holding the most records there, but only
  if that owner holds at least two more than the newcomer (fair share), else it is refused;
* at most ``max_records_per_owner`` records and ``max_bytes_per_owner`` bytes per owner;
* at most ``max_total_records`` records and ``max_total_bytes`` bytes in all; when full, the
  same fair-share rule evicts from the owner holding the most bytes (ties: the identity this
  node met last), so a flood of identities evicts itself before it evicts anyone holding less.

Expired records are dropped from memory on the next store (hivemind only hides them).
"""

from __future__ import annotations

import heapq
import itertools
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DHTLocalStorage, DictionaryDHTValue
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils.serializer import MSGPackSerializer
from hivemind.utils.timed_storage import get_dht_time

_OWNED = re.compile(rb"^\[owner:(.+?)\](.*)$", re.DOTALL)
_PART = re.compile(rb"^part[0-9]{1,4}$")

CLOCK_SLACK = 10.0  # seconds: hivemind tolerates 3 s of skew between peers; a margin on top
ENTRY_OVERHEAD = 96  # bytes charged per record beyond its value and subkey (Python objects)


@dataclass(frozen=True)
class RecordKind:
    """One kind of record and its limits."""

    name: str
    max_lifetime: float  # seconds an expiration may lie beyond now
    subkeys_per_owner: int  # subkeys one owner may hold under one key


# A PeerRecord is republished every 5-10 s with a 30-60 s TTL: three lifetimes of 60 s.
PEER_RECORD = RecordKind("record", max_lifetime=180.0, subkeys_per_owner=1)
# An announcement lives up to (keep_rounds + 2) rounds: 120 s at the default 30-s rounds. The
# rules cannot know a swarm's round length (swarm.round_seconds has no upper bound), so the cap
# allows hour-long rounds: 4 x 3,600 s. Parts: max_own_items / max_digests_per_announcement = 64.
ANNOUNCEMENT = RecordKind("announcement", max_lifetime=4 * 3600.0, subkeys_per_owner=64)
OTHER = RecordKind("other", max_lifetime=900.0, subkeys_per_owner=8)


@dataclass(frozen=True)
class RecordRules:
    """Every limit of ``BoundedDHTStorage`` and ``RecordRulesValidator`` (module docstring)."""

    max_subkey_bytes: int = 64  # the caller's part of a subkey (after the owner marker)
    # 256 records of ~5 KB (4 KiB value + owner marker + signature) answer a get in ~1.3 MiB,
    # far below hivemind's 4 MiB unary cap: a key can never become unreadable.
    max_records_per_key: int = 256
    max_records_per_owner: int = 512
    max_bytes_per_owner: int = 2 * 1024 * 1024
    max_total_records: int = 32768
    max_total_bytes: int = 128 * 1024 * 1024
    clock_slack: float = CLOCK_SLACK
    kinds: tuple[RecordKind, ...] = field(default=(PEER_RECORD, ANNOUNCEMENT, OTHER))

    def kind_of(self, caller_subkey: bytes) -> RecordKind:
        if caller_subkey == b"record":
            return self._kind("record", PEER_RECORD)
        if _PART.match(caller_subkey):
            return self._kind("announcement", ANNOUNCEMENT)
        return self._kind("other", OTHER)

    def _kind(self, name: str, default: RecordKind) -> RecordKind:
        for kind in self.kinds:
            if kind.name == name:
                return kind
        return default

    def scaled(self, share: float) -> RecordRules:
        """The same rules with the global totals scaled by ``share`` (the cache's budget)."""
        return RecordRules(
            max_subkey_bytes=self.max_subkey_bytes,
            max_records_per_key=self.max_records_per_key,
            max_records_per_owner=self.max_records_per_owner,
            max_bytes_per_owner=self.max_bytes_per_owner,
            max_total_records=max(1, int(self.max_total_records * share)),
            max_total_bytes=max(1, int(self.max_total_bytes * share)),
            clock_slack=self.clock_slack,
            kinds=self.kinds,
        )


DEFAULT_RULES = RecordRules()
CACHE_SHARE = 0.25  # the cache (values a node found, or that peers pushed in_cache) gets a quarter


def split_subkey(subkey: Any) -> tuple[bytes, bytes] | None:
    """``(owner key, caller subkey)`` of a stored subkey ``[owner:<key>]<caller subkey>``, else None."""
    if not isinstance(subkey, bytes):
        return None
    match = _OWNED.match(subkey)
    if match is None:
        return None
    return match.group(1), match.group(2)


def refusal(rules: RecordRules, subkey: Any, expiration_time: float, now: float) -> str | None:
    """Why a record with this (deserialized) subkey and expiration breaks a stateless rule, else None."""
    parts = split_subkey(subkey)
    caller = parts[1] if parts is not None else b""
    if len(caller) > rules.max_subkey_bytes:
        return "subkey_too_long"
    kind = rules.kind_of(caller)
    if expiration_time > now + kind.max_lifetime + rules.clock_slack:
        return "expiration_too_far"
    return None


class RecordRulesValidator(RecordValidatorBase):
    """Refuse a record whose expiration lies beyond its kind's cap, or whose subkey is too long.

    Runs on store and on get (hivemind's DHTProtocol validates both), so a record stored by a
    peer without these rules is not passed on by one that has them.
    """

    def __init__(self, rules: RecordRules = DEFAULT_RULES) -> None:
        self.rules = rules
        self.refused: Counter[str] = Counter()  # records refused (on store or get), by reason

    def validate(self, record: DHTRecord) -> bool:
        try:
            subkey = MSGPackSerializer.loads(record.subkey)
        except Exception:  # noqa: BLE001 - msgpack raises many unrelated types on bad bytes
            self.refused["bad_subkey"] += 1
            return False
        reason = refusal(self.rules, subkey, record.expiration_time, float(get_dht_time()))
        if reason is not None:
            self.refused[reason] += 1
        return reason is None

    @property
    def priority(self) -> int:
        return 1  # no signature of its own: any order works

    def merge_with(self, other: RecordValidatorBase) -> bool:
        return isinstance(other, RecordRulesValidator)


@dataclass
class _Entry:
    owner: bytes
    size: int
    expiration: float


_Slot = tuple[DHTID, Any]  # (key, subkey or None for a regular value)


class BoundedDHTStorage(DHTLocalStorage):
    """hivemind's ``DHTLocalStorage`` under ``RecordRules`` (module docstring).

    Every way hivemind stores (``store``, ``store_subkey``, a whole dictionary cached as one
    value) goes through the rules; a refused record makes the store return False, which the
    DHT reports to the storing peer. ``refused`` counts refusals by reason.
    """

    def __init__(self, rules: RecordRules = DEFAULT_RULES) -> None:
        super().__init__(maxsize=None)
        self.rules = rules
        self._entries: dict[_Slot, _Entry] = {}
        self._key_owners: dict[DHTID, Counter[bytes]] = {}
        self._owner_slots: dict[bytes, set[_Slot]] = {}
        self._owner_bytes: Counter[bytes] = Counter()
        self._owner_seen: dict[bytes, int] = {}  # owner -> order in which this node met it
        self._seen_counter = itertools.count()
        self._expiry_heap: list[tuple[float, int, _Slot]] = []
        self._heap_counter = itertools.count()
        self._owner_heap: list[tuple[int, int, bytes]] = []  # lazy max-heap of (-bytes, -seen, owner)
        self.total_bytes = 0
        self.refused: Counter[str] = Counter()
        self.evicted = 0

    # ------------------------------------------------------------------ hivemind's interface

    def store(self, key: DHTID, value: Any, expiration_time: float, subkey: Any = None) -> bool:
        if subkey is not None:
            return self.store_subkey(key, subkey, value, expiration_time)
        if isinstance(value, DictionaryDHTValue):  # a found dictionary cached as one value
            with value.freeze():
                items = [(sk, item.value, item.expiration_time) for sk, item in value.items()]
            results = [self.store_subkey(key, sk, v, exp) for sk, v, exp in items]
            return any(results)
        if not self._admit(key, None, value, expiration_time):
            return False
        if not super().store(key, value, expiration_time):
            return False
        if key in self._key_owners:  # the regular value replaced the key's dictionary
            for slot in [s for s in self._entries if s[0] == key and s[1] is not None]:
                self._forget(slot)
        self._remember(key, None, value, expiration_time)
        return True

    def store_subkey(self, key: DHTID, subkey: Any, value: Any, expiration_time: float) -> bool:
        if not self._admit(key, subkey, value, expiration_time):
            return False
        if not super().store_subkey(key, subkey, value, expiration_time):
            return False
        if (key, None) in self._entries:
            self._forget((key, None))  # a dictionary replaced the key's regular value
        self._remember(key, subkey, value, expiration_time)
        return True

    # ------------------------------------------------------------------ figures

    @property
    def total_records(self) -> int:
        return len(self._entries)

    def records_under(self, key: DHTID) -> int:
        return sum(self._key_owners.get(key, Counter()).values())

    def owners(self) -> int:
        return len(self._owner_slots)

    # ------------------------------------------------------------------ rules

    def _admit(self, key: DHTID, subkey: Any, value: Any, expiration_time: float) -> bool:
        now = float(get_dht_time())
        self._sweep(now)
        reason = self._check(key, subkey, value, expiration_time, now)
        if reason is not None:
            self.refused[reason] += 1
            return False
        return True

    def _check(self, key: DHTID, subkey: Any, value: Any, expiration_time: float, now: float) -> str | None:
        if expiration_time < now:
            return None  # hivemind refuses it itself
        rules = self.rules
        reason = refusal(rules, subkey, expiration_time, now)
        if reason is not None:
            return reason
        parts = split_subkey(subkey)
        owner = parts[0] if parts is not None else b""
        kind = rules.kind_of(parts[1] if parts is not None else b"")
        size = _size(subkey, value)
        slot = (key, subkey)
        previous = self._entries.get(slot)
        if previous is not None:
            if expiration_time <= previous.expiration:
                return None  # hivemind keeps the newer one and returns False itself
            grow_records, grow_bytes = 0, size - previous.size
        else:
            grow_records, grow_bytes = 1, size
            if self._key_owners.get(key, Counter())[owner] and self._same_kind(key, owner, kind) >= (
                kind.subkeys_per_owner
            ):
                return "too_many_subkeys"
        if self._owner_bytes[owner] + grow_bytes > rules.max_bytes_per_owner:
            return "owner_bytes"
        if len(self._owner_slots.get(owner, ())) + grow_records > rules.max_records_per_owner:
            return "owner_records"
        if grow_records and self.records_under(key) >= rules.max_records_per_key:
            if not self._make_room_in_key(key, owner):
                return "key_full"
        while (
            self.total_bytes + grow_bytes > rules.max_total_bytes
            or len(self._entries) + grow_records > rules.max_total_records
        ):
            if not self._evict_for(owner, grow_bytes):
                return "storage_full"
        return None

    def _same_kind(self, key: DHTID, owner: bytes, kind: RecordKind) -> int:
        """Subkeys of ``kind`` that ``owner`` holds under ``key``."""
        count = 0
        for slot_key, subkey in self._owner_slots.get(owner, ()):
            if slot_key == key:
                parts = split_subkey(subkey)
                count += self.rules.kind_of(parts[1] if parts is not None else b"") == kind
        return count

    def _make_room_in_key(self, key: DHTID, newcomer: bytes) -> bool:
        """Fair share within a full key: evict one record of its largest holder if that holder
        has at least two more records there than the newcomer."""
        counts = self._key_owners[key]
        victim = max(counts, key=lambda o: (counts[o], self._owner_seen.get(o, -1)))
        if victim == newcomer or counts[victim] < counts[newcomer] + 2:
            return False
        slots = [s for s in self._owner_slots[victim] if s[0] == key]
        self._evict(min(slots, key=lambda s: self._entries[s].expiration))
        return True

    def _evict_for(self, newcomer: bytes, size: int) -> bool:
        """Fair share of the whole storage: evict one record of the owner holding the most bytes,
        if it holds more than the newcomer would after this store."""
        while self._owner_heap:
            neg_bytes, _, victim = self._owner_heap[0]
            if victim not in self._owner_slots or -neg_bytes != self._owner_bytes[victim]:
                heapq.heappop(self._owner_heap)  # stale heap entry
                continue
            if victim == newcomer or self._owner_bytes[victim] <= self._owner_bytes[newcomer] + size:
                return False
            slots = self._owner_slots[victim]
            self._evict(min(slots, key=lambda s: self._entries[s].expiration))
            return True
        return False

    # ------------------------------------------------------------------ bookkeeping

    def _remember(self, key: DHTID, subkey: Any, value: Any, expiration_time: float) -> None:
        slot = (key, subkey)
        if slot in self._entries:
            self._forget(slot)
        parts = split_subkey(subkey)
        owner = parts[0] if parts is not None else b""
        entry = _Entry(owner, _size(subkey, value), expiration_time)
        self._entries[slot] = entry
        self._key_owners.setdefault(key, Counter())[owner] += 1
        self._owner_slots.setdefault(owner, set()).add(slot)
        if owner not in self._owner_seen:
            self._owner_seen[owner] = next(self._seen_counter)
        self._owner_bytes[owner] += entry.size
        self.total_bytes += entry.size
        heapq.heappush(self._expiry_heap, (expiration_time, next(self._heap_counter), slot))
        self._push_owner(owner)

    def _forget(self, slot: _Slot) -> None:
        entry = self._entries.pop(slot, None)
        if entry is None:
            return
        key = slot[0]
        counts = self._key_owners[key]
        counts[entry.owner] -= 1
        if counts[entry.owner] <= 0:
            del counts[entry.owner]
        if not counts:
            del self._key_owners[key]
        slots = self._owner_slots[entry.owner]
        slots.discard(slot)
        self._owner_bytes[entry.owner] -= entry.size
        self.total_bytes -= entry.size
        if not slots:
            del self._owner_slots[entry.owner]
            del self._owner_bytes[entry.owner]
            self._owner_seen.pop(entry.owner, None)
        else:
            self._push_owner(entry.owner)

    def _evict(self, slot: _Slot) -> None:
        self.evicted += 1
        self._forget(slot)
        self._drop_from_data(slot)

    def _drop_from_data(self, slot: _Slot) -> None:
        key, subkey = slot
        item = self.data.get(key)
        if item is None:
            return
        if subkey is None:
            if not isinstance(item.value, DictionaryDHTValue):
                del self[key]
            return
        if isinstance(item.value, DictionaryDHTValue):
            if subkey in item.value.data:
                del item.value[subkey]
            if not item.value.data:
                del self[key]

    def _sweep(self, now: float) -> None:
        """Forget, and free, every record that expired (hivemind would keep it until its key is read)."""
        heap = self._expiry_heap
        while heap and heap[0][0] < now:
            expiration, _, slot = heapq.heappop(heap)
            entry = self._entries.get(slot)
            if entry is not None and entry.expiration == expiration:
                self._forget(slot)
                self._drop_from_data(slot)
        if len(self._owner_heap) > 4 * len(self._owner_slots) + 64:
            self._owner_heap = []
            for owner in self._owner_slots:
                self._push_owner(owner)

    def _push_owner(self, owner: bytes) -> None:
        heapq.heappush(self._owner_heap, (-self._owner_bytes[owner], -self._owner_seen.get(owner, 0), owner))


def _size(subkey: Any, value: Any) -> int:
    subkey_bytes = len(subkey) if isinstance(subkey, bytes | str) else 8
    value_bytes = len(value) if isinstance(value, bytes | str) else 64
    return subkey_bytes + value_bytes + ENTRY_OVERHEAD


def adopt(old: DHTLocalStorage, rules: RecordRules) -> BoundedDHTStorage:
    """A BoundedDHTStorage holding what ``old`` held (within the rules): installed right after
    hivemind created the node, so the few records stored during its bootstrap are kept."""
    new = BoundedDHTStorage(rules)
    for key, item in list(old.items()):
        new.store(key, item.value, item.expiration_time)
    return new
