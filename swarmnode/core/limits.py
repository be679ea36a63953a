"""Bounded building blocks for the sans-IO cores: a token bucket and a capped map with expiry.

Owns: rate limiting and bounded, expiring memory, as plain data driven by a caller's ``now``.
Must not: read a clock or allocate without a bound.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterator, KeysView
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` banked; starts full unless given ``tokens``.

    The one token bucket of the package (gossip's per-peer pull and serve rates, admission's per-peer
    rates, CPU budgets and new-identity rate). Every method takes the caller's ``now`` first, then an
    amount. It refills lazily, on each call; time running backwards refills nothing. Over any interval
    of length ``dt`` at most ``burst + rate * dt`` tokens can be taken; ``spend`` may leave the bucket
    in debt, which refills repay before anything can be taken again.
    """

    __slots__ = ("burst", "rate", "tokens", "updated")

    def __init__(
        self, rate: float, burst: float, tokens: float | None = None, *, updated: float = 0.0
    ) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens: float = burst if tokens is None else tokens
        self.updated = updated  # the time of the last refill

    def __repr__(self) -> str:
        fields = f"rate={self.rate!r}, burst={self.burst!r}, tokens={self.tokens!r}, updated={self.updated!r}"
        return f"TokenBucket({fields})"

    def _refill(self, now: float) -> None:
        if now > self.updated:
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
            self.updated = now

    def available(self, now: float) -> float:
        """Tokens held at ``now`` (negative: in debt)."""
        self._refill(now)
        return self.tokens

    def is_full(self, now: float) -> bool:
        return self.available(now) >= self.burst

    def take(self, now: float, amount: float = 1.0) -> bool:
        """Spend ``amount`` tokens if the bucket holds that many (True); otherwise spend nothing (False)."""
        self._refill(now)
        if self.tokens >= amount:
            self.tokens -= amount
            return True
        return False

    def spend(self, now: float, amount: float) -> None:
        """Spend ``amount`` even if that leaves the bucket in debt (a cost known only afterwards)."""
        self._refill(now)
        self.tokens -= amount

    def give(self, now: float, amount: float = 1.0) -> None:
        """Return ``amount`` tokens (a cost refunded), never past ``burst``."""
        self._refill(now)
        self.tokens = min(self.burst, self.tokens + amount)

    def ready_at(self, now: float, amount: float = 1.0) -> float:
        """The earliest time at which ``amount`` tokens will be available (``now`` if they are):
        always later than ``now`` while they are not. A shortfall of a few billionths of a token
        rounded back to ``now``, and a caller that slept until then woke to nothing, for ever
        (red team rt40 F5: 131,071.99999999627 bytes held against 131,072)."""
        self._refill(now)
        if self.tokens >= amount:
            return now
        return max(now + (amount - self.tokens) / self.rate, math.nextafter(now, math.inf))


class ExpiringMap(Generic[K, V]):
    """An insertion-ordered map with a capacity and a per-entry expiry time.

    Entries expire in insertion order: exact when callers insert with non-decreasing expiry times
    (the usual ``now + ttl`` with a constant ttl and a non-decreasing ``now``). An entry inserted
    out of order may outlive its expiry until the entries before it expire; the capacity bound
    holds regardless. Re-inserting a key moves it to the end.

    Full, it evicts the oldest entry: right for what a core may forget early (a candidate, a
    pending pull). The replay cache (``swarmnode.admit.limits.ReplayCache``) is deliberately not
    one of these: forgetting a live digest would reopen a replay window, so it refuses when full,
    keeps each digest to its own expiry and counts digests per party.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._entries: dict[K, tuple[float, V]] = {}  # never rebound: ``keys`` views stay live
        # The first entry's expiry, or None to look it up: ``pop_expired`` runs at every event of a
        # gossip core, mostly to find nothing due, and finding the first entry of a dict that was
        # popped from the front costs a walk over the popped slots.
        self._first_expiry: float | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[K]:
        return iter(self._entries)

    def keys(self) -> KeysView[K]:
        """A live view of the keys: ``key in view`` is a C-level lookup, for paths that test millions
        of keys (a gossip core's record path), where ``__contains__`` costs a Python call each."""
        return self._entries.keys()

    @property
    def full(self) -> bool:
        return len(self._entries) >= self.capacity

    def get(self, key: K) -> V | None:
        entry = self._entries.get(key)
        return None if entry is None else entry[1]

    def items(self) -> list[tuple[K, V]]:
        """A snapshot, oldest first (safe to mutate the map while iterating it)."""
        return [(key, value) for key, (_, value) in self._entries.items()]

    def pop(self, key: K) -> V | None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        self._first_expiry = None  # it may have been the first
        return entry[1]

    def put(self, key: K, value: V, expires_at: float) -> list[tuple[K, V]]:
        """Insert (or move to the end); returns the oldest entries evicted to stay within capacity."""
        if self._entries.pop(key, None) is not None or not self._entries:
            self._first_expiry = None  # it may have been the first, or it is now
        self._entries[key] = (expires_at, value)
        evicted: list[tuple[K, V]] = []
        while len(self._entries) > self.capacity:
            oldest = next(iter(self._entries))
            evicted.append((oldest, self._entries.pop(oldest)[1]))
            self._first_expiry = None
        return evicted

    def pop_expired(self, now: float) -> list[tuple[K, V]]:
        """Remove and return the entries whose expiry is ``<= now``, oldest first."""
        expired: list[tuple[K, V]] = []
        first = self._first_expiry  # ``next_expiry`` inline: this runs at every event of a core
        if first is None:
            if not self._entries:
                return expired
            first = self._first_expiry = next(iter(self._entries.values()))[0]
        if first > now:
            return expired
        self._first_expiry = None
        while self._entries:
            key = next(iter(self._entries))
            expires_at, value = self._entries[key]
            if expires_at > now:
                break
            del self._entries[key]
            expired.append((key, value))
        return expired

    def next_expiry(self) -> float | None:
        """The expiry time of the oldest entry, or ``None`` when empty."""
        if self._first_expiry is None and self._entries:
            self._first_expiry = next(iter(self._entries.values()))[0]
        return self._first_expiry
