"""The bootstrap's page samples its figures beside the DHT peer; a failed sample never ends it."""

from __future__ import annotations

import asyncio
from typing import Any

from swarmnode.roles.bootstrap import BootstrapHistory


class FlakyRuntime:
    """The figures ``bootstrap_status`` reads, with p2pd's peer listing failing on the first call
    (the red team's case: one ``ConnectionResetError`` from ListPeers ended the bootstrap)."""

    peer_id = "QmBoot"
    visible_maddrs = ("/ip4/127.0.0.1/tcp/1/p2p/QmBoot",)
    uptime = 60.0

    def __init__(self) -> None:
        self.calls = 0

    async def connected_peers(self, timeout: float) -> list[Any]:
        self.calls += 1
        if self.calls == 1:
            raise ConnectionResetError("p2pd closed the stream")
        return ["a", "b"]

    def dht_peer_count(self) -> int:
        return 3

    def dht_storage_stats(self) -> dict[str, Any]:
        return {"storage": {"records": 5, "bytes": 10, "owners": 2, "evicted": 0, "refused": {}}}


def test_a_failed_sample_is_skipped_and_sampling_goes_on() -> None:
    history = BootstrapHistory(every=0.01)
    runtime = FlakyRuntime()

    async def main() -> None:
        task = asyncio.create_task(history.run(runtime))  # type: ignore[arg-type]
        while runtime.calls < 3:
            await asyncio.sleep(0.01)
        assert not task.done()  # the failure did not end it
        task.cancel()

    asyncio.run(main())
    assert len(history.peers) >= 1  # the later samples were kept
    chart = history.peers.chart("peers", "Peers")
    assert {s.name for s in chart.series} == {"DHT routing table", "open connections"}
