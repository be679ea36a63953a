"""A node warns once when a round's announcers outgrow small-swarm settings (README, "In a large swarm")."""

from __future__ import annotations

import asyncio
import logging
from typing import cast

import pytest

from swarmnode.admit import AdmissionConfig, AdmissionPipeline
from swarmnode.gossip import Announced, GossipConfig, GossipCore, ReadAnnouncements
from swarmnode.gossip.census import LARGE_SWARM_ANNOUNCERS, AnnouncerCensus
from swarmnode.gossip.driver import GossipDriver
from swarmnode.gossip.intake import ExternalPool
from swarmnode.net.hivemind_runtime import HivemindRuntime
from swarmnode.net.records import DhtRecord
from swarmnode.ops.metrics import Metrics
from swarmnode.wire import Announce as AnnounceMessage
from swarmnode.wire import encode_payload


def announced(peers: int, round_index: int = 7, first: int = 0) -> list[Announced]:
    return [Announced(f"peer{i}", round_index, (bytes([i % 256]) * 32,)) for i in range(first, first + peers)]


def test_the_census_warns_once_above_256_announcers_of_a_round_and_never_at_256() -> None:
    census = AnnouncerCensus(round_demand=0, announce_buckets=1)
    census.count(announced(LARGE_SWARM_ANNOUNCERS))
    census.count(announced(LARGE_SWARM_ANNOUNCERS, round_index=8))  # another round: counted apart
    census.count(announced(LARGE_SWARM_ANNOUNCERS - 6))  # the same peers again
    assert census.warning() is None
    census.count(announced(40, first=250))
    warning = census.warning()
    assert warning is not None and "290 distinct peers in round 7" in warning
    assert "swarm.round_demand = 0" in warning and "swarm.announce_buckets = 1" in warning
    assert "swarmnode config large-swarm" in warning
    census.count(announced(1000, round_index=9))
    assert census.warning() is None  # once per node run


@pytest.mark.parametrize(("demand", "buckets", "warns"), [(0, 157, True), (2, 1, True), (2, 157, False)])
def test_the_census_warns_with_either_small_swarm_setting(demand: int, buckets: int, warns: bool) -> None:
    census = AnnouncerCensus(round_demand=demand, announce_buckets=buckets)
    census.count(announced(LARGE_SWARM_ANNOUNCERS + 1))
    warning = census.warning()
    assert (warning is not None) is warns
    if warning is not None:
        assert ("round_demand = 0" in warning) is (demand == 0)
        assert ("announce_buckets = 1" in warning) is (buckets == 1)


class RecordsRuntime:
    """The DHT as the driver's read sees it: every key holds the same records."""

    peer_id = "me"

    def __init__(self, records: list[DhtRecord]) -> None:
        self.records = records

    async def dht_get(self, key: str, *, timeout: float, latest: bool = True) -> list[DhtRecord]:
        return self.records


def driver_read(
    caplog: pytest.LogCaptureFixture, peers: int, config: GossipConfig, reads: int = 1
) -> list[str]:
    """The driver reads round 5's records of ``peers`` announcers ``reads`` times; its warnings."""
    value = encode_payload(AnnounceMessage(round=5, rollout_digests=(b"\x01" * 32,)))
    records = [DhtRecord(f"peer{i}", b"part0", value, 1e12) for i in range(peers)]
    records.append(DhtRecord("me", b"part0", value, 1e12))  # its own: not counted
    admission = AdmissionPipeline(AdmissionConfig(allowed_tasks=frozenset()), now=0.0)
    runtime = cast(HivemindRuntime, RecordsRuntime(records))
    driver = GossipDriver(
        GossipCore(config, "me", selection_key=bytes(32)),
        runtime,
        admission,
        ExternalPool(),
        print,
        Metrics(),
        "s",
    )
    buckets = (tuple(range(config.announce_buckets)),) if config.announce_buckets > 1 else ()
    try:
        with caplog.at_level(logging.WARNING, logger="swarmnode.gossip.driver"):
            for _ in range(reads):
                asyncio.run(driver._read(ReadAnnouncements(rounds=(5,), buckets=buckets)))
    finally:
        driver.intake.close()
    assert len(driver._pending) == reads * peers * max(1, config.announce_buckets)  # all handed on
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_node_warns_once_when_it_reads_more_than_256_announcers_with_small_swarm_settings(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert driver_read(caplog, LARGE_SWARM_ANNOUNCERS, GossipConfig(), reads=2) == []  # not at 256
    caplog.clear()
    warnings = driver_read(caplog, LARGE_SWARM_ANNOUNCERS + 1, GossipConfig(), reads=3)
    assert len(warnings) == 1  # once, however many reads
    assert "257 distinct peers in round 5" in warnings[0]
    assert "See `swarmnode config large-swarm --nodes N`" in warnings[0]


def test_a_node_with_large_swarm_settings_does_not_warn(caplog: pytest.LogCaptureFixture) -> None:
    small = GossipConfig(round_demand=0, announce_buckets=4)  # pulls every batch announced
    assert len(driver_read(caplog, LARGE_SWARM_ANNOUNCERS + 100, small)) == 1
    caplog.clear()
    large = GossipConfig(round_demand=2, announce_buckets=4, read_buckets=2)
    assert driver_read(caplog, LARGE_SWARM_ANNOUNCERS + 100, large) == []
