"""Where learners and workers find each other: signed PeerRecords in the DHT.

Owns: the DHT keys, and writing / reading a peer's own signed ``PeerRecord``
(an encoded Envelope, so a record names its signer and any relay is harmless).
Must not: decide whom to activate (``core.activation``) or talk to a peer.

Keys (protocol/SPEC.md "Learner and workers"):
- ``swarmnode/<swarm>/learner/<learner peer id>``: the learner's record (its
  data-plane address, model id). Subkey ``record``.
- ``swarmnode/<swarm>/workers/<learner peer id>``: one record per worker offering
  itself to that learner (rate, price, hardware, address). Subkey ``record``,
  owned by the worker, so no peer can overwrite another's offer.

A record read back (``read_records``) is accepted only if its envelope verifies, its kind is
PEER_RECORD, its ``peer_id`` is the envelope's signer, it sits under its owner's own subkey
``record``, the DHT owner (the libp2p key that signed the DHT record) is the record's
``libp2p_peer_id``, and it was sent at most ``RECORD_MAX_AGE`` seconds ago (and not from the
future). Of several records naming one peer the newest ``sent_at`` wins. So nobody can re-store
a worker's signed offer under another owner to pin it (issue 19), and an offer the worker no
longer refreshes disappears within one lifetime even if a replica kept it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from swarmnode.activation.lifetime import MAX_CLOCK_AHEAD, RECORD_MAX_AGE
from swarmnode.identity import NodeIdentity
from swarmnode.net.hivemind_runtime import HivemindRuntime
from swarmnode.net.records import DhtRecord
from swarmnode.wire import Kind, PeerRecord, WireError, decode_envelope, decode_payload, encode_envelope, seal
from swarmnode.wire.envelope import to_ms

log = logging.getLogger(__name__)

RECORD_SUBKEY = b"record"
DHT_TIMEOUT = 10.0


def learner_key(swarm: str, learner_id: str) -> str:
    return f"swarmnode/{swarm}/learner/{learner_id}"


def workers_key(swarm: str, learner_id: str) -> str:
    return f"swarmnode/{swarm}/workers/{learner_id}"


def peer_address(record: PeerRecord) -> str:
    """Where to reach a peer's data plane: its first direct address, else its hivemind id."""
    return record.addresses[0] if record.addresses else f"p2p:{record.libp2p_peer_id}"


def signed_record(identity: NodeIdentity, record: PeerRecord, now: float) -> bytes:
    if record.peer_id != identity.peer_id:
        raise ValueError(f"record names {record.peer_id}, but {identity.peer_id} signs it")
    return encode_envelope(seal(identity, record, to_ms(now)))


def read_record(data: bytes) -> PeerRecord | str:
    """The record in ``data`` if it is a valid self-signed PeerRecord, else why not."""
    found = read_signed_record(data)
    return found if isinstance(found, str) else found[0]


def read_signed_record(data: bytes) -> tuple[PeerRecord, float] | str:
    """``(record, sent_at seconds)`` if ``data`` is a valid self-signed PeerRecord, else why not."""
    envelope = decode_envelope(data)
    if isinstance(envelope, WireError):
        return f"{envelope.reason}: {envelope.detail}"
    if envelope.kind != Kind.PEER_RECORD:
        return f"a {envelope.kind.label} envelope, not a peer record"
    if not envelope.verify():
        return "signature does not verify"
    record = decode_payload(envelope.kind, envelope.payload)
    if isinstance(record, WireError):
        return f"{record.reason}: {record.detail}"
    assert isinstance(record, PeerRecord)
    if record.peer_id != envelope.sender_id:
        return f"record names {record.peer_id} but {envelope.sender_id} signed it"
    return record, envelope.sent_at_ms / 1000.0


async def publish_record(runtime: HivemindRuntime, key: str, data: bytes, ttl: float) -> bool:
    expiration = HivemindRuntime.dht_time() + ttl
    return await runtime.dht_store(
        key, RECORD_SUBKEY, data, expiration, timeout=DHT_TIMEOUT, await_all_replicas=False
    )


async def read_records(
    runtime: HivemindRuntime, key: str, *, max_age: float = RECORD_MAX_AGE, now: float | None = None
) -> list[PeerRecord]:
    """The newest valid record of each peer under ``key`` (module docstring); others are skipped."""
    return select_records(await runtime.dht_get(key, timeout=DHT_TIMEOUT), key, max_age=max_age, now=now)


def select_records(
    dht_records: Iterable[DhtRecord], key: str, *, max_age: float = RECORD_MAX_AGE, now: float | None = None
) -> list[PeerRecord]:
    """``read_records`` without the DHT: the newest acceptable record per peer id, in peer-id order."""
    best = select_signed_records(dht_records, key, max_age=max_age, now=now)
    return [best[peer][1] for peer in sorted(best)]


async def read_signed_records(
    runtime: HivemindRuntime, key: str, *, max_age: float = RECORD_MAX_AGE, now: float | None = None
) -> dict[str, tuple[float, PeerRecord]]:
    """``read_records`` with when each record was signed: peer id -> (sent_at, record)."""
    found = await runtime.dht_get(key, timeout=DHT_TIMEOUT)
    return select_signed_records(found, key, max_age=max_age, now=now)


def newest(*tables: dict[str, tuple[float, PeerRecord]]) -> dict[str, PeerRecord]:
    """Per peer id, the record signed last among ``tables`` (the DHT's, the direct offers)."""
    best: dict[str, tuple[float, PeerRecord]] = {}
    for table in tables:
        for peer, (sent_at, record) in table.items():
            if peer not in best or sent_at > best[peer][0]:
                best[peer] = (sent_at, record)
    return {peer: best[peer][1] for peer in sorted(best)}


def select_signed_records(
    dht_records: Iterable[DhtRecord], key: str, *, max_age: float = RECORD_MAX_AGE, now: float | None = None
) -> dict[str, tuple[float, PeerRecord]]:
    """The newest acceptable record per peer id with when it was signed (module docstring)."""
    now = time.time() if now is None else now
    best: dict[str, tuple[float, PeerRecord]] = {}
    for dht_record in dht_records:
        problem: str | None = None
        found = read_signed_record(dht_record.value)
        if isinstance(found, str):
            problem = found
        elif dht_record.subkey != RECORD_SUBKEY:
            problem = f"under subkey {dht_record.subkey[:32]!r}, not {RECORD_SUBKEY!r}"
        elif dht_record.owner != found[0].libp2p_peer_id:
            problem = f"stored by {dht_record.owner}, but the record is {found[0].libp2p_peer_id}'s"
        elif found[1] < now - max_age:
            problem = f"sent {now - found[1]:.0f} s ago (older than {max_age:g} s)"
        elif found[1] > now + MAX_CLOCK_AHEAD:
            problem = f"sent {found[1] - now:.0f} s in the future"
        if problem is not None or isinstance(found, str):
            log.debug("ignoring record under %s from %s: %s", key, dht_record.owner, problem)
            continue
        record, sent_at = found
        previous = best.get(record.peer_id)
        if previous is None or sent_at > previous[0]:
            best[record.peer_id] = (sent_at, record)
    return best
