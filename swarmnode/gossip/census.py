"""How many peers announce in a round, as this node reads them: the large-swarm warning.

Owns
    Counting the distinct announcers of each round among the records the driver hands to the
    core, and the one warning a node run gives when it reads more than ``LARGE_SWARM_ANNOUNCERS``
    of them in a round with small-swarm settings (``swarm.round_demand = 0``: every batch
    announced is pulled; or ``swarm.announce_buckets = 1``: every record of a round is read from
    one DHT key). README, "In a large swarm"; ``swarmnode config large-swarm`` prints the settings.
Must not
    Touch sockets, clocks or event loops, or change what the core reads or pulls: it only counts.
"""

from __future__ import annotations

from collections.abc import Iterable

from swarmnode.gossip.core import Announced

#: Distinct announcers of one round above which small-swarm settings are worth a warning: four
#: times the 64 nodes' records an announcement bucket holds in a large swarm.
LARGE_SWARM_ANNOUNCERS = 256
#: Rounds counted at once (a node reads the current round and the one before it).
ROUNDS_COUNTED = 4


class AnnouncerCensus:
    """Distinct announcers per round, until the one warning (a node run's driver holds one)."""

    def __init__(
        self, round_demand: int, announce_buckets: int, threshold: int = LARGE_SWARM_ANNOUNCERS
    ) -> None:
        self.round_demand = round_demand
        self.announce_buckets = announce_buckets
        self.threshold = threshold
        # Large-swarm settings on both counts: nothing to warn about, nothing counted.
        self.done = round_demand > 0 and announce_buckets > 1
        self._announcers: dict[int, set[str]] = {}

    def count(self, events: Iterable[Announced]) -> None:
        """Count the announcers of these records (the ones the driver hands to the core)."""
        if self.done:
            return
        for event in events:
            self._announcers.setdefault(event.round, set()).add(event.peer)
        while len(self._announcers) > ROUNDS_COUNTED:
            del self._announcers[min(self._announcers)]

    def warning(self) -> str | None:
        """The warning, the first time a round's announcers pass the threshold; else None."""
        if self.done:
            return None
        over = [(len(peers), r) for r, peers in self._announcers.items() if len(peers) > self.threshold]
        if not over:
            return None
        count, round_index = max(over)
        self.done = True
        self._announcers.clear()
        small = []
        if self.round_demand == 0:
            small.append("swarm.round_demand = 0 pulls every batch announced")
        if self.announce_buckets == 1:
            small.append("swarm.announce_buckets = 1 reads every record of a round from one DHT key")
        return (
            f"this node read the announcement records of {count:,} distinct peers in round {round_index} "
            f"(more than {self.threshold}) with small-swarm settings: {'; '.join(small)}, and both grow "
            "with the swarm. See `swarmnode config large-swarm --nodes N` for this swarm's settings "
            '(announce_buckets must be the same on every node; README, "In a large swarm").'
        )
