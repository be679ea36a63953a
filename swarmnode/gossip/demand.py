"""Which announced items a node pulls when it needs only a few of each round (issue #18).

Owns
    The offers of each round (digests announced by peers, not pulled yet), and the draw that
    picks which of them to pull: a round's draw is fair over announcers and unsteerable.

    * **Unsteerable.** Every order is a keyed hash (BLAKE2b under a secret key of this node):
      announcers are ranked by ``H(key, round, announcer)``, an announcer's digests by
      ``H(key, digest)``. Nobody knows the key, so nobody can grind digests or identities that
      come first, and the order does not depend on when an offer arrived (no first-come): the
      core draws a round only from ``select_at`` of it on (by default when it ends, with every
      offer read by then in the draw), and later offers compete in the same order with what is left.
    * **Fair over announcers.** Each pick goes to the announcer charged least often this round,
      ties in key order; it is charged, and its best-ranked digest is taken. An identity that
      announces 64 digests gets the same picks as one that announces 1; only more identities get
      more (the peer table bounds how many are kept).
    * **Announcement buckets.** With ``announce_buckets`` K > 1 a node's records of round r live
      in bucket ``announcement_bucket(r, id, K)`` (public), and a reader reads its buckets of the
      round in its own keyed order (``read_order``), as many as ``read_buckets``, one more at each
      read while the round's offers fall short of its demand: reading costs about N k / K records
      a round instead of N.
    * **Bounded.** Per (round, announcer) the ``per_announcer`` best-ranked digests are kept
      (an announcer is never picked more often than that in a round), so a round holds at most
      ``per_announcer`` offers per announcer of it, and ``max_offers`` in all.

Must not
    Know about pulls, peers' standing or time: the core decides when a round is drawn, how many
    items it still needs, and which announcers are still worth asking.
"""

from __future__ import annotations

import bisect
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from swarmnode.core.events import Digest, PeerId

_RANK_BYTES = 8


def announcement_bucket(r: int, peer: PeerId, buckets: int) -> int:
    """The bucket of round ``r`` that ``peer``'s announcement records live in: a public rule, so a
    reader ignores a record stored in another bucket (one identity cannot write to every bucket).
    An identity can be ground to land in a bucket of its choice, but not in the buckets a reader
    reads (``RoundSampler.read_order``: keyed), so its records reach the readers of that bucket only."""
    if buckets <= 1:
        return 0
    h = hashlib.sha256(f"swarmnode-bucket:{r}:{peer}".encode()).digest()
    return int.from_bytes(h[:8], "big") % buckets


def _rank(key: bytes, *parts: bytes) -> bytes:
    h = hashlib.blake2b(key=key, digest_size=_RANK_BYTES)
    for part in parts:
        h.update(len(part).to_bytes(4, "big"))  # unambiguous concatenation
        h.update(part)
    return h.digest()


@dataclass
class _Round:
    # announcer -> its kept digests as (rank, digest), best first
    by_announcer: dict[PeerId, list[tuple[bytes, Digest]]] = field(default_factory=dict)
    # digest -> every announcer that offered it (ordered set): all of them may be asked
    announcers: dict[Digest, dict[PeerId, None]] = field(default_factory=dict)
    charged: dict[PeerId, int] = field(default_factory=dict)  # picks per announcer this round
    peer_rank: dict[PeerId, bytes] = field(default_factory=dict)


