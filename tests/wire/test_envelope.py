"""Envelopes: the signing rule over received bytes, size checks before parsing, envelope ids."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest

from swarmnode.identity import NodeIdentity
from swarmnode.wire import limits
from swarmnode.wire import swarm_pb2 as pb
from swarmnode.wire.envelope import (
    Envelope,
    decode_envelope,
    encode_envelope,
    seal,
    seal_payload,
    sign_manifest,
    signed_message,
    to_ms,
    verify_manifest,
)
from swarmnode.wire.kinds import MAX_PAYLOAD_BYTES, Kind
from swarmnode.wire.messages import Heartbeat, TensorEntry, WeightManifestBody
from swarmnode.wire.reasons import WireError, WireReason

ME = NodeIdentity.from_seed(b"\x07" * 32)
BEAT = Heartbeat(round=1, model_id="tiny", policy_version=2, rollout_rate=1.5)


def _field(number: int, wire_type: int, value: bytes | int) -> bytes:
    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            byte = n & 0x7F
            n >>= 7
            out.append(byte | (0x80 if n else 0))
            if not n:
                return bytes(out)

    tag = varint(number << 3 | wire_type)
    if wire_type == 0:
        assert isinstance(value, int)
        return tag + varint(value)
    assert isinstance(value, bytes)
    return tag + varint(len(value)) + value


def test_signed_message_is_prefix_then_big_endian_sent_at_then_payload() -> None:
    assert signed_message(Kind.HEARTBEAT, 0x0102030405060708, b"PAY") == (
        b"swarmnode/v1/heartbeat\x00" + bytes([1, 2, 3, 4, 5, 6, 7, 8]) + b"PAY"
    )


def test_a_sealed_envelope_round_trips_and_verifies() -> None:
    env = seal(ME, BEAT, to_ms(1000.25))
    assert env.sent_at_ms == 1_000_250
    decoded = decode_envelope(encode_envelope(env))
    assert decoded == env
    assert isinstance(decoded, Envelope) and decoded.verify()
    assert decoded.sender_id == ME.peer_id


def test_verification_uses_received_bytes_so_a_different_encoding_still_verifies() -> None:
    env = seal(ME, BEAT, 5_000)
    # Fields in reverse order, plus an unknown envelope field: another serializer's output.
    data = b"".join(
        [
            _field(99, 2, b"relay-added"),
            _field(6, 2, env.signature),
            _field(5, 2, env.payload),
            _field(4, 0, env.sent_at_ms),
            _field(3, 2, env.sender_key),
            _field(2, 0, int(env.kind)),
            _field(1, 0, env.version),
        ]
    )
    assert data != encode_envelope(env)
    decoded = decode_envelope(data)
    assert isinstance(decoded, Envelope) and decoded.verify()
    assert decoded.envelope_id() == env.envelope_id(), "the id covers authenticated content only"


def test_envelope_id_is_sha256_of_sender_key_and_signed_message() -> None:
    env = seal(ME, BEAT, 5_000)
    assert env.envelope_id() == hashlib.sha256(ME.public_key + env.signed_message()).digest()


@pytest.mark.parametrize(
    "change",
    [
        {"kind": Kind.ANNOUNCE},
        {"sent_at_ms": 5_001},
        {"payload": b"\x08\x02"},
        {"sender_key": NodeIdentity.from_seed(b"\x08" * 32).public_key},
    ],
)
def test_changing_any_envelope_field_breaks_the_signature(change: dict[str, object]) -> None:
    env = seal(ME, BEAT, 5_000)
    assert not replace(env, **change).verify()  # type: ignore[arg-type]


def test_version_is_covered_through_the_prefix_not_only_by_the_decoder() -> None:
    # A v2 receiver would use "swarmnode/v2/..." prefixes: a v1 signature can never pass there.
    env = seal(ME, BEAT, 5_000)
    v2_message = b"swarmnode/v2/heartbeat\x00" + env.signed_message()[len(b"swarmnode/v1/heartbeat\x00") :]
    from swarmnode.identity import verify_signature

    assert not verify_signature(env.sender_key, env.signature, v2_message)


def test_oversized_input_is_refused_before_parsing() -> None:
    # Valid-looking protobuf would take long to parse; garbage proves no parse happened either way.
    result = decode_envelope(b"\xff" * (limits.MAX_ENVELOPE_BYTES + 1))
    assert isinstance(result, WireError) and result.reason is WireReason.TOO_LARGE


def test_envelope_at_exactly_the_cap_is_parsed() -> None:
    result = decode_envelope(b"\xff" * limits.MAX_ENVELOPE_BYTES)
    assert isinstance(result, WireError) and result.reason is WireReason.MALFORMED


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"version": 0}, WireReason.UNSUPPORTED_VERSION),
        ({"version": 2}, WireReason.UNSUPPORTED_VERSION),
        ({"kind": 0}, WireReason.UNKNOWN_KIND),
        ({"kind": 42}, WireReason.UNKNOWN_KIND),
        ({"sender_key": bytes(33)}, WireReason.MALFORMED),
        ({"signature": bytes(65)}, WireReason.MALFORMED),
        ({"payload": b"x" * (MAX_PAYLOAD_BYTES[Kind.HEARTBEAT] + 1)}, WireReason.TOO_LARGE),
    ],
)
def test_envelope_header_rules(fields: dict[str, object], reason: WireReason) -> None:
    base: dict[str, object] = {
        "version": 1,
        "kind": int(Kind.HEARTBEAT),
        "sender_key": bytes(32),
        "sent_at_ms": 1,
        "payload": b"",
        "signature": bytes(64),
    }
    data = pb.Envelope(**{**base, **fields}).SerializeToString()  # type: ignore[arg-type]
    result = decode_envelope(data)
    assert isinstance(result, WireError) and result.reason is reason


def test_encode_refuses_an_envelope_over_the_cap() -> None:
    env = seal_payload(ME, Kind.WEIGHT_MANIFEST, b"x" * limits.MAX_ENVELOPE_BYTES, 1)
    with pytest.raises(ValueError, match="limit"):
        encode_envelope(env)


def test_manifest_publisher_signature_is_independent_of_the_relay() -> None:
    publisher, relay = NodeIdentity.from_seed(b"\x01" * 32), NodeIdentity.from_seed(b"\x02" * 32)
    body = WeightManifestBody("m", 1, (TensorEntry("w", "U8", (10,), 0, 10),), 1024, (bytes(32),), 10)
    manifest = sign_manifest(publisher, body)
    assert verify_manifest(manifest)
    relayed = decode_envelope(encode_envelope(seal(relay, manifest, 1)))
    assert isinstance(relayed, Envelope) and relayed.verify() and relayed.sender_key == relay.public_key
    assert not verify_manifest(replace(manifest, body_bytes=manifest.body_bytes + b"\x00"))
    assert not verify_manifest(replace(manifest, publisher_key=relay.public_key))


def test_an_envelope_of_many_tiny_fields_is_refused_by_the_scan_before_parsing() -> None:
    result = decode_envelope(b"\x08\x01" * 1_000_000)  # 2 MB of `version = 1`: ~20 ms for the parser
    assert isinstance(result, WireError) and result.reason is WireReason.MALFORMED
    assert "more than 16 fields" in result.detail


def test_group_encoded_fields_are_refused_in_an_envelope() -> None:
    data = encode_envelope(seal(ME, BEAT, 5_000)) + b"\xa3\x01\xa4\x01"
    result = decode_envelope(data)
    assert (
        isinstance(result, WireError) and result.reason is WireReason.MALFORMED and "group" in result.detail
    )


def test_up_to_16_fields_with_unknown_ones_are_tolerated() -> None:
    env = seal(ME, BEAT, 5_000)
    unknown = b"".join(bytes([(n << 3) & 0x7F | 0x80, n >> 4, 0]) for n in range(20, 30))
    decoded = decode_envelope(encode_envelope(env) + unknown)
    assert decoded == env


def test_an_envelope_verifies_its_signature_once_and_a_changed_copy_is_judged_afresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Received envelopes travel from the data plane into admission as values: each layer may ask
    ``verify()``, one Ed25519 check is paid. A copy with any field changed is a new value."""
    import swarmnode.wire.envelope as envelope_module

    checks: list[bytes] = []
    real = envelope_module.verify_signature

    def counting(key: bytes, signature: bytes, message: bytes) -> bool:
        checks.append(signature)
        return real(key, signature, message)

    monkeypatch.setattr(envelope_module, "verify_signature", counting)
    decoded = decode_envelope(encode_envelope(seal(ME, Heartbeat(1, "m", 2, 3.0), to_ms(1e9))))
    assert isinstance(decoded, Envelope)
    assert decoded.verify() and decoded.verify() and decoded.verify()
    assert len(checks) == 1
    forged = replace(decoded, signature=bytes(64))
    assert not forged.verify() and not forged.verify()
    assert len(checks) == 2
    assert forged != decoded and replace(forged, signature=decoded.signature) == decoded
    assert "_verified" not in repr(decoded)


