"""Real DataPlanes on 127.0.0.1: a publisher and receivers relaying verified chunks to each other."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import torch

from swarmnode.broadcast.core import BroadcastConfig
from swarmnode.broadcast.driver import BroadcastNode, blob_to_state_dict
from swarmnode.identity import NodeIdentity
from swarmnode.net.dataplane import DataPlane
from swarmnode.testing import spawn
from swarmnode.testing.corrupting import CorruptingNode  # the bench's attacker too: one definition
from swarmnode.wire.envelope import encode_envelope

REPO = Path(__file__).resolve().parents[2]
CFG = BroadcastConfig(request_timeout=5.0, failure_backoff=0.2, max_bad_chunks=2)


def run(coro: Awaitable[None], limit: float = 120) -> None:
    asyncio.run(asyncio.wait_for(coro, limit))  # type: ignore[arg-type]


async def make_nodes(
    n: int, rate: float | None, factory: Callable[[int], type[BroadcastNode]] = lambda i: BroadcastNode
) -> list[BroadcastNode]:
    nodes = []
    for i in range(n):
        ident = NodeIdentity.from_seed(hashlib.sha256(f"bcast {i}".encode()).digest())
        dp = DataPlane(ident, upload_rate=rate)
        node = factory(i)(ident, dp, CFG)
        await dp.start()
        await node.start()
        nodes.append(node)
    for a in nodes:
        for b in nodes:
            a.add_peer(b.me, b.dataplane.address)
    return nodes


async def close_all(nodes: list[BroadcastNode]) -> None:
    for node in nodes:
        await node.close()
        await node.dataplane.close()


def random_state_dict(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(256, 512, generator=g),
        "layer.0.bias": torch.randn(512, generator=g).to(torch.bfloat16),
        "step": torch.tensor(7, dtype=torch.int64),
    }


def test_state_dict_reaches_every_receiver_byte_identical() -> None:
    async def main() -> None:
        nodes = await make_nodes(5, rate=None)
        try:
            state = random_state_dict(1)
            pub = nodes[0].publish_state_dict(state, "tiny", 3, chunk_size=64 * 1024)
            blobs = await asyncio.gather(*(n.receive(pub.manifest_envelope, timeout=60) for n in nodes[1:]))
            for blob in blobs:
                got = blob_to_state_dict(blob, pub.manifest.body.tensors)
                assert set(got) == set(state)
                for name in state:
                    assert torch.equal(got[name], state[name]) and got[name].dtype == state[name].dtype
            # Receivers relayed: the publisher did not upload every chunk to every receiver.
            served = nodes[0].stats.chunks_served
            assert served < 4 * len(pub.manifest.body.chunk_hashes)
            assert sum(n.stats.chunks_served for n in nodes[1:]) > 0
        finally:
            await close_all(nodes)

    run(main())


def test_corrupting_relay_is_caught_blamed_and_the_version_still_completes() -> None:
    async def main() -> None:
        nodes = await make_nodes(5, rate=4e6, factory=lambda i: CorruptingNode if i == 1 else BroadcastNode)
        try:
            blob = os.urandom(1_500_000)
            from swarmnode.wire.messages import TensorEntry

            pub = nodes[0].publish_blob(
                blob, (TensorEntry("w", "U8", (len(blob),), 0, len(blob)),), "m", 1, 32 * 1024
            )
            got = await asyncio.gather(*(n.receive(pub.manifest_envelope, timeout=60) for n in nodes[1:]))
            for i, b in enumerate(got):
                assert b == blob, f"receiver {i + 1} differs"
            honest = nodes[2:]
            assert sum(n.stats.blames for n in honest) >= 1
            assert sum(n.stats.chunks_invalid for n in honest) <= 2 * len(honest)  # banned after 2
            assert any(n.core.is_banned(nodes[1].me) for n in honest)
        finally:
            await close_all(nodes)

    run(main())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_receiver_killed_mid_broadcast_does_not_stop_the_others(tmp_path: Path) -> None:
    """Three receivers in their own processes; one is SIGKILLed once it holds some chunks."""

    async def main() -> None:
        ident = NodeIdentity.from_seed(hashlib.sha256(b"publisher").digest())
        dp = DataPlane(ident, upload_rate=2e6)
        pub = BroadcastNode(ident, dp, CFG)
        await dp.start()
        await pub.start()
        blob = os.urandom(3_000_000)
        from swarmnode.wire.messages import TensorEntry

        published = pub.publish_blob(
            blob, (TensorEntry("w", "U8", (len(blob),), 0, len(blob)),), "m", 1, 64 * 1024
        )
        seeds = [hashlib.sha256(f"child {i}".encode()).digest() for i in range(3)]
        ports = [_free_port() for _ in seeds]
        peers = [[pub.me, dp.address]] + [
            [NodeIdentity.from_seed(s).peer_id, f"127.0.0.1:{p}"] for s, p in zip(seeds, ports, strict=True)
        ]
        for peer_id, address in peers[1:]:
            pub.add_peer(peer_id, address)
        (tmp_path / "peers.json").write_text(json.dumps(peers))
        (tmp_path / "manifest.bin").write_bytes(encode_envelope(published.manifest_envelope))
        procs = [
            spawn(
                f"receiver-{i}",
                [
                    "-m",
                    "tests.broadcast.peer_process",
                    s.hex(),
                    str(p),
                    str(tmp_path / "peers.json"),
                    str(tmp_path / "manifest.bin"),
                    str(tmp_path / f"out{i}"),
                    "2e6",
                ],
                tmp_path / f"receiver-{i}.log",
                cwd=REPO,
            )
            for i, (s, p) in enumerate(zip(seeds, ports, strict=True))
        ]
        try:
            victim = procs[0]
            deadline = time.monotonic() + 60
            # Kill the victim once the publisher has served it something: it is mid-transfer.
            while pub.stats.chunks_served < 6 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            victim.kill_group(signal.SIGKILL)
            victim.popen.wait(timeout=10)
            expected = hashlib.sha256(blob).hexdigest()
            while time.monotonic() < deadline:
                if all((tmp_path / f"out{i}").exists() for i in (1, 2)):
                    break
                await asyncio.sleep(0.1)
            assert not (tmp_path / "out0").exists()
            for i in (1, 2):
                assert (tmp_path / f"out{i}").read_text() == expected
        finally:
            for proc in procs:
                proc.stop(timeout=0, sig=signal.SIGKILL)  # relays run until killed
            await pub.close()
            await dp.close()

    run(main())
