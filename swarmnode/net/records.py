"""Owned DHT records: who may write what, and how a record names its owner.

Owns: the record validators every swarmnode DHT peer runs, the layout of a
stored subkey (``[owner:<ssh-rsa key>]`` + the caller's subkey), and turning a
raw DHT dictionary into ``DhtRecord`` values with a checked owner.
Must not: do I/O, or know what the records mean (announcements are gossip's).

Rules enforced on every peer (on store *and* on get, by hivemind's DHTProtocol):

* ``RSASignatureValidator``: a record whose subkey carries an owner marker must
  be signed by that owner's key, so no peer can write or overwrite another's
  subkey; a replayed old record loses to the newer expiration.
* ``OwnedRecordsOnlyValidator``: every record must carry an owner marker and a
  value of at most ``max_value_bytes``, so honest peers neither store nor pass on
  anonymous or oversized records.
* ``record_rules.RecordRulesValidator`` (and the bounded storage it goes with):
  expiration caps per record kind, subkeys per owner, records per key and per
  owner, a bounded storage with fair-share eviction (protocol/SPEC.md 2.1).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from cryptography.exceptions import UnsupportedAlgorithm
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.validation import DHTRecord, RecordValidatorBase

from swarmnode.net.libp2p_identity import peer_id_from_owner_key

# Default cap on one record's value. A DHT "get" answers with every subkey of a key
# in one unary RPC, capped at 4 MiB in hivemind (oversize answers hang the caller),
# so values must stay small and keys must be sharded: with ~1 KiB of owner marker
# and signature per record, 4 KiB values leave room for ~800 subkeys per key.
DEFAULT_MAX_VALUE_BYTES = 4096

_OWNED_SUBKEY = re.compile(rb"^\[owner:(.+?)\](.*)$", re.DOTALL)
_OWNER_ANYWHERE = re.compile(RSASignatureValidator.PUBLIC_KEY_REGEX)
_FORBIDDEN_IN_VALUES = (b"[signature:", b"[owner:")


@dataclass(frozen=True)
class DhtRecord:
    """One record of a DHT key, as read back: its owner is checked, not claimed."""

    owner: str  # libp2p peer id whose key signed the record
    subkey: bytes  # the subkey the owner chose (owner marker removed)
    value: bytes
    expiration_time: float  # DHT time (seconds since the epoch, see hivemind.get_dht_time)


def owner_marker(public_key_ssh: bytes) -> bytes:
    """The marker hivemind's RSASignatureValidator looks for: ``[owner:<key>]``."""
    return RSASignatureValidator.PUBLIC_KEY_FORMAT.replace(b"_key_", public_key_ssh)


def check_storable(subkey: bytes, value: bytes, max_value_bytes: int) -> None:
    """Raise ValueError when (subkey, value) cannot be stored as one owned record."""
    for token in _FORBIDDEN_IN_VALUES:
        # The validator finds markers anywhere in subkeys and signatures anywhere in values.
        if token in value or token in subkey:
            raise ValueError(f"DHT subkeys and values must not contain {token!r}")
    if len(value) > max_value_bytes:
        raise ValueError(f"DHT value of {len(value)} bytes exceeds the {max_value_bytes}-byte record limit")


@lru_cache(maxsize=4096)
def _owner_of(owner_key_ssh: bytes) -> str | None:
    return peer_id_from_owner_key(owner_key_ssh)


def records_from_dictionary(entries: dict[Any, tuple[Any, float]]) -> list[DhtRecord]:
    """Owned records of one DHT dictionary value (``{subkey: (value, expiration)}``), sorted.

    Entries that are not owned bytes records are skipped: the validators already
    keep them out of honest peers, so they can only come from a local misuse.
    """
    records: list[DhtRecord] = []
    for subkey, (value, expiration_time) in entries.items():
        if not isinstance(subkey, bytes) or not isinstance(value, bytes):
            continue
        match = _OWNED_SUBKEY.match(subkey)
        if match is None:
            continue
        owner = _owner_of(match.group(1))
        if owner is None:
            continue
        records.append(DhtRecord(owner, match.group(2), value, float(expiration_time)))
    records.sort(key=lambda r: (r.owner, r.subkey))
    return records


class OwnerSignatureValidator(RSASignatureValidator):
    """hivemind's ``RSASignatureValidator`` that refuses, instead of raising on, an unparsable owner key.

    The owner marker is any bytes a peer puts in a subkey; hivemind parses it with
    ``load_ssh_public_key``, which raises ValueError or UnsupportedAlgorithm (found by
    fuzzing, tests/fuzz/atheris_wire.py) out of ``validate`` on a store or get.
    """

    def validate(self, record: DHTRecord) -> bool:
        try:
            return super().validate(record)
        except (ValueError, TypeError, UnsupportedAlgorithm):
            return False


class OwnedRecordsOnlyValidator(RecordValidatorBase):
    """Refuse records without an owner marker, and values above ``max_value_bytes``."""

    def __init__(self, max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES) -> None:
        # The value seen here is msgpack-encoded bytes: a few header bytes over the raw value.
        self._max_serialized = max_value_bytes + 8

    def validate(self, record: DHTRecord) -> bool:
        if len(record.value) > self._max_serialized:
            return False
        return _OWNER_ANYWHERE.search(record.subkey) is not None

    @property
    def priority(self) -> int:
        # Below RSASignatureValidator (10): on validation it runs after the signature
        # is checked and stripped, so the size check sees the caller's value.
        return 0

    def merge_with(self, other: RecordValidatorBase) -> bool:
        return isinstance(other, OwnedRecordsOnlyValidator)


def make_record_validators(
    signing_validator: RSASignatureValidator, max_value_bytes: int
) -> list[RecordValidatorBase]:
    """The validators every swarmnode DHT peer runs (see the module docstring)."""
    return [signing_validator, OwnedRecordsOnlyValidator(max_value_bytes)]
