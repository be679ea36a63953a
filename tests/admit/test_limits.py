"""The replay cache: sans-IO, bounded, fail-closed (the token bucket: tests/core/test_limits.py)."""

from __future__ import annotations

import pytest

from swarmnode.admit import ReplayCache


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
