"""Hypothesis strategies for hostile bytes: raw, protobuf-shaped, and mutations of valid vectors."""

from __future__ import annotations

import math
import struct
from pathlib import Path

from hypothesis import strategies as st

VECTORS = Path(__file__).resolve().parents[2] / "protocol" / "vectors"
VECTOR_BYTES = {p.name: p.read_bytes() for p in sorted(VECTORS.glob("*.bin"))}


def varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def tag(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


# Numbers that sit on limits and type boundaries, more often than uniform draws would.
EDGE_INTS = st.sampled_from(
    [
        0,
        1,
        2,
        31,
        32,
        63,
        64,
        65,
        255,
        256,
        1023,
        1024,
        1025,
        8191,
        8192,
        8193,
        2**31 - 1,
        2**32 - 1,
        2**32,
        2**63 - 1,
        2**64 - 1,
        999_999_999,
        1_000_000_000,
    ]
)
INTS = st.one_of(EDGE_INTS, st.integers(min_value=0, max_value=2**64 - 1))
DOUBLES = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5, 1e-300, -1e300, math.nan, math.inf, -math.inf]),
    st.floats(allow_nan=True, allow_infinity=True),
)


@st.composite
def proto_message(draw: st.DrawFn, depth: int = 0) -> bytes:
    """Well-formed protobuf wire data with random field numbers, wire types and contents."""
    parts = []
    for _ in range(draw(st.integers(0, 8))):
        field = draw(st.one_of(st.integers(1, 8), st.integers(1, 2**29 - 1)))
        kind = draw(st.sampled_from(["varint", "double", "fixed32", "bytes", "nested", "text"]))
        if kind == "varint":
            parts.append(tag(field, 0) + varint(draw(INTS)))
        elif kind == "double":
            parts.append(tag(field, 1) + struct.pack("<d", draw(DOUBLES)))
        elif kind == "fixed32":
            parts.append(tag(field, 5) + draw(st.binary(min_size=4, max_size=4)))
        elif kind == "nested" and depth < 3:
            inner = draw(proto_message(depth + 1))
            parts.append(tag(field, 2) + varint(len(inner)) + inner)
        elif kind == "text":
            text = draw(st.text(max_size=64)).encode("utf-8", "surrogatepass")
            parts.append(tag(field, 2) + varint(len(text)) + text)
        else:
            blob = draw(st.binary(max_size=64))
            parts.append(tag(field, 2) + varint(len(blob)) + blob)
    return b"".join(parts)


@st.composite
def mutated_vector(draw: st.DrawFn) -> tuple[str, bytes]:
    """A committed vector with bit flips, a truncation, an insertion, a deletion or a splice."""
    name = draw(st.sampled_from(sorted(VECTOR_BYTES)))
    data = bytearray(VECTOR_BYTES[name])
    how = draw(st.sampled_from(["flip", "truncate", "insert", "delete", "splice"]))
    if how == "flip" and data:
        for _ in range(draw(st.integers(1, 8))):
            i = draw(st.integers(0, len(data) - 1))
            data[i] ^= 1 << draw(st.integers(0, 7))
    elif how == "truncate":
        data = data[: draw(st.integers(0, max(len(data) - 1, 0)))]
    elif how == "insert":
        i = draw(st.integers(0, len(data)))
        data[i:i] = draw(st.binary(min_size=1, max_size=16))
    elif how == "delete" and data:
        i = draw(st.integers(0, len(data) - 1))
        del data[i : i + draw(st.integers(1, 16))]
    else:
        other = VECTOR_BYTES[draw(st.sampled_from(sorted(VECTOR_BYTES)))]
        cut_a = draw(st.integers(0, len(data)))
        cut_b = draw(st.integers(0, len(other)))
        data = data[:cut_a] + other[cut_b:]
    return name, bytes(data)
