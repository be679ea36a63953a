"""Sans-IO building blocks every protocol core shares: events and ids, swarm rounds, token buckets.

Owns: ``events`` (ids and the events several cores use), ``rounds`` (the swarm's round clock as a
pure function of time), ``limits`` (the one token bucket). Must not: import sockets, clocks,
threads or event loops. The protocol cores themselves live with their drivers, one folder per
protocol: ``swarmnode.gossip``, ``swarmnode.broadcast``, ``swarmnode.activation``.
"""

from swarmnode.core.events import Digest, PeerBanned, PeerId
from swarmnode.core.rounds import round_at, round_start

__all__ = ["Digest", "PeerBanned", "PeerId", "round_at", "round_start"]
