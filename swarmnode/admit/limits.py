"""Sans-IO rate limits and the replay cache.

Owns: ``ReplayCache`` (with its per-party quotas) and ``BucketMap`` (a token
bucket per peer, bounded; the bucket itself is ``swarmnode.core.limits.TokenBucket``).
Must not: read a clock (every call takes ``now``), or grow without bound (the
cache has a hard size cap and refuses rather than forgets; see ``ReplayCache``).
"""

from __future__ import annotations

import heapq
from collections import Counter, OrderedDict, deque

from swarmnode.core.limits import TokenBucket


class ReplayCache:
    """Digests seen recently, each kept until its own expiry time, with a quota per party.

    When full of unexpired digests, ``add`` returns False and the caller refuses
    the message: forgetting a live digest early would reopen a replay window,
    refusing only delays a sender (who is rate-limited anyway). Size the cap for
    ``peers x rate x freshness window`` (SPEC.md "Admission").

    A global cap alone is a lock-out waiting for one attacker (measured: one
    signer filled 200,000 digests in ~4 minutes and honest batches were refused),
    so each digest is also counted against the parties that made us keep it (the
    signer and the delivering peer); ``over_quota`` names a party already holding
    ``quota`` live digests. Quotas alone still let a dozen cheap identities fill
    the cache together, so ``make_room`` forgets early: the oldest digests of the
    party holding the most. That reopens no replay window: each forgotten digest
    leaves its signer a watermark, and the signer's envelopes that expire no later
    than it are refused as replays (``forgotten_until``). What an early forget
    costs a signer is only its own old envelopes, never yet delivered, refused.
    Owners are ``(signer, via)``: the signer first.
    """

    def __init__(self, capacity: int, quota: int | None = None) -> None:
        if capacity < 1:
            raise ValueError("replay cache capacity must be >= 1")
        self.capacity = capacity
        self.quota = capacity if quota is None else quota
        if self.quota < 1:
            raise ValueError("replay cache quota must be >= 1")
        self._expiry: dict[bytes, float] = {}
        self._owners: dict[bytes, tuple[str, ...]] = {}
        self._held: Counter[str] = Counter()
        self._by_owner: dict[str, deque[bytes]] = {}  # insertion order; may hold forgotten digests
        self._heap: list[tuple[float, bytes]] = []
        self._forgotten: dict[str, float] = {}  # signer -> newest expiry forgotten early
        self._forgotten_heap: list[tuple[float, str]] = []
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._expiry)

    def purge(self, now: float) -> None:
        """Drop digests whose expiry is at or before ``now``."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            expiry, digest = heapq.heappop(heap)
            if self._expiry.get(digest) == expiry:
                self._forget(digest)

    def _forget(self, digest: bytes) -> None:
        del self._expiry[digest]
        for owner in self._owners.pop(digest, ()):
            self._held[owner] -= 1
            if self._held[owner] <= 0:
                del self._held[owner]
                self._by_owner.pop(owner, None)

    def seen(self, digest: bytes, now: float) -> bool:
        expiry = self._expiry.get(digest)
        return expiry is not None and expiry > now

    def room(self, now: float, count: int) -> bool:
        """Whether ``count`` more digests fit after purging."""
        self.purge(now)
        return len(self._expiry) + count <= self.capacity

    def make_room(self, now: float, count: int) -> bool:
        """Whether ``count`` more digests fit, forgetting the largest holder's oldest digests if not.

        Forgetting reopens no replay window: the signer of a forgotten digest gets a watermark
        (``forgotten_until``) that refuses its envelopes expiring no later than the newest
        forgotten one. False only when the cache is full of digests nobody owns (our own)."""
        self.purge(now)
        while len(self._expiry) + count > self.capacity:
            if not self._held:
                return False
            top = max(self._held.items(), key=lambda item: item[1])[0]
            queue = self._by_owner.get(top, deque())
            while queue:
                digest = queue.popleft()
                owners = self._owners.get(digest)
                if owners is not None and top in owners:
                    expiry = self._expiry[digest]
                    signer = owners[0]
                    if expiry > self._forgotten.get(signer, -1.0):
                        self._forgotten[signer] = expiry
                        heapq.heappush(self._forgotten_heap, (expiry, signer))
                    self._forget(digest)
                    self.evicted += 1
                    break
            else:
                return False  # its count and its queue disagree: refuse rather than loop
        return True

    def forgotten_until(self, signer: str, now: float) -> float:
        """The latest expiry among ``signer``'s digests forgotten to make room (-1 if none live)."""
        heap = self._forgotten_heap
        while heap and heap[0][0] <= now:
            expiry, who = heapq.heappop(heap)
            if self._forgotten.get(who) == expiry:
                del self._forgotten[who]
        return self._forgotten.get(signer, -1.0)

    def held(self, owner: str) -> int:
        """Live digests counted against ``owner``."""
        return self._held.get(owner, 0)

    def over_quota(self, owners: tuple[str, ...], count: int) -> str | None:
        """The first of ``owners`` that ``count`` more digests would put over its quota (purge first)."""
        for owner in owners:
            if self._held.get(owner, 0) + count > self.quota:
                return owner
        return None

    def add(self, digest: bytes, expiry: float, owners: tuple[str, ...] = ()) -> None:
        """Remember ``digest`` until ``expiry``, counted against ``owners`` (call ``room`` first)."""
        if self._expiry.get(digest, -1.0) >= expiry:
            return
        if digest not in self._owners:
            unique = tuple(dict.fromkeys(owners))
            self._owners[digest] = unique
            for owner in unique:
                self._held[owner] += 1
                self._by_owner.setdefault(owner, deque()).append(digest)
        self._expiry[digest] = expiry
        heapq.heappush(self._heap, (expiry, digest))


class BucketMap:
    """A ``TokenBucket`` per key, at most ``capacity`` keys (least recently used dropped).

    A new key starts with ``initial`` tokens (default: a full bucket). A dropped key
    comes back as a new one: with ``initial`` below ``burst`` that can take budget
    from a peer, so ``capacity`` should exceed the peers a node meets in a refill."""

    def __init__(self, rate: float, burst: float, capacity: int, initial: float | None = None) -> None:
        self.rate, self.burst, self.capacity = rate, burst, capacity
        self.initial = burst if initial is None else initial
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()

    def _bucket(self, key: str, now: float) -> TokenBucket:
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = TokenBucket(self.rate, self.burst, self.initial, updated=now)
            while len(self._buckets) > self.capacity:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
        return bucket

    def has(self, key: str, now: float, amount: float = 0.0) -> bool:
        """Whether ``key``'s bucket is not in debt (holds more than ``amount``) after refilling."""
        return self._bucket(key, now).available(now) > amount

    def spend(self, key: str, now: float, amount: float) -> None:
        """Take ``amount`` even if that leaves the bucket in debt (cost known only afterwards)."""
        self._bucket(key, now).spend(now, amount)

    def level(self, key: str) -> float | None:
        bucket = self._buckets.get(key)
        return None if bucket is None else bucket.tokens