class RoundSampler:
    """The offers of each round and their fair, keyed draw. See the module docstring."""

    def __init__(self, per_announcer: int, max_offers: int, key: bytes | None = None) -> None:
        if per_announcer < 1 or max_offers < 1:
            raise ValueError("per_announcer and max_offers must be >= 1")
        self.per_announcer = per_announcer
        self.max_offers = max_offers
        self._key = os.urandom(32) if key is None else hashlib.blake2b(key, digest_size=32).digest()
        self._rounds: dict[int, _Round] = {}
        self._read_orders: dict[int, list[int]] = {}
        self._offers = 0  # (announcer, digest) pairs kept, every round
        self.dropped = 0  # offers not kept: the bound, or an announcer's worse-ranked digests

    def __len__(self) -> int:
        return self._offers

    def rounds(self) -> list[int]:
        return sorted(self._rounds)

    def waiting(self, r: int) -> bool:
        return bool(self._rounds.get(r, _Round()).by_announcer)

    def offer(self, r: int, digest: Digest, peer: PeerId) -> None:
        """``peer`` announced ``digest`` for round ``r``; kept if it is among ``peer``'s
        ``per_announcer`` best-ranked digests of ``r`` and there is room."""
        state = self._rounds.setdefault(r, _Round())
        offered = state.announcers.get(digest)
        if offered is not None and peer in offered:
            return
        kept = state.by_announcer.setdefault(peer, [])
        entry = (_rank(self._key, digest), digest)
        if len(kept) >= self.per_announcer:
            if entry >= kept[-1]:
                self.dropped += 1
                return
            _, worst = kept.pop()  # replaced by a better-ranked one: whatever order they came in
            self._unlink(state, worst, peer)
            self.dropped += 1
        elif self._offers >= self.max_offers:
            self.dropped += 1
            if not kept:
                del state.by_announcer[peer]
            return
        bisect.insort(kept, entry)
        state.announcers.setdefault(digest, {})[peer] = None
        self._offers += 1

    def draw(self, r: int, count: int, usable: Callable[[Digest], bool]) -> list[tuple[Digest, list[PeerId]]]:
        """Up to ``count`` digests of round ``r``, each with every announcer that offered it, in
        the fair keyed order; each is removed from the offers. ``usable(digest)`` false (known
        already, pulled through another announcer) skips it without a pick."""
        state = self._rounds.get(r)
        picked: list[tuple[Digest, list[PeerId]]] = []
        while state is not None and state.by_announcer and len(picked) < count:
            peer = min(
                state.by_announcer, key=lambda p: (state.charged.get(p, 0), self._peer_rank(state, r, p))
            )
            kept = state.by_announcer[peer]
            _, digest = kept.pop(0)
            if not kept:
                del state.by_announcer[peer]
            announcers = list(state.announcers.pop(digest, {peer: None}))
            for other in announcers:
                if other != peer:
                    self._remove(state, other, digest)
            self._offers -= len(announcers)
            if usable(digest):
                state.charged[peer] = state.charged.get(peer, 0) + 1
                picked.append((digest, announcers))
        return picked

    def forget_before(self, r: int) -> None:
        """Drop every round before ``r`` (no longer read, nor worth pulling)."""
        for old in [old for old in self._rounds if old < r]:
            state = self._rounds.pop(old)
            self._offers -= sum(len(kept) for kept in state.by_announcer.values())
        for old in [old for old in self._read_orders if old < r]:
            del self._read_orders[old]

    def offers_of(self, r: int) -> int:
        state = self._rounds.get(r)
        return 0 if state is None else sum(len(kept) for kept in state.by_announcer.values())

    def read_order(self, r: int, buckets: int) -> list[int]:
        """The announcement buckets of round ``r`` in the order this node reads them (keyed: no
        one else knows which buckets it reads first); ranked once per round."""
        cached = self._read_orders.get(r)
        if cached is None or len(cached) != buckets:
            tag = r.to_bytes(8, "big", signed=True)
            cached = sorted(
                range(buckets), key=lambda b: _rank(self._key, b"bucket", tag, b.to_bytes(4, "big"))
            )
            self._read_orders[r] = cached
        return cached

    def _peer_rank(self, state: _Round, r: int, peer: PeerId) -> bytes:
        rank = state.peer_rank.get(peer)
        if rank is None:
            rank = state.peer_rank[peer] = _rank(self._key, r.to_bytes(8, "big", signed=True), peer.encode())
        return rank

    def _remove(self, state: _Round, peer: PeerId, digest: Digest) -> None:
        kept = state.by_announcer.get(peer)
        if kept is None:
            return
        for i, (_, d) in enumerate(kept):
            if d == digest:
                del kept[i]
                break
        if not kept:
            del state.by_announcer[peer]

    def _unlink(self, state: _Round, digest: Digest, peer: PeerId) -> None:
        offered = state.announcers.get(digest)
        if offered is not None:
            offered.pop(peer, None)
            if not offered:
                del state.announcers[digest]
        self._offers -= 1
