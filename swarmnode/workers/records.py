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

A record read back is accepted only if its envelope verifies, its kind is
PEER_RECORD and its ``peer_id`` is the envelope's signer.
"""

from __future__ import annotations

import logging

from swarmnode.identity import NodeIdentity
from swarmnode.net.hivemind_runtime import HivemindRuntime
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
    return record


async def publish_record(runtime: HivemindRuntime, key: str, data: bytes, ttl: float) -> bool:
    expiration = HivemindRuntime.dht_time() + ttl
    return await runtime.dht_store(
        key, RECORD_SUBKEY, data, expiration, timeout=DHT_TIMEOUT, await_all_replicas=False
    )


async def read_records(runtime: HivemindRuntime, key: str) -> list[PeerRecord]:
    """Every valid record under ``key``; invalid ones are logged and skipped."""
    found = []
    for dht_record in await runtime.dht_get(key, timeout=DHT_TIMEOUT):
        record = read_record(dht_record.value)
        if isinstance(record, str):
            log.warning("ignoring record under %s from %s: %s", key, dht_record.owner, record)
            continue
        found.append(record)
    return found
