"""Issue 19: data-plane connections cannot be hoarded (swarmnode/net/dataplane.py), on 127.0.0.1."""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from swarmnode.identity import NodeIdentity
from swarmnode.net.dataplane import DataPlane
from swarmnode.net.framing import RemoteRefused, read_message, write_message
from swarmnode.wire.envelope import Envelope, encode_envelope, seal, to_ms
from swarmnode.wire.kinds import Kind
from swarmnode.wire.messages import ChunkHave, Message

END = struct.pack(">BI", 1, 0)  # a bare END frame: an empty request
HAVE = ChunkHave(b"\x07" * 32, (1,))


def asynctest(fn: Callable[[], Awaitable[None]]) -> Callable[[], None]:
    def test() -> None:
        asyncio.run(asyncio.wait_for(fn(), 60))

    test.__name__ = fn.__name__
    return test


async def server() -> DataPlane:
    dp = DataPlane(NodeIdentity.from_seed(b"s" * 32))

    async def echo(sender: str, envelope: Envelope, message: Message) -> Message:
        return HAVE

    dp.register(Kind.CHUNK_HAVE, echo)
    await dp.start()
    return dp


async def hostile(dp: DataPlane, n: int) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """n connections without identity, each sending one empty request (a bare END frame)."""
    conns = []
    for _ in range(n):
        reader, writer = await asyncio.open_connection("127.0.0.1", dp.port)
        writer.write(END)
        conns.append((reader, writer))
    await asyncio.gather(*(w.drain() for _, w in conns), return_exceptions=True)
    return conns


async def honest_latency(dp: DataPlane) -> float:
    client = DataPlane(NodeIdentity.from_seed(b"c" * 32))
    try:
        t0 = time.perf_counter()
        answer = await client.request(dp.address, HAVE, timeout=5.0)
        assert answer == HAVE
        return time.perf_counter() - t0
    finally:
        await client.close()


async def until(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.02)
    return predicate()


@asynctest
async def test_an_honest_client_is_served_within_1_s_while_520_connections_of_its_address_are_held() -> None:
    dp = await server()
    try:
        conns = await hostile(dp, 520)
        assert await until(lambda: len(dp._conns) >= dp.max_per_address, 10)
        assert len(dp._conns) <= dp.max_per_address  # one address never holds more
        assert await honest_latency(dp) < 1.0
    finally:
        for _, w in conns:
            w.close()
        await dp.close()


@asynctest
async def test_a_full_server_evicts_a_hoarded_connection_for_a_newcomer() -> None:
    dp = await server()
    dp.max_per_address = 10_000  # hostile and honest from different addresses, as on the internet
    try:
        conns = await hostile(dp, 520)
        assert await until(lambda: len(dp._conns) >= dp.max_connections, 10)
        assert await honest_latency(dp) < 1.0
        assert dp.stats.connections_evicted >= 1
        assert len(dp._conns) <= dp.max_connections
    finally:
        for _, w in conns:
            w.close()
        await dp.close()


@asynctest
async def test_junk_requests_strike_a_connection_out_and_do_not_reset_its_timers() -> None:
    dp = await server()
    dp.handshake_timeout = 0.6
    try:
        # Three empty requests: each answered with an ERROR frame, then the connection closes.
        reader, writer = await asyncio.open_connection("127.0.0.1", dp.port)
        for _ in range(3):
            writer.write(END)
            try:
                await read_message(reader, 1 << 16)
                raise AssertionError("an empty request got a normal answer")
            except RemoteRefused:
                pass
        assert await reader.read(1) == b""  # closed by the server
        assert dp.stats.connections_struck_out == 1
        writer.close()
        # Junk every 0.2 s (under the strike limit) does not keep a connection past the handshake.
        reader, writer = await asyncio.open_connection("127.0.0.1", dp.port)
        t0 = time.monotonic()
        writer.write(END)
        await asyncio.sleep(0.3)
        writer.write(END)
        assert await asyncio.wait_for(reader.read(1 << 16), 5) != b""  # the two ERROR frames
        while await asyncio.wait_for(reader.read(1 << 16), 5):
            pass
        assert time.monotonic() - t0 < 2.0
        assert dp.stats.connections_timed_out >= 1
        writer.close()
    finally:
        await dp.close()


