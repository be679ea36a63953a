"""Why a decoder refused some bytes, as a value (never an exception).

Owns: ``WireReason`` and ``WireError``. Must not: carry peer-controlled text of
unbounded length (details are truncated by the decoders).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class WireReason(StrEnum):
    TOO_LARGE = "too_large"  # raw envelope, or an envelope's payload, over its byte cap
    MALFORMED = "malformed"  # envelope bytes are not a valid Envelope (incl. key/signature lengths)
    UNSUPPORTED_VERSION = "unsupported_version"  # envelope version is not 1
    UNKNOWN_KIND = "unknown_kind"  # envelope kind is not one this version defines
    INVALID_PAYLOAD = "invalid_payload"  # payload does not parse, or a field has a forbidden value
    LIMIT_EXCEEDED = "limit_exceeded"  # a count or a length is over its limit


@dataclass(frozen=True, slots=True)
class WireError:
    reason: WireReason
    detail: str


def clip(value: object, limit: int = 80) -> str:
    """``repr`` of peer-controlled data, cut short so logs stay bounded."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"...({len(text)} chars)"
