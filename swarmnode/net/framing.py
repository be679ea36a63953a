"""Framing of one request or response on a byte stream, with hard size limits.

Owns: the frame format used on swarmnode's libp2p streams and the reader that
refuses anything over its limits before buffering it.
Must not: open streams, apply timeouts (the caller wraps reads in one), or
interpret payloads.

A message is a sequence of frames::

    frame   = kind (1 byte) | length (4 bytes, big-endian) | payload (length bytes)
    kind    = DATA (0x00): payload is the next part of the message, 1..MAX_CHUNK bytes, and
                           at least MIN_DATA_FRAME bytes unless it is the message's last
              END  (0x01): the message is complete; empty payload
              ERROR(0x02): the sender refuses or failed; payload is UTF-8 text, <= MAX_ERROR

Why frames and not hivemind's one 8-byte length header: the reader learns the
size of every piece before reading it, so a peer can never make us buffer more
than our limit (hivemind's ``receive_raw_data`` trusts a 64-bit length), and
chunks of at most 256 KiB keep each write small.
"""

from __future__ import annotations

import asyncio
import enum
import struct
from collections.abc import Awaitable, Callable

MAX_CHUNK = 256 * 1024
# Every DATA frame but a message's last holds at least this much: a sender of 1-byte frames made
# the reader parse six wire bytes per byte its limits and budgets count, ~1.7 CPU s per MiB (red
# team rt87 P3: a core's worth at the 1 MiB/s download budget of unproven peers).
MIN_DATA_FRAME = 16 * 1024
# A frame's payload read that returns less than this with more due waits COALESCE_SECONDS, not
# reading the socket meanwhile (``_read_payload``): a stream wakes its reader at most ~100 times a
# second mid-frame however its sender splits its bytes.
COALESCE_BYTES = 4096
COALESCE_SECONDS = 0.01
# ... and only while the frame's reads average under this: a segment costs the reader ~70-90 µs,
# so at this size or more a trickle costs at most ~0.2 µs per byte counted.
TRICKLE_BYTES_PER_READ = 512
MAX_ERROR = 4096
_HEADER = struct.Struct(">BI")


class FrameKind(enum.IntEnum):
    DATA = 0
    END = 1
    ERROR = 2


class FramingError(Exception):
    """The peer broke the frame format (unknown kind, oversize frame, early end of stream)."""


class StreamEnded(FramingError):
    """The stream ended inside a message: the sender closed it early, or the network lost it. Unlike
    the other framing errors, a reader cannot tell which (a reset libp2p connection reads as a
    clean end), so a caller that charges the sender for broken framing should not charge this."""


