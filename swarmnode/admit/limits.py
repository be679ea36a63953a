"""Sans-IO rate limits and the replay cache.

Owns: ``TokenBucket``, ``ReplayCache``. Must not: read a clock (every call
takes ``now``), or grow without bound (the cache has a hard size cap and
refuses rather than forgets; see ``ReplayCache``).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass


@dataclass(slots=True)
class TokenBucket:
    """``rate`` tokens per second up to ``burst``; starts full."""

    rate: float
    burst: float
    tokens: float = -1.0
    updated: float = 0.0

    def __post_init__(self) -> None:
        if self.tokens < 0:
            self.tokens = self.burst

    def take(self, now: float, cost: float = 1.0) -> bool:
        """Spend ``cost`` tokens if there are enough; refill first. Time running backwards refills nothing."""
        elapsed = now - self.updated
        if elapsed > 0:
            self.tokens = min(self.burst, self.tokens + elapsed * self.rate)
            self.updated = now
        if self.tokens >= cost:
            self.tokens -= cost
            return True
        return False


class ReplayCache:
    """Digests seen recently, each kept until its own expiry time.

    When full of unexpired digests, ``add`` returns False and the caller refuses
    the message: forgetting a live digest early would reopen a replay window,
    refusing only delays a sender (who is rate-limited anyway). Size the cap for
    ``peers x rate x freshness window`` (SPEC.md "Admission").
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("replay cache capacity must be >= 1")
        self.capacity = capacity
        self._expiry: dict[bytes, float] = {}
        self._heap: list[tuple[float, bytes]] = []

    def __len__(self) -> int:
        return len(self._expiry)

    def purge(self, now: float) -> None:
        """Drop digests whose expiry is at or before ``now``."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            expiry, digest = heapq.heappop(heap)
            if self._expiry.get(digest) == expiry:
                del self._expiry[digest]

    def seen(self, digest: bytes, now: float) -> bool:
        expiry = self._expiry.get(digest)
        return expiry is not None and expiry > now

    def room(self, now: float, count: int) -> bool:
        """Whether ``count`` more digests fit after purging."""
        self.purge(now)
        return len(self._expiry) + count <= self.capacity

    def add(self, digest: bytes, expiry: float) -> None:
        """Remember ``digest`` until ``expiry`` (call ``room`` first; the cap is enforced there)."""
        if self._expiry.get(digest, -1.0) >= expiry:
            return
        self._expiry[digest] = expiry
        heapq.heappush(self._heap, (expiry, digest))
