"""Token buckets and the replay cache: sans-IO, bounded, fail-closed."""

from __future__ import annotations

import pytest

from swarmnode.admit import ReplayCache, TokenBucket


def test_bucket_allows_a_burst_then_refills_at_its_rate() -> None:
    bucket = TokenBucket(rate=2.0, burst=3.0, updated=0.0)
    assert [bucket.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert bucket.take(0.5)  # one token back after 0.5 s at 2/s
    assert not bucket.take(0.5)
    assert [bucket.take(100.0) for _ in range(4)] == [True, True, True, False], "refill caps at burst"


def test_bucket_ignores_time_running_backwards() -> None:
    bucket = TokenBucket(rate=1.0, burst=1.0, updated=10.0)
    assert bucket.take(10.0)
    assert not bucket.take(5.0)
    assert not bucket.take(10.5)
    assert bucket.take(11.0)


def test_replay_cache_remembers_each_digest_until_its_own_expiry() -> None:
    cache = ReplayCache(capacity=10)
    cache.add(b"a", expiry=5.0)
    cache.add(b"b", expiry=9.0)
    assert cache.seen(b"a", 4.9) and cache.seen(b"b", 4.9)
    assert not cache.seen(b"a", 5.0)
    cache.purge(6.0)
    assert len(cache) == 1 and cache.seen(b"b", 6.0)


def test_replay_cache_refuses_rather_than_forgets_when_full() -> None:
    cache = ReplayCache(capacity=2)
    cache.add(b"a", expiry=10.0)
    cache.add(b"b", expiry=20.0)
    assert not cache.room(5.0, 1)
    assert cache.seen(b"a", 5.0) and cache.seen(b"b", 5.0), "nothing live was dropped"
    assert cache.room(10.0, 1), "room once the earliest digest expired"


def test_replay_cache_needs_a_positive_capacity() -> None:
    with pytest.raises(ValueError):
        ReplayCache(0)
