"""Sans-IO protocol cores: plain state machines driven by events and a ``now``, returning actions.

Owns: protocol logic: gossip, weight broadcast, worker activation, bounded staleness, spot-check
policy, swarm rounds, and the bounded building blocks they share (``limits``).
Must not: import sockets, clocks, threads or event loops. The node (asyncio + hivemind) and the
simulator (trio + virtual clock) drive the same cores; see each module's "Driving it" section.
"""

from swarmnode.core.events import Digest, PeerBanned, PeerId
from swarmnode.core.gossip import (
    AdmissionResult,
    Admit,
    Announce,
    Announced,
    CancelPull,
    GossipAction,
    GossipConfig,
    GossipCore,
    GossipEvent,
    GossipSizes,
    GossipStats,
    Publish,
    Pull,
    PullFailed,
    PullRequest,
    PullSucceeded,
    ReadAnnouncements,
    Retire,
    Serve,
)
from swarmnode.core.rounds import round_at, round_start

__all__ = [
    "AdmissionResult",
    "Admit",
    "Announce",
    "Announced",
    "CancelPull",
    "Digest",
    "GossipAction",
    "GossipConfig",
    "GossipCore",
    "GossipEvent",
    "GossipSizes",
    "GossipStats",
    "PeerBanned",
    "PeerId",
    "Publish",
    "Pull",
    "PullFailed",
    "PullRequest",
    "PullSucceeded",
    "ReadAnnouncements",
    "Retire",
    "Serve",
    "round_at",
    "round_start",
]
