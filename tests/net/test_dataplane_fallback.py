"""Specification of the data plane's hivemind-stream fallback (swarmnode/net/dataplane.py).

Two real HivemindRuntimes on 127.0.0.1, shared by the module (start-up is seconds per peer):
``server`` answers on TCP and on its runtime's streams, ``client`` asks over either path. A
request addressed ``"p2p:<libp2p id>"`` goes over hivemind; ``request_peer`` picks the path.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest

from swarmnode.identity import NodeIdentity
from swarmnode.net.dataplane import (
    FALLBACK_STREAM,
    AnswerTooLarge,
    BadResponse,
    DataPlane,
    PeerRefused,
    PeerUnreachable,
    RefuseRequest,
    RemoteError,
    RequestTimeout,
)
from swarmnode.net.errors import CallFailure, PeerCallError
from swarmnode.net.hivemind_runtime import HivemindRuntime
from swarmnode.wire import limits
from swarmnode.wire.envelope import Envelope
from swarmnode.wire.kinds import Kind
from swarmnode.wire.messages import ChunkData, ChunkHave, ChunkRequest, Heartbeat, Message

from .support import LoopThread, Swarm

pytestmark = pytest.mark.network

T = TypeVar("T")
DIGEST = b"\x07" * 32
TIMEOUT = 20.0  # generous per-call timeout: 2 shared cores
UPLOAD_RATE = 50e6  # the server's upload bucket: high enough never to slow these tests down


@dataclass
class Peers:
    loop: LoopThread
    server_runtime: HivemindRuntime
    server: DataPlane
    client: DataPlane
    senders: list[str] = field(default_factory=list)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run(coro, timeout=60)


@pytest.fixture(scope="module")
def peers() -> Iterator[Peers]:
    loop = LoopThread()
    swarm = Swarm(None)
    planes: list[DataPlane] = []
    senders: list[str] = []

    async def chunk(sender: str, envelope: Envelope, message: Message) -> Message:
        assert isinstance(message, ChunkRequest)
        senders.append(sender)
        if message.chunk_index == 9:
            raise RefuseRequest("busy", "slots full")
        if message.chunk_index == 8:
            raise RuntimeError("handler bug")
        if message.chunk_index == 7:
            await asyncio.sleep(10)
        if message.chunk_index == 6:  # an answer no envelope can carry
            return ChunkData(message.manifest_digest, 6, 0, b"x" * (limits.MAX_ENVELOPE_BYTES + 1))
        return ChunkData(message.manifest_digest, message.chunk_index, message.offset, b"x" * message.length)

    async def echo_have(sender: str, envelope: Envelope, message: Message) -> Message:
        assert isinstance(message, ChunkHave)
        senders.append(sender)
        return ChunkHave(message.manifest_digest, tuple(sorted(message.chunk_indices))[:1])

    async def heartbeat(sender: str, envelope: Envelope, message: Message) -> None:
        return None

    async def start() -> Peers:
        a = await swarm.add("server")
        b = await swarm.add("client", a.visible_maddrs)
        server = DataPlane(NodeIdentity.from_seed(b"s" * 32), upload_rate=UPLOAD_RATE)
        client = DataPlane(NodeIdentity.from_seed(b"c" * 32))
        planes.extend([client, server])
        server.register(Kind.CHUNK_REQUEST, chunk)
        server.register(Kind.CHUNK_HAVE, echo_have)
        server.register(Kind.HEARTBEAT, heartbeat)
        await server.start()
        await client.start()
        await server.attach_fallback(a)
        await client.attach_fallback(b)
        return Peers(loop, a, server, client, senders)

    async def stop() -> None:
        for plane in planes:
            await plane.close()
        await swarm.close()

    try:
        yield loop.run(start())
    finally:
        loop.run(stop())
        loop.close()


def dead_address() -> str:
    """A loopback port that was just free: connecting to it is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"127.0.0.1:{port}"


