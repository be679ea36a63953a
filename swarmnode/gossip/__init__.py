"""Gossip of rollouts: announce what you have, pull what you need, admit it, pool it for training.

``core``: the sans-IO state machine (what to announce, pull, serve; timeouts and retries).
``intake``: the sans-IO rules around admission (own envelopes, decoding pulled bytes once, what a
verdict means to the core, the external pool); ``records``: when and with which expiry an
announcement record is stored again; ``census``: the distinct announcers of a round, counted for
the one warning a node gives when they outgrow small-swarm settings.
``driver``: their I/O over hivemind (DHT announcement records, the pull stream, the admission
thread); the node's driver and both simulator modes drive the same core and the same rules.
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
