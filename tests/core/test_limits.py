"""Specification of the bounded building blocks (swarmnode/core/limits.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from swarmnode.core.limits import ExpiringMap, TokenBucket


def test_token_bucket_allows_a_burst_then_the_rate() -> None:
    bucket = TokenBucket.full(rate=2.0, burst=4.0, now=0.0)
    bucket.take(4, now=0.0)
    assert bucket.available(0.0) == 0
    assert bucket.ready_at(1, now=0.0) == 0.5
    assert bucket.available(1.0) == 2.0
    assert bucket.available(100.0) == 4.0  # never more than the burst


@given(st.lists(st.tuples(st.floats(0, 5), st.integers(0, 6)), max_size=40))
def test_token_bucket_never_grants_more_than_burst_plus_rate_times_time(
    steps: list[tuple[float, int]],
) -> None:
    bucket = TokenBucket.full(rate=1.5, burst=3.0, now=0.0)
    now, log = 0.0, []
    for dt, want in steps:
        now += dt
        granted = min(want, int(bucket.available(now)))
        bucket.take(granted, now)
        log.append((now, granted))
    for i in range(len(log)):
        for j in range(i, len(log)):
            assert sum(n for _, n in log[i : j + 1]) <= 3.0 + 1.5 * (log[j][0] - log[i][0]) + 1e-9


def test_expiring_map_expires_in_order_and_evicts_the_oldest_beyond_capacity() -> None:
    m: ExpiringMap[str, int] = ExpiringMap(capacity=2)
    assert m.put("a", 1, expires_at=10.0) == []
    m.put("b", 2, expires_at=11.0)
    assert m.put("c", 3, expires_at=12.0) == [("a", 1)]
    assert m.next_expiry() == 11.0
    assert m.pop_expired(11.0) == [("b", 2)]
    assert len(m) == 1 and "c" in m and m.get("c") == 3
