"""Message kinds, their signing prefixes and their payload size caps.

Owns: the mapping kind -> (wire number, signing prefix, payload cap). Must not:
reuse a number or a prefix; a retired kind keeps its number reserved forever.
"""

from __future__ import annotations

from enum import IntEnum

from swarmnode.wire import limits


class Kind(IntEnum):
    """``swarmnode.v1.Kind``; the numbers are the wire values."""

    PEER_RECORD = 1
    ROLLOUT_BATCH = 2
    ANNOUNCE = 3
    WEIGHT_MANIFEST = 4
    CHUNK_REQUEST = 5
    CHUNK_DATA = 6
    ACTIVATE = 7
    DEACTIVATE = 8
    HEARTBEAT = 9
    CHUNK_HAVE = 10
    REFUSAL = 11

    @property
    def label(self) -> str:
        """Lower-case name used in signing prefixes, logs and file names."""
        return self.name.lower()


class Role(IntEnum):
    """``swarmnode.v1.Role``."""

    TRAINER = 1
    LEARNER = 2
    WORKER = 3
    BOOTSTRAP = 4


def signing_prefix(kind: Kind) -> bytes:
    """Domain-separation prefix for envelopes of ``kind``: ``swarmnode/v1/<label>\\0``."""
    return _PREFIXES[kind]


_PREFIXES = {kind: f"swarmnode/v{limits.PROTOCOL_VERSION}/{kind.label}".encode() + b"\x00" for kind in Kind}

#: Prefix for the publisher's signature inside a WeightManifest (not an envelope kind).
MANIFEST_BODY_PREFIX = f"swarmnode/v{limits.PROTOCOL_VERSION}/weight_manifest_body".encode() + b"\x00"

#: Payload byte caps per kind, checked on the envelope before the payload is parsed.
MAX_PAYLOAD_BYTES: dict[Kind, int] = {
    Kind.PEER_RECORD: 8 * limits.KIB,
    Kind.ROLLOUT_BATCH: 1 * limits.MIB,
    Kind.ANNOUNCE: 16 * limits.KIB,
    Kind.WEIGHT_MANIFEST: limits.MAX_ENVELOPE_BYTES - 1 * limits.KIB,
    Kind.CHUNK_REQUEST: 256,
    Kind.CHUNK_DATA: limits.MAX_CHUNK_SLICE + 256,
    Kind.ACTIVATE: 1 * limits.KIB,
    Kind.DEACTIVATE: 1 * limits.KIB,
    Kind.HEARTBEAT: 1 * limits.KIB,
    Kind.CHUNK_HAVE: 40 * limits.KIB,  # 16,384 packed indices of <= 3 bytes, and the digest
    Kind.REFUSAL: 1 * limits.KIB,
}
