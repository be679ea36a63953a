"""Per-peer admission state: score, rate bucket, bans, and their persistence.

Owns: ``PeerBook`` (bounded table of peers we track), ``BanLedger`` (the
interface of ``swarmnode.store.Ledger`` this package needs). Must not: read a
clock, or create state for identities the pipeline refuses to track.

Score rule: a peer starts at 0; each accepted message adds ``accept_reward`` (up
to ``max_score``); each rejection charged to it subtracts that reason's penalty;
at or below ``ban_threshold`` it is banned until ``now + ban_seconds``. The ban
is written to the ledger at once (``put_ban``) and reloaded at start-up
(``active_bans``), so restarting the node does not pardon anyone; the score
restarts at 0 when the ban ends.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

from swarmnode.core.limits import TokenBucket


class BanLedger(Protocol):
    """What admission needs from ``swarmnode.store.ledger.Ledger``."""

    def put_ban(self, peer_id: str, until: float, reason: str) -> None: ...

    def active_bans(self, now: float) -> dict[str, float]: ...

    def count_rejection(self, peer_id: str, reason: str) -> None: ...


@dataclass(frozen=True, slots=True)
class ScoreRule:
    ban_threshold: float = -10.0
    ban_seconds: float = 3600.0
    accept_reward: float = 0.2
    max_score: float = 5.0
    rate_per_s: float = 5.0  # tokens per second per peer (an envelope costs 1 + payload/64 KiB)
    burst: float = 50.0


@dataclass(slots=True)
class PeerState:
    score: float
    bucket: TokenBucket


class PeerBook:
    """Scores and rate buckets of up to ``capacity`` peers (least recently seen evicted), plus bans.

    Bans are kept apart from the evictable table, so evicting a peer never lifts its ban.
    """

    def __init__(self, rule: ScoreRule, capacity: int, ledger: BanLedger | None, now: float) -> None:
        self.rule = rule
        self.capacity = capacity
        self.ledger = ledger
        self._peers: OrderedDict[str, PeerState] = OrderedDict()
        self.bans: dict[str, float] = dict(ledger.active_bans(now)) if ledger is not None else {}

    def __len__(self) -> int:
        return len(self._peers)

    def known(self, peer_id: str) -> bool:
        return peer_id in self._peers

    def banned(self, peer_id: str, now: float) -> float | None:
        """End of ``peer_id``'s ban if it is banned at ``now``, else None."""
        until = self.bans.get(peer_id)
        if until is None:
            return None
        if until <= now:
            del self.bans[peer_id]
            return None
        return until

    def state(self, peer_id: str, now: float) -> PeerState:
        """The peer's state, created (and the least recently seen peer evicted) if needed."""
        state = self._peers.get(peer_id)
        if state is None:
            if len(self._peers) >= self.capacity:
                self._peers.popitem(last=False)
            state = PeerState(0.0, TokenBucket(self.rule.rate_per_s, self.rule.burst, updated=now))
            self._peers[peer_id] = state
        else:
            self._peers.move_to_end(peer_id)
        return state

    def score(self, peer_id: str) -> float | None:
        state = self._peers.get(peer_id)
        return None if state is None else state.score

    def reward(self, peer_id: str, now: float) -> None:
        state = self.state(peer_id, now)
        state.score = min(self.rule.max_score, state.score + self.rule.accept_reward)

    def penalize(self, peer_id: str, penalty: float, reason: str, now: float) -> bool:
        """Lower ``peer_id``'s score; ban it if it falls to the threshold. True if this banned it."""
        state = self.state(peer_id, now)
        state.score -= penalty
        if self.ledger is not None:
            self.ledger.count_rejection(peer_id, reason)
        if state.score > self.rule.ban_threshold or self.banned(peer_id, now) is not None:
            return False
        until = now + self.rule.ban_seconds
        self.bans[peer_id] = until
        state.score = 0.0  # the slate is clean once the ban has been served
        if self.ledger is not None:
            self.ledger.put_ban(peer_id, until, reason)
        return True
