"""Gossip of rollouts: announce what you have, pull what you need, admit it, pool it for training.

``core``: the sans-IO state machine (what to announce, pull, serve; timeouts and retries).
``driver``: its I/O over hivemind (DHT announcement records, the pull stream) and admission of
every pulled envelope; the node's driver and the simulator drive the same core.
"""

from swarmnode.gossip.core import (
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

__all__ = [
    "AdmissionResult",
    "Admit",
    "Announce",
    "Announced",
    "CancelPull",
    "GossipAction",
    "GossipConfig",
    "GossipCore",
    "GossipEvent",
    "GossipSizes",
    "GossipStats",
    "Publish",
    "Pull",
    "PullFailed",
    "PullRequest",
    "PullSucceeded",
    "ReadAnnouncements",
    "Retire",
    "Serve",
]
