"""Signed envelopes: the signing rule, envelope encode/decode, envelope ids.

Owns: what bytes get signed (protocol/SPEC.md "Signing")::

    signed_message = signing_prefix(kind) || uint64_be(sent_at_ms) || payload
    signature      = Ed25519(sender_key, signed_message)

Every input is a raw field of the envelope as received, so verification never
re-encodes anything. ``version`` and ``kind`` are covered through the prefix,
``sender_key`` by Ed25519 itself. Also owns the envelope id, the digest by which
peers announce, request and de-duplicate envelopes::

    envelope_id = SHA-256(sender_key || signed_message)

Must not: parse payloads (``messages.decode_payload``), read a clock, or decide
admission (``swarmnode.admit``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Protocol

from google.protobuf.message import DecodeError

from swarmnode.identity import peer_id_from_key, verify_signature
from swarmnode.wire import limits
from swarmnode.wire import swarm_pb2 as pb
from swarmnode.wire.kinds import MANIFEST_BODY_PREFIX, MAX_PAYLOAD_BYTES, Kind, signing_prefix
from swarmnode.wire.messages import (
    Message,
    WeightManifest,
    WeightManifestBody,
    encode_manifest_body,
    encode_payload,
    kind_of,
)
from swarmnode.wire.reasons import WireError, WireReason

_KINDS = frozenset(int(k) for k in Kind)


class Signer(Protocol):
    """Anything that can sign: ``swarmnode.identity.NodeIdentity`` in the node."""

    @property
    def public_key(self) -> bytes: ...

    def sign(self, message: bytes) -> bytes: ...


def signed_message(kind: Kind, sent_at_ms: int, payload: bytes) -> bytes:
    """The exact bytes an envelope's signature covers."""
    return signing_prefix(kind) + sent_at_ms.to_bytes(8, "big") + payload


@dataclass(frozen=True, slots=True)
class Envelope:
    version: int
    kind: Kind
    sender_key: bytes
    sent_at_ms: int
    payload: bytes
    signature: bytes
    _verified: bool | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def sender_id(self) -> str:
        """Peer id of ``sender_key`` (authentic only once ``verify()`` is true)."""
        return peer_id_from_key(self.sender_key)

    def signed_message(self) -> bytes:
        return signed_message(self.kind, self.sent_at_ms, self.payload)

    def envelope_id(self) -> bytes:
        return hashlib.sha256(self.sender_key + self.signed_message()).digest()

    def verify(self) -> bool:
        """Whether ``signature`` is ``sender_key``'s over the signed bytes.

        Computed once per envelope value and remembered: an envelope is immutable, so its answer
        cannot change, and a received envelope that travels from the data plane into admission
        pays for one Ed25519 verification, not one per layer that asks."""
        known = self._verified
        if known is None:
            known = verify_signature(self.sender_key, self.signature, self.signed_message())
            object.__setattr__(self, "_verified", known)  # frozen: the one write, of a pure function
        return known


def to_ms(seconds: float) -> int:
    """Wall-clock seconds (``time.time()``) -> the envelope's ``sent_at_ms``."""
    return int(seconds * 1000)


def seal_payload(signer: Signer, kind: Kind, payload: bytes, sent_at_ms: int) -> Envelope:
    """Sign raw payload bytes as ``kind``. No validation: for tests and vectors; nodes use ``seal``."""
    signature = signer.sign(signed_message(kind, sent_at_ms, payload))
    return Envelope(limits.PROTOCOL_VERSION, kind, signer.public_key, sent_at_ms, payload, signature)


def seal(signer: Signer, message: Message, sent_at_ms: int) -> Envelope:
    """Encode ``message`` (``ValueError`` if a receiver would refuse it) and sign it."""
    return seal_payload(signer, kind_of(message), encode_payload(message), sent_at_ms)


def encode_envelope(envelope: Envelope) -> bytes:
    """Envelope -> bytes to send; ``ValueError`` if the result would be over the size cap."""
    data: bytes = pb.Envelope(
        version=envelope.version,
        kind=int(envelope.kind),  # type: ignore[arg-type]
        sender_key=envelope.sender_key,
        sent_at_ms=envelope.sent_at_ms,
        payload=envelope.payload,
        signature=envelope.signature,
    ).SerializeToString(deterministic=True)
    if len(data) > limits.MAX_ENVELOPE_BYTES:
        raise ValueError(f"envelope is {len(data)} bytes; the limit is {limits.MAX_ENVELOPE_BYTES}")
    return data


