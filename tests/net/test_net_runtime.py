"""HivemindRuntime rules, with real p2pd peers on 127.0.0.1.

Most tests share one module-scoped swarm (``trio``: a bootstrap-like peer and two
nodes) to keep the suite short; each uses its own DHT keys and handler names.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import os
import socket
import struct
from pathlib import Path
from typing import Any

import pytest
from hivemind.dht.routing import DHTID

from swarmnode.errors import ConfigError
from swarmnode.net.errors import CallFailure, NetError, PeerCallError
from swarmnode.net.hivemind_runtime import HivemindRuntime, RequestRefused
from swarmnode.net.libp2p_identity import load_or_create_identity
from swarmnode.net.records import DEFAULT_MAX_VALUE_BYTES

from .support import Swarm, Trio, alive, loopback_config, run

pytestmark = pytest.mark.network

T = 20.0  # per-call timeout: generous, the box has 2 shared cores


async def echo_reversed(peer: str, request: bytes) -> bytes:
    return request[::-1]


# ---------------------------------------------------------------- discovery and DHT records


def test_nodes_find_each_other_through_a_bootstrap_and_read_each_others_records(tmp_path: Path) -> None:
    async def scenario() -> None:
        swarm = Swarm(tmp_path)  # fresh peers: a and b must never have met before
        try:
            boot = await swarm.add("boot")
            a = await swarm.add("a", boot.visible_maddrs)
            b = await swarm.add("b", boot.visible_maddrs)
            await a.add_stream_handler("echo", echo_reversed, max_request_bytes=1024)

            expires = a.dht_time() + 60
            assert await a.dht_store("round:1", b"announce", b"from a", expires, timeout=T)
            records = await b.dht_get("round:1", timeout=T, latest=True)
            assert [(r.owner, r.subkey, r.value) for r in records] == [(a.peer_id, b"announce", b"from a")]

            # b never dialled a: it learns a's address through the bootstrap and reaches it by peer id.
            assert await b.call_stream(records[0].owner, "echo", b"ping", timeout=T) == b"gnip"
        finally:
            await swarm.close()

    run(scenario())


def test_each_peer_has_its_own_subkeys_under_one_key(trio: Trio) -> None:
    async def scenario() -> None:
        a, b = trio.a, trio.b
        expires = a.dht_time() + 60
        assert await a.dht_store("own-subkeys", b"x", b"a's", expires, timeout=T)
        assert await b.dht_store("own-subkeys", b"x", b"b's", expires, timeout=T)
        records = await trio.boot.dht_get("own-subkeys", timeout=T, latest=True)
        assert {(r.owner, r.subkey, r.value) for r in records} == {
            (a.peer_id, b"x", b"a's"),
            (b.peer_id, b"x", b"b's"),
        }

    trio.run(scenario())


def test_a_peer_cannot_overwrite_another_peers_record(trio: Trio) -> None:
    async def scenario() -> None:
        a, mallory, boot = trio.a, trio.b, trio.boot
        expires = a.dht_time() + 60
        assert await a.dht_store("overwrite", b"slot", b"honest", expires, timeout=T)
        a_subkey = a.owner_marker + b"slot"

        # 1. Through hivemind's own API (unsigned: the marker is not mallory's key), expiring later.
        dht = mallory._dht
        assert dht is not None
        assert not await dht.store("overwrite", b"forged", expires + 30, subkey=a_subkey)

        # 2. Straight to the bootstrap's store RPC, skipping mallory's own validators, with a
        #    made-up signature in a's owner slot.
        forged = dht.protocol.serializer.dumps(b"forged") + b"[signature:" + b"A" * 344 + b"]"
        answer = await dht.protocol.call_store(
            boot._p2p.peer_id,  # type: ignore[union-attr]
            keys=[DHTID.generate(source="overwrite")],
            values=[forged],
            expiration_time=[expires + 30],
            subkeys=[a_subkey],
        )
        assert answer == [False]

        for reader in (a, boot, mallory):
            records = await reader.dht_get("overwrite", timeout=T, latest=True)
            assert [(r.owner, r.value) for r in records] == [(a.peer_id, b"honest")]

    trio.run(scenario())


def test_records_without_an_owner_are_refused_by_every_peer(trio: Trio) -> None:
    async def scenario() -> None:
        dht = trio.b._dht
        assert dht is not None
        expires = trio.b.dht_time() + 60
        assert not await dht.store("anonymous", b"value", expires, subkey=b"no-owner")
        assert not await dht.store("anonymous-plain", b"value", expires)
        assert await trio.a.dht_get("anonymous", timeout=T, latest=True) == []

    trio.run(scenario())


def test_a_newer_record_replaces_the_owners_older_one_and_expired_records_vanish(trio: Trio) -> None:
    async def scenario() -> None:
        a, b = trio.a, trio.b
        now = a.dht_time()
        assert await a.dht_store("newer", b"s", b"v1", now + 60, timeout=T)
        assert await a.dht_store("newer", b"s", b"v2", now + 61, timeout=T)
        assert not await a.dht_store("newer", b"s", b"old", now + 59, timeout=T)  # a replay of an older one
        assert [r.value for r in await b.dht_get("newer", timeout=T, latest=True)] == [b"v2"]
        assert await a.dht_store("short-lived", b"s", b"v", now + 1.0, timeout=T)
        await asyncio.sleep(1.5)
        assert await b.dht_get("short-lived", timeout=T, latest=True) == []

    trio.run(scenario())


def test_store_refuses_values_over_the_record_limit_before_sending(trio: Trio) -> None:
    async def scenario() -> None:
        a = trio.a
        expires = a.dht_time() + 60
        with pytest.raises(ValueError, match="exceeds"):
            await a.dht_store("limit", b"s", b"x" * (DEFAULT_MAX_VALUE_BYTES + 1), expires, timeout=T)
        with pytest.raises(ValueError, match="signature"):
            await a.dht_store("limit", b"s", b"[signature:x]", expires, timeout=T)
        assert await a.dht_store("limit", b"s", b"x" * DEFAULT_MAX_VALUE_BYTES, expires, timeout=T)

    trio.run(scenario())


# ---------------------------------------------------------------- streams


def test_stream_carries_megabytes_intact_in_both_directions(trio: Trio) -> None:
    async def scenario() -> None:
        a, b = trio.a, trio.b
        request = os.urandom(3 * 1024 * 1024 + 17)  # not a multiple of the chunk size

        async def digest_and_echo(peer: str, data: bytes) -> bytes:
            assert peer == b.peer_id
            return hashlib.sha256(data).digest() + data

        await a.add_stream_handler("blob", digest_and_echo, max_request_bytes=8 * 1024 * 1024)
        response = await b.call_stream(a.peer_id, "blob", request, timeout=60)
        assert response[:32] == hashlib.sha256(request).digest()
        assert response[32:] == request

    trio.run(scenario())


def test_stream_request_over_the_handlers_limit_is_refused_as_too_large_and_never_handled(trio: Trio) -> None:
    async def scenario() -> None:
        a, b = trio.a, trio.b
        handled: list[int] = []

        async def record(peer: str, data: bytes) -> bytes:
            handled.append(len(data))
            return b"ok"

        await a.add_stream_handler("small", record, max_request_bytes=64 * 1024)
        for _ in range(3):  # the refusal must arrive every time, not a "connection reset"
            with pytest.raises(PeerCallError) as caught:
                await b.call_stream(a.peer_id, "small", b"x" * (2 * 1024 * 1024), timeout=T)
            assert caught.value.reason is CallFailure.TOO_LARGE
        assert handled == []
        # The handler still serves requests within the limit.
        assert await b.call_stream(a.peer_id, "small", b"y" * 1000, timeout=T) == b"ok"
        assert handled == [1000]

    trio.run(scenario())


def test_stream_response_over_the_callers_limit_raises_too_large(trio: Trio) -> None:
    async def scenario() -> None:
        a, b = trio.a, trio.b

        async def big(peer: str, data: bytes) -> bytes:
            return b"z" * (1024 * 1024)

        await a.add_stream_handler("big", big, max_request_bytes=16)
        with pytest.raises(PeerCallError) as caught:
            await b.call_stream(a.peer_id, "big", b"", timeout=T, max_response_bytes=300 * 1024)
        assert caught.value.reason is CallFailure.TOO_LARGE
        # What had arrived before the frame over the limit: the puller spends it from its
        # download budget (GossipConfig.unproven_download_rate); before, only a timeout said.
        assert 0 < caught.value.received <= 300 * 1024

    trio.run(scenario())


def test_handler_refusals_and_failures_reach_the_caller_as_remote_errors(
    trio: Trio, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        a, b = trio.a, trio.b

        async def refuse(peer: str, data: bytes) -> bytes:
            raise RequestRefused("rate limited")

        async def broken(peer: str, data: bytes) -> bytes:
            raise KeyError("internal detail")

        await a.add_stream_handler("refuse", refuse, max_request_bytes=16)
        await a.add_stream_handler("broken", broken, max_request_bytes=16)
        with pytest.raises(PeerCallError, match="refused: rate limited") as caught:
            await b.call_stream(a.peer_id, "refuse", b"", timeout=T)
        assert caught.value.reason is CallFailure.REMOTE_ERROR
        with pytest.raises(PeerCallError) as caught:
            await b.call_stream(a.peer_id, "broken", b"", timeout=T)
        assert caught.value.reason is CallFailure.REMOTE_ERROR
        assert "internal detail" not in str(caught.value)  # never show peers our internals

    with caplog.at_level(logging.ERROR, logger="swarmnode.net.hivemind_runtime"):
        trio.run(scenario())
    assert "internal detail" in caplog.text  # ... but log them here, with the traceback


def test_calls_to_a_slow_handler_time_out_and_unknown_handlers_fail_fast(trio: Trio) -> None:
    async def scenario() -> None:
        a, b = trio.a, trio.b

        async def slow(peer: str, data: bytes) -> bytes:
            await asyncio.sleep(30)
            return b""

        await a.add_stream_handler("slow", slow, max_request_bytes=16)
        with pytest.raises(PeerCallError) as caught:
            await b.call_stream(a.peer_id, "slow", b"", timeout=1.0)
        assert caught.value.reason is CallFailure.TIMEOUT
        with pytest.raises(PeerCallError) as caught:
            await b.call_stream(a.peer_id, "nobody-serves-this", b"", timeout=T)
        assert caught.value.reason in (CallFailure.UNREACHABLE, CallFailure.REMOTE_ERROR)

    trio.run(scenario())


def test_a_peer_that_breaks_the_framing_fails_the_call_without_flooding_the_caller(trio: Trio) -> None:
    async def scenario() -> None:
        a, b = trio.a, trio.b
        assert a._p2p is not None

        def raw_handler(reply: bytes) -> Any:
            async def handle(info: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                await reader.readexactly(5)  # the caller's empty request: one END frame
                writer.write(reply)
                await writer.drain()
                writer.close()

            return handle

        # Bypass the runtime's framing: a malicious peer answers with whatever it likes.
        await a._p2p.add_binary_stream_handler("swarmnode.stream.garbage", raw_handler(b"\x09garbage"))
        huge = struct.pack(">BI", 0, 200 * 1024) + b"x" * 1000  # announces 200 KiB
        await a._p2p.add_binary_stream_handler("swarmnode.stream.huge", raw_handler(huge))
        cut = struct.pack(">BI", 0, 100) + b"x" * 10  # a DATA frame of 100 bytes, 10 sent, then the end
        await a._p2p.add_binary_stream_handler("swarmnode.stream.cut", raw_handler(cut))
        with pytest.raises(PeerCallError) as caught:
            await b.call_stream(a.peer_id, "garbage", b"", timeout=T)
        assert caught.value.reason is CallFailure.PROTOCOL
        # An answer whose stream ends inside it is CLOSED, not PROTOCOL: a lost connection ends an
        # honest answer so too, and the caller cannot tell the two apart.
        with pytest.raises(PeerCallError) as caught:
            await b.call_stream(a.peer_id, "cut", b"", timeout=T)
        assert caught.value.reason is CallFailure.CLOSED
        assert caught.value.received == 10
        with pytest.raises(PeerCallError) as caught:
            await b.call_stream(a.peer_id, "huge", b"", timeout=T, max_response_bytes=100 * 1024)
        assert caught.value.reason is CallFailure.TOO_LARGE

    trio.run(scenario())


def test_a_handler_at_its_concurrency_limit_turns_new_callers_away_as_busy(trio: Trio) -> None:
    async def scenario() -> None:
        a, b = trio.a, trio.b
        entered, release = asyncio.Event(), asyncio.Event()

        async def hold(peer: str, data: bytes) -> bytes:
            entered.set()
            await release.wait()
            return b"done"

        await a.add_stream_handler("one-at-a-time", hold, max_request_bytes=16, max_concurrent=1)
        first = asyncio.create_task(b.call_stream(a.peer_id, "one-at-a-time", b"", timeout=T))
        await asyncio.wait_for(entered.wait(), T)
        with pytest.raises(PeerCallError, match="busy") as caught:
            await b.call_stream(a.peer_id, "one-at-a-time", b"", timeout=T)
        assert caught.value.reason is CallFailure.REMOTE_ERROR
        release.set()
        assert await first == b"done"

    trio.run(scenario())


# ---------------------------------------------------------------- start, identity, rejoin


def test_identity_is_persistent_and_single_use(tmp_path: Path) -> None:
    async def scenario() -> None:
        config = loopback_config(tmp_path, "node")
        first = await HivemindRuntime.create(config)
        try:
            with pytest.raises(NetError, match="in use by another process"):
                await HivemindRuntime.create(config)
            peer_id = first.peer_id
        finally:
            await first.stop()
        async with await HivemindRuntime.create(config) as again:
            assert again.peer_id == peer_id
            assert all(m.endswith("/p2p/" + peer_id) for m in again.visible_maddrs)

    run(scenario())


def test_start_fails_clearly_when_no_initial_peer_answers_and_leaves_no_p2pd() -> None:
    async def scenario() -> None:
        absent = "/ip4/127.0.0.1/tcp/9/p2p/QmXoypizjW3WknFiJnKLwHCnL72vedxjQkDDP1mXWo6uco"
        runtime = HivemindRuntime()
        with pytest.raises(NetError, match="none of the initial peers answered"):
            await runtime.start(loopback_config(None, "x", [absent], startup_timeout=15.0))
        assert runtime.p2pd_pid is None or not alive(runtime.p2pd_pid)
        with pytest.raises(NetError):
            runtime.visible_maddrs  # noqa: B018

    run(scenario())


def test_bad_addresses_are_config_errors_naming_the_setting() -> None:
    async def scenario() -> None:
        with pytest.raises(ConfigError, match="announce_maddrs"):
            await HivemindRuntime().start(
                loopback_config(None, "x", announce_maddrs=("/ip4/127.0.0.1/tcp/0",))
            )
        with pytest.raises(ConfigError, match="lacks /p2p/"):
            await HivemindRuntime().start(loopback_config(None, "x", ["/ip4/127.0.0.1/tcp/1234"]))

    run(scenario())


def test_a_node_started_before_its_bootstrap_joins_once_the_bootstrap_is_up(tmp_path: Path) -> None:
    async def scenario() -> None:
        port = _free_port()  # for the bootstrap-to-be
        boot_config = loopback_config(tmp_path, "boot")
        assert boot_config.identity_path is not None
        boot_id = load_or_create_identity(boot_config.identity_path).peer_id
        boot_maddr = f"/ip4/127.0.0.1/tcp/{port}/p2p/{boot_id}"
        swarm = Swarm(tmp_path)
        try:
            node = await swarm.add("node", [boot_maddr], ensure_bootstrap_success=False, rejoin_interval=0.5)
            assert node.dht_peer_count() == 0
            boot = await HivemindRuntime.create(
                dataclasses.replace(boot_config, host_maddrs=(f"/ip4/127.0.0.1/tcp/{port}",))
            )
            swarm.runtimes.insert(0, boot)
            async with asyncio.timeout(30):
                while boot.peer_id not in node.dht_peer_ids():
                    await asyncio.sleep(0.2)
        finally:
            await swarm.close()

    run(scenario())


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_peers_are_told_the_announced_addresses_only() -> None:
    async def scenario() -> None:
        announced, hidden = _free_port(), _free_port()
        config = loopback_config(
            None,
            "x",
            host_maddrs=(f"/ip4/127.0.0.1/tcp/{announced}", f"/ip4/127.0.0.1/tcp/{hidden}"),
            announce_maddrs=(f"/ip4/127.0.0.1/tcp/{announced}",),
        )
        async with await HivemindRuntime.create(config) as runtime:
            assert runtime.visible_maddrs == [f"/ip4/127.0.0.1/tcp/{announced}/p2p/{runtime.peer_id}"]

    run(scenario())


def test_a_client_mode_node_uses_the_dht_without_serving_it(trio: Trio) -> None:
    async def scenario() -> None:
        client = await HivemindRuntime.create(
            loopback_config(None, "client", trio.boot.visible_maddrs, client_mode=True)
        )
        try:
            assert await client.dht_store("from-client", b"s", b"v", client.dht_time() + 60, timeout=T)
            records = await trio.a.dht_get("from-client", timeout=T)
            assert [(r.owner, r.value) for r in records] == [(client.peer_id, b"v")]
            assert client.peer_id not in trio.boot.dht_peer_ids()  # nobody routes DHT requests to it
        finally:
            await client.stop()

    trio.run(scenario())
