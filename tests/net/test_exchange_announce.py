"""GossipDriver announcements over real hivemind peers on 127.0.0.1: what a peer can read.

The driver, not the sans-IO core, makes an ``Announce`` stick: hivemind keeps a subkey's
record only when a new one expires strictly later, and a lost store is never re-announced by
the core. Both rules (``swarmnode.gossip.records``, specified in tests/gossip/test_records.py)
are checked here from the reading peer's side, through the driver.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from swarmnode.admit import AdmissionConfig, AdmissionPipeline
from swarmnode.gossip.core import GossipConfig, GossipCore
from swarmnode.gossip.driver import GossipDriver, announcement_key
from swarmnode.gossip.intake import ExternalPool, envelope_digest
from swarmnode.identity import NodeIdentity
from swarmnode.net.hivemind_runtime import DhtTimeout, HivemindRuntime
from swarmnode.ops.metrics import Metrics
from swarmnode.wire import Announce, Heartbeat, Kind, decode_payload, encode_envelope, seal, to_ms

from .support import Trio

pytestmark = pytest.mark.network

T = 20.0  # per-call timeout: generous, the box has 2 shared cores
DEADLINE = 60.0


def unusable(*_: Any) -> Any:
    raise AssertionError("nothing is admitted in these tests")


def make_driver(runtime: HivemindRuntime, swarm: str) -> GossipDriver:
    # One long round that began a moment ago: every publication of a test lands in round 0.
    core = GossipCore(
        GossipConfig(round_seconds=3600.0, epoch=time.time() - 10.0, announce_delay=0.0),
        runtime.peer_id,
        digest_of=envelope_digest,
    )
    admission = AdmissionPipeline(AdmissionConfig(allowed_tasks=frozenset()), now=time.time())
    return GossipDriver(core, runtime, admission, ExternalPool(), unusable, Metrics(), swarm=swarm)


def envelope(index: int) -> bytes:
    message = Heartbeat(round=index, model_id="test", policy_version=index)
    return encode_envelope(seal(NodeIdentity.generate(), message, to_ms(time.time())))


async def announced(reader: HivemindRuntime, swarm: str) -> set[bytes]:
    digests: set[bytes] = set()
    for record in await reader.dht_get(announcement_key(swarm, 0), timeout=T, latest=True):
        message = decode_payload(Kind.ANNOUNCE, record.value)
        assert isinstance(message, Announce)
        digests.update(message.rollout_digests)
    return digests


async def wait_until_announced(reader: HivemindRuntime, swarm: str, expected: set[bytes]) -> None:
    deadline = time.monotonic() + DEADLINE
    while (seen := await announced(reader, swarm)) != expected:
        assert time.monotonic() < deadline, f"announced {len(seen)} of {len(expected)} digests"
        await asyncio.sleep(0.1)


def test_an_item_published_after_the_first_in_a_round_replaces_the_announcement(trio: Trio) -> None:
    async def scenario() -> None:
        driver = make_driver(trio.a, "reannounce")
        job = asyncio.create_task(driver.run())
        try:
            first = driver.publish(envelope(1))
            await wait_until_announced(trio.b, "reannounce", {first})
            second = driver.publish(envelope(2))  # same round, same part: the record must grow
            await wait_until_announced(trio.b, "reannounce", {first, second})
        finally:
            job.cancel()
            await asyncio.wait([job])

    trio.run(scenario())


def test_an_announcement_whose_store_failed_is_stored_again(
    trio: Trio, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = trio.a.dht_store
    failures: list[str] = []

    async def failing_once(*args: Any, **kwargs: Any) -> bool:
        if not failures:
            failures.append(args[0])
            raise DhtTimeout("simulated: no replica answered in time")
        return await store(*args, **kwargs)

    monkeypatch.setattr(trio.a, "dht_store", failing_once)

    async def scenario() -> None:
        driver = make_driver(trio.a, "retry")
        job = asyncio.create_task(driver.run())
        try:
            digest = driver.publish(envelope(1))
            await wait_until_announced(trio.b, "retry", {digest})
        finally:
            job.cancel()
            await asyncio.wait([job])
        assert failures == [announcement_key("retry", 0)]

    trio.run(scenario())


def test_a_relayed_id_is_stored_in_a_relay_part_that_readers_see_as_relayed(trio: Trio) -> None:
    # SPEC 1.4, Relaying: relayed ids go to subkeys part1000+, which the DHT record rules accept
    # and a reading driver flags, so a reader with a demand never takes them as the relay's offers.
    from swarmnode.gossip.core import AdmissionResult, Announced, Pull, PullSucceeded, ReadAnnouncements
    from swarmnode.gossip.driver import is_relay_part

    async def scenario() -> None:
        relay = make_driver(trio.a, "relay")
        # A round that ends in a few seconds: relay parts are written when their round ends.
        relay.core = GossipCore(
            GossipConfig(round_seconds=3600.0, epoch=time.time() - 3595.0, read_interval=0.5, relay=True),
            trio.a.peer_id,
            selection_key=b"test",
        )
        job = asyncio.create_task(relay.run())
        try:
            data = envelope(1)
            digest = envelope_digest(data)
            assert digest is not None
            now = time.time()
            core = relay.core  # the pull and the admission stand in for the driver's own
            r = core.current_round(now)
            [pull] = [a for a in core.handle(Announced("author", r, (digest,)), now) if isinstance(a, Pull)]
            core.handle(PullSucceeded(pull.request_id, "author", ((digest, data),)), now)
            core.handle(AdmissionResult("author", digest, True, "ok", sent_at=now), now)
            assert core.stats.relayed == 1
            relay._wake.set()  # the loop's next deadline is the relay part's write
            deadline = time.monotonic() + DEADLINE
            while True:
                records = await trio.b.dht_get(announcement_key("relay", r), timeout=T, latest=True)
                parts = {r.subkey: decode_payload(Kind.ANNOUNCE, r.value) for r in records}
                if parts:
                    break
                assert time.monotonic() < deadline, "the relay part was never stored"
                await asyncio.sleep(0.1)
            assert list(parts) == [b"part1000"] and is_relay_part(b"part1000")
            message = parts[b"part1000"]
            assert isinstance(message, Announce) and message.rollout_digests == (digest,)
            reader = make_driver(trio.b, "relay")
            await reader._read(ReadAnnouncements((r,)))
            assert reader._pending == [Announced(trio.a.peer_id, r, (digest,), None, relayed=True)]
        finally:
            job.cancel()
            await asyncio.wait([job])

    trio.run(scenario())