@asynctest
async def test_a_silent_connection_is_closed_at_the_handshake_deadline() -> None:
    dp = await server()
    dp.handshake_timeout = 0.3
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", dp.port)
        assert await asyncio.wait_for(reader.read(1), 5) == b""
        assert dp.stats.connections_timed_out == 1
        writer.close()
        assert await honest_latency(dp) < 1.0  # a valid client is unaffected
    finally:
        await dp.close()


@asynctest
async def test_one_identity_holds_at_most_max_per_identity_connections_the_newest_win() -> None:
    dp = await server()
    dp.max_per_identity = 2
    me = NodeIdentity.from_seed(b"m" * 32)
    try:
        conns = []
        for _ in range(3):
            reader, writer = await asyncio.open_connection("127.0.0.1", dp.port)
            conns.append((reader, writer))
            await write_message(writer, encode_envelope(seal(me, HAVE, to_ms(time.time()))))
            assert await read_message(reader, 1 << 20)  # each one answered
        # The third closed the idlest of the first two: the first, which now reads end of stream.
        assert await asyncio.wait_for(conns[0][0].read(), 5) == b""
        assert dp.stats.connections_evicted == 1
        assert sum(1 for c in dp._conns.values() if c.identity == me.peer_id) == 2
        for _, writer in conns:
            writer.close()
    finally:
        await dp.close()


@asynctest
async def test_replaying_a_peers_signed_envelope_on_many_connections_does_not_lock_it_out() -> None:
    """R8-2: anyone holding one of a worker's signed envelopes (its public PeerRecord) could send it
    as the first request of 16 connections and the worker was refused "busy" on its own."""
    dp = await server()
    worker = NodeIdentity.from_seed(b"w" * 32)
    replayed = encode_envelope(seal(worker, HAVE, to_ms(time.time())))
    squatters = []
    try:
        for _ in range(dp.max_per_identity):
            reader, writer = await asyncio.open_connection("127.0.0.1", dp.port)
            squatters.append((reader, writer))
            await write_message(writer, replayed)
            assert await read_message(reader, 1 << 20)
        client = DataPlane(worker)
        try:
            assert await client.request(dp.address, HAVE, timeout=5.0) == HAVE
        finally:
            await client.close()
        assert dp.stats.connections_evicted >= 1
    finally:
        for _, writer in squatters:
            writer.close()
        await dp.close()


def test_streams_trickled_by_a_few_identities_cannot_hold_every_fallback_slot(tmp_path: Path) -> None:
    """The hivemind-stream path (64 slots, 16 per peer in the data plane; 8 and 2 here): four
    identities opening streams that never finish their request used to hold every slot for the
    whole read timeout; now a newcomer evicts one of them and is served."""
    from swarmnode.net.hivemind_runtime import HivemindRuntime

    from .support import Swarm, run

    async def scenario() -> None:
        swarm = Swarm(tmp_path)
        try:
            server_rt = await swarm.add("server")
            peers = server_rt.visible_maddrs

            async def echo(remote: str, request: bytes) -> bytes:
                return request

            await server_rt.add_stream_handler("echo", echo, max_request_bytes=1 << 20, max_concurrent=8)
            attackers: list[HivemindRuntime] = [await swarm.add(f"a{i}", peers) for i in range(4)]
            honest = await swarm.add("honest", peers)
            held = []
            for attacker in attackers:
                for _ in range(2):
                    assert attacker._p2p is not None
                    _, _reader, writer = await attacker._p2p.call_binary_stream_handler(
                        server_rt._p2p.peer_id if server_rt._p2p else None, "swarmnode.stream.echo"
                    )
                    writer.write(struct.pack(">BI", 0, 10))  # a DATA frame header, then nothing
                    await writer.drain()
                    held.append(writer)
            assert await until(lambda: len(server_rt._serving) >= 8, 10)  # every slot is held
            t0 = time.perf_counter()
            answer = await honest.call_stream(server_rt.peer_id, "echo", b"hello", timeout=5.0)
            assert answer == b"hello"
            assert time.perf_counter() - t0 < 1.0
            assert server_rt.streams_evicted >= 1
            for writer in held:
                writer.close()
        finally:
            await swarm.close()

    run(scenario(), timeout=120)
