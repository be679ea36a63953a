"""Errors raised by the network runtime.

Owns: the exception types of ``swarmnode.net`` and the reason enum of a failed
call to a peer. Must not: decide what to do about a failure (retry, score,
ban): callers read ``PeerCallError.reason`` and decide.
"""

from __future__ import annotations

import enum

from swarmnode.errors import SwarmError


class NetError(SwarmError):
    """The local network runtime cannot do what was asked (not started, bad config, p2pd failed)."""


class CallFailure(enum.Enum):
    """Why a call to a peer failed; a value a caller can count and score by."""

    TIMEOUT = "timeout"  # no complete answer within the call's timeout
    UNREACHABLE = "unreachable"  # no stream/connection could be opened to the peer
    REMOTE_ERROR = "remote_error"  # the peer answered with an error (no handler, handler failed, refused)
    TOO_LARGE = "too_large"  # a request or response exceeded its size limit
    PROTOCOL = "protocol"  # the peer broke the framing (bad frame kind, oversize chunk)
    # The stream ended before the answer did: the peer closed it early, or the network lost it (a
    # reset connection reads as a clean end). Not PROTOCOL: an honest peer's answers end so when
    # its connection drops, and the gossip driver charged each as broken framing (two demo nodes
    # stopped pulling from each other for 10 minutes after three).
    CLOSED = "closed"


class PeerCallError(NetError):
    """A call to a peer failed; ``reason`` says how, ``peer_id`` and ``name`` say which call."""

    def __init__(
        self, reason: CallFailure, peer_id: str, name: str, detail: str, *, received: int = 0
    ) -> None:
        super().__init__(f"call {name!r} to peer {peer_id} failed ({reason.value}): {detail}")
        self.reason = reason
        self.peer_id = peer_id
        self.name = name
        self.detail = detail
        self.received = received  # bytes of the answer that had arrived (whole frames)
