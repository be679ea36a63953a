"""Specification of announcement stores (swarmnode/gossip/records.py): which expiry each store of a record
carries and when a failed store is tried again. Plain calls; the driver sleeps and stores."""

from __future__ import annotations

import pytest

from swarmnode.gossip import Announce
from swarmnode.gossip.records import ANNOUNCE_ATTEMPTS, AnnouncementStores

T = 1_000.0


def announce(round: int = 3, part: int = 0, expires_at: float = T + 60.0, n: int = 1) -> Announce:
    return Announce(round, part, tuple(bytes([i]) * 32 for i in range(n)), expires_at)


def test_each_store_of_a_part_expires_strictly_later_than_the_one_before() -> None:
    # hivemind keeps a subkey's record only if the new one expires strictly later.
    stores = AnnouncementStores()
    first = stores.expiry_for(announce(n=1), T)
    grown = stores.expiry_for(announce(n=2), T)  # a re-announcement of the same part, same expiry
    retry = stores.expiry_for(announce(n=2), T)
    assert first == T + 60.0
    assert grown == pytest.approx(T + 60.001) and retry == pytest.approx(T + 60.002)
    assert first is not None and grown is not None and retry is not None and first < grown < retry
    assert stores.expiry_for(announce(part=1), T) == T + 60.0  # another part: its own sequence


def test_a_record_that_would_have_expired_is_not_stored() -> None:
    stores = AnnouncementStores()
    assert stores.expiry_for(announce(expires_at=T), T) is None
    assert len(stores) == 0


def test_a_failed_store_is_retried_with_a_doubling_delay_until_the_attempts_run_out() -> None:
    stores = AnnouncementStores()
    delays = [stores.retry_delay(attempt) for attempt in range(ANNOUNCE_ATTEMPTS)]
    assert delays == [0.5, 1.0, 2.0, None]


def test_a_retry_stops_once_a_newer_announce_of_the_part_was_stored() -> None:
    stores = AnnouncementStores()
    old = announce(n=1)
    expires_at = stores.expiry_for(old, T)
    assert expires_at is not None and not stores.superseded(old, expires_at)
    stores.expiry_for(announce(n=2), T + 0.2)  # published meanwhile: a superset of the digests
    assert stores.superseded(old, expires_at)


def test_only_live_records_are_remembered() -> None:
    stores = AnnouncementStores()
    stores.expiry_for(announce(round=1, expires_at=T + 10.0), T)
    stores.expiry_for(announce(round=2, expires_at=T + 90.0), T)
    stores.prune(T + 10.0)
    assert len(stores) == 1
