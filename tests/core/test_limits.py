"""Specification of the bounded building blocks (swarmnode/core/limits.py): token bucket, expiring map."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from swarmnode.core.limits import ExpiringMap, TokenBucket


def test_token_bucket_allows_a_burst_then_the_rate() -> None:
    bucket = TokenBucket(rate=2.0, burst=4.0, updated=0.0)  # starts full
    assert bucket.take(0.0, 4)
    assert bucket.available(0.0) == 0
    assert bucket.ready_at(0.0, 1) == 0.5
    assert bucket.available(1.0) == 2.0
    assert bucket.available(100.0) == 4.0  # never more than the burst


def test_a_bucket_short_of_tokens_is_never_ready_now_even_by_a_rounding_error() -> None:
    # Red team rt40 F5: a shortfall of 4e-9 tokens at 1 MiB/s rounded back to now; a driver that
    # polled at that deadline found nothing to do and was given the same deadline again.
    now = 32.0577
    bucket = TokenBucket(rate=1048576.0, burst=33554432.0, tokens=131071.99999999627, updated=now)
    ready = bucket.ready_at(now, 131072)
    assert ready > now and bucket.available(ready) >= 131072


def test_token_bucket_takes_one_token_at_a_time_by_default_and_refuses_rather_than_overdraws() -> None:
    bucket = TokenBucket(rate=2.0, burst=3.0, updated=0.0)
    assert [bucket.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert bucket.take(0.5)  # one token back after 0.5 s at 2/s
    assert not bucket.take(0.5)
    assert not bucket.take(0.5, 0.5) and bucket.available(0.5) == 0.0  # a refusal spends nothing
    assert [bucket.take(100.0) for _ in range(4)] == [True, True, True, False], "refill caps at burst"


def test_token_bucket_ignores_time_running_backwards() -> None:
    bucket = TokenBucket(rate=1.0, burst=1.0, updated=10.0)
    assert bucket.take(10.0)
    assert not bucket.take(5.0)
    assert not bucket.take(10.5)
    assert bucket.take(11.0)


def test_token_bucket_spent_into_debt_repays_before_granting_again() -> None:
    bucket = TokenBucket(rate=1.0, burst=2.0, tokens=0.5, updated=0.0)
    bucket.spend(0.0, 2.5)  # a cost known only afterwards
    assert bucket.available(0.0) == -2.0 and not bucket.is_full(0.0)
    assert not bucket.take(2.5)  # 0.5 tokens: still short of one
    assert bucket.take(3.0) and bucket.is_full(100.0)


@given(st.lists(st.tuples(st.floats(0, 5), st.integers(0, 6)), max_size=40))
def test_token_bucket_never_grants_more_than_burst_plus_rate_times_time(
    steps: list[tuple[float, int]],
) -> None:
    bucket = TokenBucket(rate=1.5, burst=3.0, updated=0.0)
    now, log = 0.0, []
    for dt, want in steps:
        now += dt
        granted = want if bucket.take(now, want) else 0
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


class _PlainExpiringMap:
    """The expiring map's rules without its remembered first expiry: the reference it must match."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.entries: dict[str, tuple[float, int]] = {}

    def put(self, key: str, value: int, expires_at: float) -> list[tuple[str, int]]:
        self.entries.pop(key, None)
        self.entries[key] = (expires_at, value)
        evicted = []
        while len(self.entries) > self.capacity:
            oldest = next(iter(self.entries))
            evicted.append((oldest, self.entries.pop(oldest)[1]))
        return evicted

    def pop_expired(self, now: float) -> list[tuple[str, int]]:
        expired = []
        while self.entries and next(iter(self.entries.values()))[0] <= now:
            key = next(iter(self.entries))
            expired.append((key, self.entries.pop(key)[1]))
        return expired


_OPS = st.lists(
    st.tuples(st.sampled_from(["put", "pop", "expire"]), st.sampled_from("abcde"), st.integers(0, 20)),
    max_size=60,
)


@given(ops=_OPS, capacity=st.integers(1, 4))
def test_expiring_map_expires_exactly_as_the_plain_rules_whatever_is_popped_or_put_again(
    ops: list[tuple[str, str, int]], capacity: int
) -> None:
    # The map remembers its first entry's expiry (pop_expired runs at every event of a core);
    # popping that entry, putting it again (it moves to the end), or an eviction must not leave a
    # stale one that hides an entry now due, as re-putting "a" would hide "b" here:
    # put a@5, put b@1 (out of order: waits behind a), put a@9 -> b is first, due at 1.
    m: ExpiringMap[str, int] = ExpiringMap(capacity)
    ref = _PlainExpiringMap(capacity)
    now = 0.0
    for i, (op, key, t) in enumerate(ops):
        if op == "put":
            assert m.put(key, i, now + t) == ref.put(key, i, now + t)
        elif op == "pop":
            assert m.pop(key) == (None if key not in ref.entries else ref.entries.pop(key)[1])
        else:
            now += t / 4
            assert m.pop_expired(now) == ref.pop_expired(now)
        first = next(iter(ref.entries.values()))[0] if ref.entries else None
        assert m.next_expiry() == first
        assert list(m) == list(ref.entries)


def test_a_key_put_again_moves_behind_an_earlier_expiry_which_then_expires_first() -> None:
    m: ExpiringMap[str, int] = ExpiringMap(capacity=4)
    m.put("a", 1, expires_at=5.0)
    m.put("b", 2, expires_at=1.0)  # out of order: waits behind "a"
    assert m.pop_expired(2.0) == []
    m.put("a", 3, expires_at=9.0)  # moves to the end: "b" is first now
    assert m.next_expiry() == 1.0
    assert m.pop_expired(2.0) == [("b", 2)]


def test_tokens_given_back_refill_the_bucket_but_never_past_its_burst() -> None:
    bucket = TokenBucket(rate=1.0, burst=2.0, updated=0.0)
    assert bucket.take(0.0, 2.0) and bucket.available(0.0) == 0.0
    bucket.give(0.0)
    assert bucket.available(0.0) == 1.0
    bucket.give(0.0, 5.0)
    assert bucket.available(0.0) == 2.0
