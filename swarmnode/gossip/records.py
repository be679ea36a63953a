"""Storing announcement records as plain rules: which expiry each store carries, when to retry one.

Owns
    The announce retry policy of the node's driver (``driver.GossipDriver``): the core never
    re-announces a part on its own (a lost store would lose every item in it), so a failed or
    refused store is retried, with a doubling delay, until a newer ``Announce`` of the same part
    takes over, the record would have expired, or the attempts run out. And the expiry rule of
    the DHT the node writes to: hivemind keeps a subkey's record only if the new one expires
    strictly later, so each store of a part (a re-announcement with more digests, a retry)
    expires 1 ms after the previous one; otherwise the replicas would keep the first version.
Must not
    Touch sockets, clocks or event loops (``now`` is an argument; the driver sleeps and stores).
"""

from __future__ import annotations

import math

from swarmnode.gossip.core import Announce

ANNOUNCE_ATTEMPTS = 4
ANNOUNCE_RETRY_DELAY = 0.5  # seconds before the second attempt, doubled for each further one
EXPIRY_STEP = 0.001  # each store of a part expires this much after the previous one


class AnnouncementStores:
    """The expiry last stored for each live (round, part) record of this node."""

    def __init__(self, attempts: int = ANNOUNCE_ATTEMPTS, retry_delay: float = ANNOUNCE_RETRY_DELAY) -> None:
        self.attempts = attempts
        self.retry_delay_base = retry_delay
        self._expiries: dict[tuple[int, int], float] = {}  # (round, part) -> expiry last stored

    def prune(self, now: float) -> None:
        """Forget parts whose records have expired (bounded: only live records are kept)."""
        for key in [k for k, expiry in self._expiries.items() if expiry <= now]:
            del self._expiries[key]

    def expiry_for(self, action: Announce, now: float) -> float | None:
        """The expiry the next store of ``action`` must carry, now noted as this part's latest; None
        when the record would have expired already (nothing to store)."""
        part = (action.round, action.part)
        expires_at = max(action.expires_at, self._expiries.get(part, -math.inf) + EXPIRY_STEP)
        if expires_at <= now:
            return None
        self._expiries[part] = expires_at
        return expires_at

    def retry_delay(self, failed_attempt: int) -> float | None:
        """Seconds to wait after attempt ``failed_attempt`` (0 = the first) failed; None: give up."""
        if failed_attempt + 1 >= self.attempts:
            return None
        return self.retry_delay_base * 2**failed_attempt

    def superseded(self, action: Announce, expires_at: float) -> bool:
        """Whether a newer ``Announce`` of this part (a superset of its digests) was stored since."""
        return self._expiries.get((action.round, action.part)) != expires_at

    def __len__(self) -> int:
        return len(self._expiries)


__all__ = ["ANNOUNCE_ATTEMPTS", "ANNOUNCE_RETRY_DELAY", "AnnouncementStores"]