class MessageTooLarge(Exception):
    """A message exceeded the receiver's limit; ``limit`` is that limit in bytes."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"message exceeds the {limit}-byte limit")
        self.limit = limit


class RemoteRefused(Exception):
    """The sender put an ERROR frame instead of a message; the text is its reason."""


async def write_message(
    writer: asyncio.StreamWriter,
    data: bytes,
    *,
    chunk_size: int = MAX_CHUNK,
    pace: Callable[[int], Awaitable[None]] | None = None,
) -> None:
    """Write ``data`` as DATA frames of at most ``chunk_size`` bytes, then END.

    ``pace(n)``, if given, is awaited before each frame of ``n`` payload bytes (an upload
    rate limiter: the data plane's token bucket).
    """
    if not MIN_DATA_FRAME <= chunk_size <= MAX_CHUNK:
        raise ValueError(f"chunk_size must be in {MIN_DATA_FRAME}..{MAX_CHUNK}")
    view = memoryview(data)
    for offset in range(0, len(view), chunk_size):
        piece = view[offset : offset + chunk_size]
        if pace is not None:
            await pace(len(piece))
        writer.write(_HEADER.pack(FrameKind.DATA, len(piece)))
        writer.write(piece)
        # drain() after each chunk bounds our own send buffer to about one chunk.
        await writer.drain()
    writer.write(_HEADER.pack(FrameKind.END, 0))
    await writer.drain()


async def write_error(writer: asyncio.StreamWriter, text: str) -> None:
    """Write one ERROR frame (text truncated to MAX_ERROR bytes)."""
    payload = text.encode("utf-8", errors="replace")[:MAX_ERROR]
    writer.write(_HEADER.pack(FrameKind.ERROR, len(payload)) + payload)
    await writer.drain()


class ReadProgress:
    """How many payload bytes of a message have arrived so far (read by a caller that timed out)."""

    __slots__ = ("received",)

    def __init__(self) -> None:
        self.received = 0


async def read_message(
    reader: asyncio.StreamReader, max_bytes: int, progress: ReadProgress | None = None
) -> bytes:
    """Read one message of at most ``max_bytes`` bytes.

    Raises MessageTooLarge as soon as a frame header announces more than the
    limit allows (before its payload is read), RemoteRefused on an ERROR
    frame, FramingError on anything malformed. ``progress``, when given,
    counts the payload bytes read so far, a partly read frame's too.
    """
    parts: list[bytes] = []
    total = 0
    short = 0  # the length of the last DATA frame, if under MIN_DATA_FRAME: it must be the last
    while True:
        try:
            header = await reader.readexactly(_HEADER.size)
        except asyncio.IncompleteReadError as e:
            raise StreamEnded("stream ended inside a message") from e
        kind, length = _HEADER.unpack(header)
        if short and kind == FrameKind.DATA:
            raise FramingError(
                f"a DATA frame of {short} bytes before another (all but the last hold >= {MIN_DATA_FRAME})"
            )
        if kind == FrameKind.END:
            if length != 0:
                raise FramingError("END frame with a payload")
            return b"".join(parts)
        if kind == FrameKind.ERROR:
            if length > MAX_ERROR:
                raise FramingError(f"ERROR frame of {length} bytes")
            text = await _read_payload(reader, length)
            raise RemoteRefused(text.decode("utf-8", errors="replace"))
        if kind != FrameKind.DATA:
            raise FramingError(f"unknown frame kind {kind}")
        if not 0 < length <= MAX_CHUNK:
            raise FramingError(f"DATA frame of {length} bytes (allowed 1..{MAX_CHUNK})")
        if total + length > max_bytes:
            raise MessageTooLarge(max_bytes)
        parts.append(await _read_payload(reader, length, progress))
        total += length
        short = length if length < MIN_DATA_FRAME else 0


async def _read_payload(
    reader: asyncio.StreamReader, length: int, progress: ReadProgress | None = None
) -> bytes:
    """``length`` bytes; ``progress`` counts them as they arrive, not only whole frames (red team
    rt29 F4: a frame one byte short of 256 KiB, then a stall, read as nothing at all).

    A read that returns less than ``COALESCE_BYTES`` with more of the frame due, while the frame's
    reads so far average under ``TRICKLE_BYTES_PER_READ``, stops reading the socket for
    ``COALESCE_SECONDS``, so the kernel gathers what arrives meanwhile and one read takes it: a
    sender trickling a legal frame one TCP segment at a time woke the reader per segment, 72-80 us
    of CPU per byte at 5,000 segments a second (red team rt88 F3; sleeping without pausing still
    ran the transport's receive per segment). Honest segments (~1,448 bytes) average above it: a
    pause after any short read added ~10 ms to a multi-segment answer (red team rt89 F1)."""
    parts: list[bytes] = []
    left = length
    while left:
        piece = await reader.read(left)
        if not piece:
            raise StreamEnded("stream ended inside a frame")
        parts.append(piece)
        left -= len(piece)
        if progress is not None:
            progress.received += len(piece)
        if left and len(piece) < COALESCE_BYTES and length - left < TRICKLE_BYTES_PER_READ * len(parts):
            await _gather_segments(reader)
    return b"".join(parts)


async def _gather_segments(reader: asyncio.StreamReader) -> None:
    transport = getattr(reader, "_transport", None)  # asyncio's own attribute; absent: sleep alone
    if not isinstance(transport, asyncio.ReadTransport) or transport.is_closing():
        await asyncio.sleep(COALESCE_SECONDS)
        return
    transport.pause_reading()
    try:
        await asyncio.sleep(COALESCE_SECONDS)
    finally:
        if not transport.is_closing():
            transport.resume_reading()
