"""Specification of the direct TCP data plane (swarmnode/net/dataplane.py) on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace

import pytest

from swarmnode.identity import NodeIdentity
from swarmnode.net.dataplane import (
    BadResponse,
    DataPlane,
    PeerRefused,
    PeerUnreachable,
    RefuseRequest,
    RemoteError,
    Reply,
    RequestTimeout,
)
from swarmnode.net.framing import read_message, write_message
from swarmnode.wire import limits
from swarmnode.wire.envelope import Envelope, encode_envelope, seal, seal_payload, to_ms
from swarmnode.wire.kinds import Kind
from swarmnode.wire.messages import ChunkData, ChunkHave, ChunkRequest, Heartbeat, Message, decode_payload

DIGEST = b"\x07" * 32


def asynctest(fn: Callable[[], Awaitable[None]]) -> Callable[[], None]:
    def test() -> None:
        asyncio.run(asyncio.wait_for(fn(), 60))

    test.__name__ = fn.__name__
    return test


def with_pair(fn: Callable[[tuple[DataPlane, DataPlane]], Awaitable[None]]) -> Callable[[], None]:
    def test() -> None:
        async def main() -> None:
            async with make_pair() as p:
                await fn(p)

        asyncio.run(asyncio.wait_for(main(), 60))

    test.__name__ = fn.__name__
    return test


@contextlib.asynccontextmanager
async def make_pair() -> AsyncIterator[tuple[DataPlane, DataPlane]]:
    server = DataPlane(NodeIdentity.from_seed(b"s" * 32))
    client = DataPlane(NodeIdentity.from_seed(b"c" * 32))

    async def echo_have(sender: str, envelope: Envelope, message: Message) -> Message:
        assert isinstance(message, ChunkHave)
        return ChunkHave(message.manifest_digest, tuple(sorted(message.chunk_indices))[:1])

    async def heartbeat(sender: str, envelope: Envelope, message: Message) -> None:
        return None

    async def chunk(sender: str, envelope: Envelope, message: Message) -> Message:
        assert isinstance(message, ChunkRequest)
        if message.chunk_index == 9:
            raise RefuseRequest("busy", "slots full")
        if message.chunk_index == 8:
            raise RuntimeError("handler bug")
        if message.chunk_index == 7:
            await asyncio.sleep(10)
        return ChunkData(message.manifest_digest, message.chunk_index, message.offset, b"x" * message.length)

    server.register(Kind.CHUNK_HAVE, echo_have)
    server.register(Kind.HEARTBEAT, heartbeat)
    server.register(Kind.CHUNK_REQUEST, chunk)
    await server.start()
    await client.start()
    try:
        yield server, client
    finally:
        await client.close()
        await server.close()


@with_pair
async def test_request_gets_the_signed_answer_of_the_handler(pair: tuple[DataPlane, DataPlane]) -> None:
    server, client = pair
    reply = await client.request(
        server.address, ChunkHave(DIGEST, (5, 2)), timeout=5, expect_peer=server.identity.peer_id
    )
    assert reply == ChunkHave(DIGEST, (2,))


@asynctest
async def test_handler_sees_the_signer_as_sender() -> None:
    seen: list[str] = []
    server = DataPlane(NodeIdentity.from_seed(b"s" * 32))
    client_id = NodeIdentity.from_seed(b"c" * 32)
    client = DataPlane(client_id)

    async def record(sender: str, envelope: Envelope, message: Message) -> None:
        seen.append(sender)

    server.register(Kind.HEARTBEAT, record)
    await server.start()
    try:
        assert await client.request(server.address, Heartbeat(1, "m", 2), timeout=5) is None
    finally:
        await client.close()
        await server.close()
    assert seen == [client_id.peer_id]


@with_pair
async def test_presigned_envelope_is_sent_as_is(pair: tuple[DataPlane, DataPlane]) -> None:
    server, client = pair
    env = seal(client.identity, Heartbeat(3, "m", 4), to_ms(time.time()))
    assert await client.request(server.address, None, envelope=env, timeout=5) is None


@with_pair
async def test_refusal_raises_peer_refused_with_the_reason(pair: tuple[DataPlane, DataPlane]) -> None:
    server, client = pair
    with pytest.raises(PeerRefused) as info:
        await client.request(server.address, ChunkRequest(DIGEST, 9, 0, 10), timeout=5)
    assert info.value.reason == "busy" and info.value.detail == "slots full"


@with_pair
async def test_unknown_kind_is_refused(pair: tuple[DataPlane, DataPlane]) -> None:
    server, client = pair
    with pytest.raises(PeerRefused) as info:
        await client.request(server.address, ChunkData(DIGEST, 1, 0, b"x"), timeout=5)
    assert info.value.reason == "unknown_kind"


@with_pair
async def test_handler_failure_is_an_error_answer_and_the_server_keeps_serving(
    pair: tuple[DataPlane, DataPlane],
) -> None:
    server, client = pair
    with pytest.raises(RemoteError, match="handler failed"):
        await client.request(server.address, ChunkRequest(DIGEST, 8, 0, 10), timeout=5)
    reply = await client.request(server.address, ChunkRequest(DIGEST, 1, 0, 10), timeout=5)
    assert isinstance(reply, ChunkData) and reply.data == b"x" * 10
    assert server.stats.handler_failures == 1


@with_pair
async def test_request_times_out(pair: tuple[DataPlane, DataPlane]) -> None:
    server, client = pair
    with pytest.raises(RequestTimeout):
        await client.request(server.address, ChunkRequest(DIGEST, 7, 0, 10), timeout=0.2)
    # The next request still works (the timed-out connection was dropped, not reused).
    assert isinstance(
        await client.request(server.address, ChunkRequest(DIGEST, 1, 0, 3), timeout=5), ChunkData
    )


@asynctest
async def test_unreachable_address_is_a_clear_error() -> None:
    client = DataPlane(NodeIdentity.from_seed(b"c" * 32))
    with pytest.raises(PeerUnreachable):
        await client.request("127.0.0.1:1", Heartbeat(1, "m", 1), timeout=2)
    with pytest.raises(PeerUnreachable, match="host:port"):
        await client.request("nonsense", Heartbeat(1, "m", 1), timeout=2)


@with_pair
async def test_answer_from_an_unexpected_peer_is_rejected(pair: tuple[DataPlane, DataPlane]) -> None:
    server, client = pair
    with pytest.raises(BadResponse, match="expected"):
        await client.request(server.address, ChunkHave(DIGEST, (1,)), timeout=5, expect_peer="someone-else")


async def _raw_exchange(address: str, payload: bytes) -> tuple[str, bytes | None]:
    host, port = address.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        await write_message(writer, payload)
        try:
            return "answer", await asyncio.wait_for(read_message(reader, limits.MAX_ENVELOPE_BYTES), 5)
        except Exception as e:  # noqa: BLE001 - the test inspects what came back
            return type(e).__name__, None
    finally:
        writer.close()


@with_pair
async def test_bad_frames_and_envelopes_never_kill_the_server(pair: tuple[DataPlane, DataPlane]) -> None:
    server, client = pair
    ident = client.identity
    good = seal_payload(ident, Kind.CHUNK_HAVE, b"", to_ms(time.time()))
    forged = Envelope(good.version, good.kind, good.sender_key, good.sent_at_ms, b"\x0a\x01x", good.signature)
    outcomes = [
        await _raw_exchange(server.address, b"garbage"),
        await _raw_exchange(server.address, encode_envelope(forged)),
    ]
    assert [o[0] for o in outcomes] == ["RemoteRefused", "RemoteRefused"]
    # An oversize frame header and a truncated stream.
    host, port = server.address.split(":")
    _, writer = await asyncio.open_connection(host, int(port))
    writer.write(struct.pack(">BI", 0, 2**31))
    await writer.drain()
    writer.close()
    _, writer = await asyncio.open_connection(host, int(port))
    writer.write(struct.pack(">BI", 0, 100) + b"short")
    writer.close()
    assert server.stats.bad_requests >= 2
    reply = await client.request(server.address, ChunkHave(DIGEST, (3,)), timeout=5)
    assert reply == ChunkHave(DIGEST, (3,))


@asynctest
async def test_upload_rate_caps_bytes_per_second() -> None:
    rate = 2_000_000.0
    server = DataPlane(NodeIdentity.from_seed(b"s" * 32), upload_rate=rate)
    client = DataPlane(NodeIdentity.from_seed(b"c" * 32))

    async def chunk(sender: str, envelope: Envelope, message: Message) -> Message:
        assert isinstance(message, ChunkRequest)
        return ChunkData(message.manifest_digest, message.chunk_index, message.offset, b"z" * message.length)

    server.register(Kind.CHUNK_REQUEST, chunk)
    await server.start()
    try:
        t0 = time.monotonic()
        slices = [
            client.request(server.address, ChunkRequest(DIGEST, i, 0, 500_000), timeout=30) for i in range(4)
        ]
        replies = await asyncio.gather(*slices)
        elapsed = time.monotonic() - t0
    finally:
        await client.close()
        await server.close()
    assert all(isinstance(r, ChunkData) and len(r.data) == 500_000 for r in replies)
    # 2 MB at 2 MB/s with a 128 KiB burst: the bucket cannot have let it through much faster.
    assert elapsed >= (2_000_000 - 2 * 64 * 1024) / rate * 0.9


@asynctest
async def test_reply_after_callback_runs_once_the_answer_is_written() -> None:
    server = DataPlane(NodeIdentity.from_seed(b"s" * 32))
    client = DataPlane(NodeIdentity.from_seed(b"c" * 32))
    done: list[bool] = []

    async def chunk(sender: str, envelope: Envelope, message: Message) -> Reply:
        assert isinstance(message, ChunkRequest)
        return Reply(ChunkData(DIGEST, 0, 0, b"abc"), done.append)

    server.register(Kind.CHUNK_REQUEST, chunk)
    await server.start()
    try:
        reply = await client.request(server.address, ChunkRequest(DIGEST, 0, 0, 3), timeout=5)
    finally:
        await client.close()
        await server.close()
    assert isinstance(reply, ChunkData) and done == [True]


def test_chunk_have_and_refusal_decode_with_limits() -> None:
    ident = NodeIdentity.from_seed(b"c" * 32)
    env = seal(ident, ChunkHave(DIGEST, (0, 3)), 1)
    assert decode_payload(env.kind, env.payload) == ChunkHave(DIGEST, (0, 3))
    with pytest.raises(ValueError, match="duplicates"):
        seal(ident, ChunkHave(DIGEST, (1, 1)), 1)
    with pytest.raises(ValueError):
        seal(ident, ChunkHave(DIGEST, (limits.MAX_CHUNKS,)), 1)


@asynctest
async def test_a_kind_taken_from_chosen_senders_refuses_others_before_verifying_or_parsing() -> None:
    """A learner takes rollout batches from its active workers only: a stranger's request is a bad
    request on the id its envelope claims, so neither its signature nor its payload costs us CPU."""
    server = DataPlane(NodeIdentity.from_seed(b"s" * 32))
    friend, stranger = NodeIdentity.from_seed(b"f" * 32), NodeIdentity.from_seed(b"x" * 32)
    seen: list[str] = []
    parsed: list[Kind] = []

    async def record(sender: str, envelope: Envelope, message: Message) -> None:
        seen.append(sender)

    server.register(Kind.HEARTBEAT, record, senders=lambda peer: peer == friend.peer_id)
    await server.start()
    real = decode_payload

    def counting(kind: Kind, payload: bytes) -> object:
        parsed.append(kind)
        return real(kind, payload)

    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("swarmnode.net.dataplane.decode_payload", counting)
            for who in (stranger, friend):
                client = DataPlane(who)
                await client.start()
                try:
                    if who is stranger:
                        with pytest.raises(RemoteError, match="not_allowed"):
                            await client.request(server.address, Heartbeat(1, "m", 2), timeout=5)
                        sealed = seal(friend, Heartbeat(1, "m", 2), to_ms(time.time()))
                        forged = replace(sealed, signature=b"\0" * 64)  # claims the friend's id
                        with pytest.raises(RemoteError, match="signature does not verify"):
                            await client.request(server.address, None, envelope=forged, timeout=5)
                    else:
                        assert await client.request(server.address, Heartbeat(1, "m", 2), timeout=5) is None
                finally:
                    await client.close()
    finally:
        await server.close()
    assert seen == [friend.peer_id]
    assert parsed == [Kind.HEARTBEAT]  # the friend's payload only
    assert server.stats.bad_requests == 2