def _padded(data: bytes, extra: int) -> bytes:
    """``data`` plus one unknown length-delimited field (number 20) of ``extra`` zero bytes."""
    length = bytearray()
    n = extra
    while True:
        length.append(n & 0x7F | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return data + b"\xa2\x01" + bytes(length) + bytes(extra)


def test_bytes_beyond_an_envelopes_fields_are_capped_because_its_id_does_not_cover_them() -> None:
    # Red team rt24 F3: an honest envelope padded with an unknown field to 2 MiB kept its id and
    # was admitted, so any relay could make every pulled item cost 2 MiB.
    env = seal(ME, BEAT, 5_000)
    raw = encode_envelope(env)
    assert decode_envelope(_padded(raw, limits.MAX_ENVELOPE_EXTRA_BYTES - 4)) == env  # newer fields
    for padded in (
        _padded(raw, limits.MAX_ENVELOPE_EXTRA_BYTES),
        _padded(raw, limits.MAX_ENVELOPE_BYTES - len(raw) - 8),
        # A known field twice: the parser keeps the last, so the first is padding too.
        pb.Envelope(payload=b"\x00" * 4096).SerializeToString() + raw,
    ):
        result = decode_envelope(padded)
        assert isinstance(result, WireError) and result.reason is WireReason.MALFORMED
        assert "beyond its fields" in result.detail
