"""Every decoder, fed hostile bytes, returns a value (message or WireError) and never raises.

Bounded example counts keep this in the default suite; the atheris harness
(tests/fuzz/atheris_wire.py) runs the same targets open-ended.
"""

from __future__ import annotations

from datetime import timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarmnode.wire.envelope import Envelope, decode_envelope, encode_envelope
from swarmnode.wire.kinds import MAX_PAYLOAD_BYTES, Kind
from swarmnode.wire.messages import decode_manifest_body, decode_payload, kind_of
from swarmnode.wire.reasons import WireError, WireReason

from .strategies import VECTOR_BYTES, mutated_vector, proto_message, varint


def bounded(examples: int) -> settings:
    """Bounded examples (default suite) and bounded time: a decode over 2 s fails (they take microseconds)."""
    return settings(
        max_examples=examples,
        deadline=timedelta(seconds=2),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


KINDS = st.sampled_from(list(Kind))


@bounded(400)
@given(st.binary(max_size=4096))
def test_decode_envelope_never_raises_on_random_bytes(data: bytes) -> None:
    assert isinstance(decode_envelope(data), Envelope | WireError)


@bounded(300)
@given(proto_message())
def test_decode_envelope_never_raises_on_protobuf_shaped_bytes(data: bytes) -> None:
    result = decode_envelope(data)
    assert isinstance(result, Envelope | WireError)
    if isinstance(result, Envelope):
        assert len(result.sender_key) == 32 and len(result.signature) == 64
        assert len(result.payload) <= MAX_PAYLOAD_BYTES[result.kind]


@bounded(400)
@given(KINDS, st.binary(max_size=2048))
def test_every_payload_decoder_never_raises_on_random_bytes(kind: Kind, data: bytes) -> None:
    result = decode_payload(kind, data)
    assert isinstance(result, WireError) or kind_of(result) is kind


@bounded(500)
@given(KINDS, proto_message())
def test_every_payload_decoder_never_raises_on_protobuf_shaped_bytes(kind: Kind, data: bytes) -> None:
    result = decode_payload(kind, data)
    assert isinstance(result, WireError) or kind_of(result) is kind


@bounded(200)
@given(st.one_of(st.binary(max_size=1024), proto_message()))
def test_manifest_body_decoder_never_raises(data: bytes) -> None:
    decode_manifest_body(data)


@bounded(300)
@given(mutated_vector())
def test_mutated_vectors_decode_to_a_value(case: tuple[str, bytes]) -> None:
    _, data = case
    result = decode_envelope(data)
    if isinstance(result, Envelope):
        assert isinstance(decode_payload(result.kind, result.payload), WireError | object)
    else:
        assert isinstance(result, WireError)


@bounded(100)
@given(KINDS, st.integers(1, 4096))
def test_oversized_payloads_are_refused_by_the_envelope_decoder(kind: Kind, extra: int) -> None:
    payload = b"\x00" * (MAX_PAYLOAD_BYTES[kind] + extra)
    data = b"".join(
        [
            b"\x08\x01",
            b"\x10" + varint(int(kind)),
            b"\x1a\x20" + bytes(32),
            b"\x2a" + varint(len(payload)) + payload,
            b"\x32\x40" + bytes(64),
        ]
    )
    result = decode_envelope(data)
    assert isinstance(result, WireError) and result.reason is WireReason.TOO_LARGE


def test_valid_vectors_reencode_to_envelopes_that_decode_identically() -> None:
    for data in VECTOR_BYTES.values():
        result = decode_envelope(data)
        if isinstance(result, Envelope):
            assert decode_envelope(encode_envelope(result)) == result