def _varint(data: bytes, pos: int) -> tuple[int, int] | None:
    """(value, next position) of the varint at ``pos``, or None if truncated or over 10 bytes."""
    value = 0
    for shift in range(0, 70, 7):
        if pos >= len(data):
            return None
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
    return None


def _scan_fields(data: bytes, max_fields: int) -> str | None:
    """Walk the top-level fields without parsing their contents; why they are unacceptable, if so."""
    pos, count, end = 0, 0, len(data)
    while pos < end:
        count += 1
        if count > max_fields:
            return f"more than {max_fields} fields"
        tag = _varint(data, pos)
        if tag is None:
            return "truncated field tag"
        key, pos = tag
        wire_type = key & 7
        if key >> 3 == 0:
            return "field number 0"
        if wire_type == 0:
            value = _varint(data, pos)
            if value is None:
                return "truncated varint"
            pos = value[1]
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        elif wire_type == 2:
            length = _varint(data, pos)
            if length is None:
                return "truncated length"
            pos = length[1] + length[0]
        else:
            return f"wire type {wire_type} (groups are not allowed in an envelope)"
    return None if pos == end else "truncated field"


def decode_envelope(data: bytes) -> Envelope | WireError:
    """Bytes from a peer -> ``Envelope`` (signature not yet checked), or why not. Never raises.

    Order: raw size first (nothing is parsed above the cap), then a scan of the
    top-level fields (at most ``MAX_ENVELOPE_FIELDS``, no group encoding: a
    megabyte of one-byte fields would otherwise cost the parser ~20 ms), then
    parse, then version, kind, key and signature lengths, then the payload's
    per-kind cap, then the bytes beyond the fields' canonical encoding. The
    payload itself stays opaque bytes here.
    """
    if len(data) > limits.MAX_ENVELOPE_BYTES:
        return WireError(
            WireReason.TOO_LARGE, f"envelope is {len(data)} bytes; limit {limits.MAX_ENVELOPE_BYTES}"
        )
    problem = _scan_fields(data, limits.MAX_ENVELOPE_FIELDS)
    if problem is not None:
        return WireError(WireReason.MALFORMED, f"not an Envelope: {problem}")
    msg = pb.Envelope()
    try:
        msg.ParseFromString(data)
    except DecodeError as exc:
        return WireError(WireReason.MALFORMED, f"not an Envelope: {exc}")
    if msg.version != limits.PROTOCOL_VERSION:
        return WireError(WireReason.UNSUPPORTED_VERSION, f"version {msg.version}; this node speaks 1")
    if msg.kind not in _KINDS:
        return WireError(WireReason.UNKNOWN_KIND, f"kind {msg.kind}")
    kind = Kind(msg.kind)
    if len(msg.sender_key) != limits.PUBLIC_KEY_BYTES:
        return WireError(WireReason.MALFORMED, f"sender_key is {len(msg.sender_key)} bytes; must be 32")
    if len(msg.signature) != limits.SIGNATURE_BYTES:
        return WireError(WireReason.MALFORMED, f"signature is {len(msg.signature)} bytes; must be 64")
    if len(msg.payload) > MAX_PAYLOAD_BYTES[kind]:
        return WireError(
            WireReason.TOO_LARGE,
            f"{kind.label} payload is {len(msg.payload)} bytes; limit {MAX_PAYLOAD_BYTES[kind]}",
        )
    msg.DiscardUnknownFields()  # what remains is the fields as parsed, which re-encode canonically
    extra = len(data) - msg.ByteSize()
    if extra > limits.MAX_ENVELOPE_EXTRA_BYTES:
        return WireError(
            WireReason.MALFORMED,
            f"envelope carries {extra} bytes beyond its fields; limit {limits.MAX_ENVELOPE_EXTRA_BYTES}",
        )
    return Envelope(msg.version, kind, msg.sender_key, msg.sent_at_ms, msg.payload, msg.signature)


def manifest_signed_message(body_bytes: bytes) -> bytes:
    return MANIFEST_BODY_PREFIX + body_bytes


def sign_manifest(signer: Signer, body: WeightManifestBody) -> WeightManifest:
    """The publisher's signed manifest (relayable: the signature is independent of any envelope)."""
    body_bytes = encode_manifest_body(body)
    return WeightManifest(
        body=body,
        body_bytes=body_bytes,
        publisher_key=signer.public_key,
        signature=signer.sign(manifest_signed_message(body_bytes)),
    )


def verify_manifest(manifest: WeightManifest) -> bool:
    return verify_signature(
        manifest.publisher_key, manifest.signature, manifest_signed_message(manifest.body_bytes)
    )
