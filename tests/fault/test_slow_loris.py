"""A slow-loris peer cannot starve a stream handler: it may hold a quarter of the serving slots,
each only until its request is overdue; other peers are served meanwhile.

Before this rule one attacker opening 24 streams to the gossip pull handler (16 slots) and
feeding each a byte every 2 s held every slot for the whole exchange timeout: honest nodes
admitted nothing from each other for the attack's duration (tests/fault/test_adversarial.py,
bench/adversarial.py). Three real runtimes on 127.0.0.1; ~10 s.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from hivemind.p2p import P2PDaemonError, P2PHandlerError, PeerID

from swarmnode.net.errors import PeerCallError
from swarmnode.net.hivemind_runtime import REQUEST_GRACE
from tests.net.support import Swarm, run

pytestmark = pytest.mark.network

SLOTS = 8  # -> 2 per remote peer
T = 20.0


async def echo(peer: str, request: bytes) -> bytes:
    return request


def test_a_slow_loris_peer_holds_few_slots_briefly_and_others_are_still_served(tmp_path: Path) -> None:
    async def scenario() -> None:
        swarm = Swarm(tmp_path)
        try:
            server = await swarm.add("server")
            attacker = await swarm.add("attacker", server.visible_maddrs)
            honest = await swarm.add("honest", server.visible_maddrs)
            await server.add_stream_handler("pull", echo, max_request_bytes=64, max_concurrent=SLOTS)
            p2p = attacker._require_p2p()
            outcomes: list[str] = []

            async def trickle() -> None:
                # A frame header, one byte at a time, never completed.
                try:
                    _, reader, writer = await p2p.call_binary_stream_handler(
                        PeerID.from_base58(server.peer_id), "swarmnode.stream.pull"
                    )
                    started = time.monotonic()
                    for _ in range(30):
                        writer.write(b"\x00")
                        await writer.drain()
                        try:
                            answer = await asyncio.wait_for(reader.read(1), 1.0)
                        except TimeoutError:
                            continue
                        outcomes.append(
                            "closed" if not answer else f"answered {time.monotonic() - started:.0f}"
                        )
                        return
                    outcomes.append("held")
                except (OSError, P2PDaemonError, P2PHandlerError) as exc:
                    outcomes.append(f"error {exc!r}")

            slow = [asyncio.create_task(trickle()) for _ in range(SLOTS + 4)]
            await asyncio.sleep(1.0)
            # The honest peer is served at once, while the attacker's streams are open.
            began = time.monotonic()
            assert await honest.call_stream(server.peer_id, "pull", b"want", timeout=T) == b"want"
            assert time.monotonic() - began < REQUEST_GRACE
            # The attacker's own further requests are turned away while it holds its share.
            with pytest.raises(PeerCallError, match="busy"):
                await attacker.call_stream(server.peer_id, "pull", b"want", timeout=T)
            await asyncio.gather(*slow)
            # Every slow stream was answered (busy, or timed out once overdue), none held for good.
            assert "held" not in outcomes and len(outcomes) == len(slow), outcomes
        finally:
            await swarm.close()

    run(scenario())