def test_a_p2p_address_reaches_the_handler_and_the_answer_is_signed_by_the_peer(peers: Peers) -> None:
    server, client = peers.server, peers.client

    async def scenario() -> None:
        served = server.stats.fallback_requests_served
        reply = await client.request(
            server.fallback_address,
            ChunkHave(DIGEST, (5, 2)),
            timeout=TIMEOUT,
            expect_peer=server.identity.peer_id,
        )
        assert reply == ChunkHave(DIGEST, (2,))
        assert server.stats.fallback_requests_served == served + 1
        # The handler sees the envelope's signer, as on TCP, not the libp2p id of the stream.
        assert peers.senders[-1] == client.identity.peer_id
        # Empty answers and answers signed by someone else behave as on TCP.
        assert await client.request(server.fallback_address, Heartbeat(1, "m", 2), timeout=TIMEOUT) is None
        with pytest.raises(BadResponse, match="expected"):
            await client.request(
                server.fallback_address, ChunkHave(DIGEST, (1,)), timeout=TIMEOUT, expect_peer="someone-else"
            )

    peers.run(scenario())


def test_request_peer_reaches_a_peer_whose_direct_address_is_dead_and_remembers_the_path(
    peers: Peers,
) -> None:
    server, client = peers.server, peers.client
    libp2p_id = peers.server_runtime.peer_id
    dead = dead_address()

    async def scenario() -> None:
        sent, over_p2p = client.stats.requests_sent, client.stats.fallback_requests_sent
        reply = await client.request_peer(
            [dead],
            libp2p_id,
            ChunkRequest(DIGEST, 1, 0, 10),
            timeout=TIMEOUT,
            expect_peer=server.identity.peer_id,
        )
        assert isinstance(reply, ChunkData) and reply.data == b"x" * 10
        # The direct dial was refused, then the same request went over hivemind.
        assert client.stats.requests_sent == sent + 2
        assert client.stats.fallback_requests_sent == over_p2p + 1
        # The dead address is remembered: the next request goes straight over hivemind.
        assert client.routes([dead], libp2p_id)[0] == server.fallback_address
        await client.request_peer([dead], libp2p_id, Heartbeat(1, "m", 1), timeout=TIMEOUT)
        assert client.stats.requests_sent == sent + 3
        assert client.stats.fallback_requests_sent == over_p2p + 2

    peers.run(scenario())


def test_request_peer_prefers_a_reachable_direct_address(peers: Peers) -> None:
    server, client = peers.server, peers.client
    libp2p_id = peers.server_runtime.peer_id

    async def scenario() -> None:
        over_p2p = client.stats.fallback_requests_sent
        reply = await client.request_peer(
            [server.address], libp2p_id, ChunkHave(DIGEST, (4,)), timeout=TIMEOUT
        )
        assert reply == ChunkHave(DIGEST, (4,))
        assert client.stats.fallback_requests_sent == over_p2p

    peers.run(scenario())


def test_a_refusal_and_a_handler_crash_travel_back_over_the_fallback(peers: Peers) -> None:
    server, client = peers.server, peers.client

    async def scenario() -> None:
        with pytest.raises(PeerRefused) as info:
            await client.request(server.fallback_address, ChunkRequest(DIGEST, 9, 0, 10), timeout=TIMEOUT)
        assert info.value.reason == "busy" and info.value.detail == "slots full"
        with pytest.raises(PeerRefused) as info:
            await client.request(server.fallback_address, ChunkData(DIGEST, 1, 0, b"x"), timeout=TIMEOUT)
        assert info.value.reason == "unknown_kind"
        failures = server.stats.handler_failures
        with pytest.raises(RemoteError, match="handler failed"):
            await client.request(server.fallback_address, ChunkRequest(DIGEST, 8, 0, 10), timeout=TIMEOUT)
        assert server.stats.handler_failures == failures + 1
        # The handler survives its crash.
        reply = await client.request(server.fallback_address, ChunkRequest(DIGEST, 2, 0, 3), timeout=TIMEOUT)
        assert isinstance(reply, ChunkData) and reply.data == b"xxx"

    peers.run(scenario())


