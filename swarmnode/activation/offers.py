"""Offers a worker hands its learner directly: a path to the learner that no DHT key can hide.

Why: every DHT key is an open namespace. The record rules (``net/record_rules.py``) stop one
identity from filling a key, but identities cost nothing: 256 fresh ones, each refreshing one
valid-looking ``record``, fill ``workers/<learner>``, and a *new* honest offer is then refused
there (protocol/SPEC.md §2.1). Network addresses do cost something. So a worker also sends its
signed offer (the same PeerRecord envelope it stores in the DHT) to the learner's data plane,
where the learner sees the TCP source address, which a peer cannot choose, and keeps:

* at most ``per_network`` offers from one network (IPv4 /24, IPv6 /48; everything that came over
  the hivemind fallback counts as one network, since a libp2p id is as free as an identity);
* at most ``max_offers`` in all; when full, a newcomer takes the place of the stalest offer of the
  network holding the most, if that network holds at least two more than the newcomer's would;
* each offer for one lifetime (``max_age``) after it was signed, refreshed by a newer one.

So Sybils on one network hold ``per_network`` places however many identities they make, and a
worker on a network with fewer offers than the most crowded one always finds room. To hide it an
attacker needs addresses on ``max_offers / 2`` networks, not keys.

Owns: that table (``DirectOffers``) and the network of an address (``network_of``).
Must not: do I/O, read a clock (callers pass ``now``), or check signatures (the data plane did).
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from dataclasses import dataclass

from swarmnode.activation.lifetime import MAX_CLOCK_AHEAD, RECORD_MAX_AGE
from swarmnode.wire import PeerRecord, Role

MAX_OFFERS = 256
PER_NETWORK = 8
FALLBACK_NETWORK = "p2p"


def network_of(source: str) -> str:
    """The network an address belongs to for rationing: ``a.b.c.0/24``, ``x:y:z::/48``, or
    ``"p2p"`` for a request that came over the hivemind fallback (``"p2p:<id>"``)."""
    if source.startswith("p2p:") or not source:
        return FALLBACK_NETWORK
    try:
        address = ipaddress.ip_address(source.split("%", 1)[0])
    except ValueError:
        return FALLBACK_NETWORK  # not an IP (cannot happen for a TCP peer): ration with the rest
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    prefix = 24 if address.version == 4 else 48
    return str(ipaddress.ip_network(f"{address}/{prefix}", strict=False))


@dataclass(frozen=True)
class DirectOffer:
    record: PeerRecord
    sent_at: float  # when the worker signed it (the envelope's sent_at)
    network: str


class DirectOffers:
    """The learner's table of offers pushed to it (module docstring)."""

    def __init__(
        self, *, max_offers: int = MAX_OFFERS, per_network: int = PER_NETWORK, max_age: float = RECORD_MAX_AGE
    ) -> None:
        if max_offers < 1 or per_network < 1:
            raise ValueError("max_offers and per_network must be at least 1")
        self.max_offers = max_offers
        self.per_network = per_network
        self.max_age = max_age
        self._offers: dict[str, DirectOffer] = {}
        self.refused: Counter[str] = Counter()
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._offers)

    def receive(self, sender: str, sent_at: float, record: PeerRecord, source: str, now: float) -> str | None:
        """A pushed offer (``sender`` signed it at ``sent_at``; it came from ``source``, as the
        data plane's ``request_source()`` names it): kept, or ``"reason: detail"`` why not."""
        if record.peer_id != sender:
            refusal = f"sender_mismatch: the record names {record.peer_id}"
        elif Role.WORKER not in record.roles:
            refusal = "not_a_worker: the record does not offer the worker role"
        elif sent_at < now - self.max_age:
            refusal = f"too_old: signed {now - sent_at:.0f} s ago (older than {self.max_age:g} s)"
        elif sent_at > now + MAX_CLOCK_AHEAD:
            refusal = f"from_future: signed {sent_at - now:.0f} s ahead of our clock"
        else:
            return self.put(record, sent_at, network_of(source), now)
        self.refused[refusal.split(":", 1)[0]] += 1
        return refusal

    def put(self, record: PeerRecord, sent_at: float, network: str, now: float) -> str | None:
        """Keep ``record`` (signed at ``sent_at``, received from ``network``); else why not."""
        self.expire(now)
        refusal = self._place(record, sent_at, network)
        if refusal is not None:
            self.refused[refusal.split(":", 1)[0]] += 1
        return refusal

    def _place(self, record: PeerRecord, sent_at: float, network: str) -> str | None:
        held = self._offers.get(record.peer_id)
        if held is not None:
            if sent_at <= held.sent_at:
                return "not_newer: an offer signed no later is already held"
            # A newer offer of a worker we hold replaces it, from whichever network it came:
            # the signature is the worker's, and the place is charged to where it came from.
            del self._offers[record.peer_id]
        counts = Counter(o.network for o in self._offers.values())
        if counts[network] >= self.per_network:
            if held is not None:
                self._offers[record.peer_id] = held  # keep what we had
            return f"network_full: {self.per_network} offers from {network} already"
        if len(self._offers) >= self.max_offers:
            crowded, most = max(counts.items(), key=lambda item: (item[1], item[0]))
            if most < counts[network] + 2:
                return f"offers_full: {self.max_offers} offers held, none from a more crowded network"
            stalest = min((o for o in self._offers.values() if o.network == crowded), key=lambda o: o.sent_at)
            del self._offers[stalest.record.peer_id]
            self.evicted += 1
        self._offers[record.peer_id] = DirectOffer(record, sent_at, network)
        return None

    def expire(self, now: float) -> None:
        for peer in [p for p, o in self._offers.items() if o.sent_at < now - self.max_age]:
            del self._offers[peer]

    def live(self, now: float) -> dict[str, tuple[float, PeerRecord]]:
        """Every offer younger than one lifetime: peer id -> (signed at, record)."""
        self.expire(now)
        return {peer: (o.sent_at, o.record) for peer, o in self._offers.items()}

    def stats(self) -> dict[str, object]:
        return {
            "held": len(self._offers),
            "networks": len({o.network for o in self._offers.values()}),
            "evicted": self.evicted,
            "refused": dict(self.refused),
        }
