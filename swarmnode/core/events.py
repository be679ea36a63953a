"""Names and events shared by the sans-IO cores (gossip, broadcast, activation, spot checks).

Owns: what a peer and a digest are called, and the events that more than one core understands.
Must not: import anything that does I/O, reads a clock or runs an event loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

PeerId: TypeAlias = str
"""A peer's stable name: the base58 libp2p peer id in the node, any unique string in the simulator."""

Digest: TypeAlias = bytes
"""An opaque content digest; the wire layer decides how it is computed (cores only compare them)."""


@dataclass(frozen=True)
class PeerBanned:
    """The admission layer banned ``peer`` until ``until`` (same clock as ``now``).

    Cores stop pulling from a banned peer and stop serving it until then. ``for_signer``: the ban
    is on a signer whose envelope ``peer`` delivered, not on ``peer`` itself; the gossip core then
    lets ``peer``'s pulls in flight run to their end (their items still judged one by one).
    """

    peer: PeerId
    until: float
    for_signer: bool = False