def test_oversized_answers_are_refused(peers: Peers) -> None:
    server, client = peers.server, peers.client

    async def scenario() -> None:
        # Over the caller's limit: refused by the caller before it is buffered.
        with pytest.raises(AnswerTooLarge):
            await client.request(
                server.fallback_address,
                ChunkRequest(DIGEST, 3, 0, 5000),
                timeout=TIMEOUT,
                max_response_bytes=1000,
            )
        # Over the envelope limit: the server does not send it, and says why.
        with pytest.raises(RemoteError, match="not sendable"):
            await client.request(
                server.fallback_address,
                ChunkRequest(DIGEST, 6, 0, 1),
                timeout=TIMEOUT,
            )
        reply = await client.request(
            server.fallback_address, ChunkRequest(DIGEST, 3, 0, 5000), timeout=TIMEOUT
        )
        assert isinstance(reply, ChunkData) and len(reply.data) == 5000

    peers.run(scenario())


def test_bad_bytes_on_the_fallback_stream_never_kill_the_handler(peers: Peers) -> None:
    server, client = peers.server, peers.client
    runtime = client._fallback
    assert runtime is not None

    async def scenario() -> None:
        bad = server.stats.bad_requests
        with pytest.raises(PeerCallError) as info:
            await runtime.call_stream(
                peers.server_runtime.peer_id, FALLBACK_STREAM, b"garbage", timeout=TIMEOUT
            )
        assert info.value.reason is CallFailure.REMOTE_ERROR and "bad request" in info.value.detail
        assert server.stats.bad_requests == bad + 1
        reply = await client.request(server.fallback_address, ChunkHave(DIGEST, (3,)), timeout=TIMEOUT)
        assert reply == ChunkHave(DIGEST, (3,))

    peers.run(scenario())


def test_fallback_requests_time_out(peers: Peers) -> None:
    server, client = peers.server, peers.client

    async def scenario() -> None:
        with pytest.raises(RequestTimeout):
            await client.request(server.fallback_address, ChunkRequest(DIGEST, 7, 0, 10), timeout=1.0)

    peers.run(scenario())


def test_answers_over_the_fallback_take_tokens_from_the_upload_bucket(peers: Peers) -> None:
    server, client = peers.server, peers.client
    assert server.limiter is not None
    limiter = server.limiter

    async def scenario() -> None:
        before = limiter.bytes_paced
        reply = await client.request(
            server.fallback_address, ChunkRequest(DIGEST, 4, 0, 300_000), timeout=TIMEOUT
        )
        assert isinstance(reply, ChunkData) and len(reply.data) == 300_000
        assert limiter.bytes_paced - before > 300_000  # the whole signed answer was paid for

    peers.run(scenario())


def test_p2p_addresses_need_an_attached_fallback_and_a_valid_peer_id(peers: Peers) -> None:
    async def scenario() -> None:
        alone = DataPlane(NodeIdentity.from_seed(b"z" * 32))
        with pytest.raises(PeerUnreachable, match="attach_fallback"):
            await alone.request(peers.server.fallback_address, Heartbeat(1, "m", 1), timeout=TIMEOUT)
        # Without a fallback, request_peer has only the direct path to try.
        assert alone.routes(["127.0.0.1:1"], peers.server_runtime.peer_id) == ["127.0.0.1:1"]
        with pytest.raises(PeerUnreachable):
            await peers.client.request("p2p:not-a-peer-id", Heartbeat(1, "m", 1), timeout=TIMEOUT)
        with pytest.raises(PeerUnreachable, match="no address"):
            await peers.client.request_peer([], None, Heartbeat(1, "m", 1), timeout=TIMEOUT)

    peers.run(scenario())
