"""Gossip intake as plain rules: what a node does with its own and its peers' envelopes around admission.

Owns
    The rules between the gossip core and the admission pipeline that the node's driver
    (``driver.GossipDriver``) and both simulator modes (``swarmnode.sim.gossip``,
    ``swarmnode.sim.learning``) share, so that each of them performs I/O (or modelled I/O) only:

    * an own envelope becomes a ``Publish`` (``publication``); the pipeline remembers it as seen
      (``AdmissionPipeline.remember_own``), so handed back by a peer it is a replay;
    * pulled bytes are decoded once (``decode_pulled``): the core gets each envelope's
      ``(digest, bytes)``, admission gets the decoded value (``DecodedEnvelopes``), and bytes that
      are no envelope at all still go to admission, which charges whoever sent them;
    * a verdict becomes the core's events (``verdict_events``, ``admission_events``): an
      ``AdmissionResult`` for the digest (saying whether it refused only that copy of it) and,
      when the rejection left a ban, ``PeerBanned`` for the delivering peer (the core then stops
      pulling from it);
    * admitted groups wait in the bounded ``ExternalPool`` for the next update, a fair share per
      signer, and each signer's groups are tallied (``SenderTallies``, bounded too).

Must not
    Touch sockets, clocks, threads or event loops (``now`` is an argument; tests/core/test_sans_io.py
    holds this module to the protocol cores' rule); judge a payload (admission does) or decide what
    to pull or serve (the core does).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from swarmnode.admit.reasons import STEPS, RejectReason
from swarmnode.admit.verdict import Rejected, Verdict
from swarmnode.core.events import Digest, PeerBanned, PeerId
from swarmnode.gossip.core import AdmissionResult, GossipEvent, Publish
from swarmnode.wire.envelope import Envelope, decode_envelope
from swarmnode.wire.kinds import Kind
from swarmnode.wire.reasons import WireError

if TYPE_CHECKING:
    from swarmnode.train.batch import ScoredGroup
    from swarmnode.wire.messages import RolloutGroup

#: Signers whose admitted groups are tallied one by one; later newcomers only reach the metrics.
MAX_TALLIED_SENDERS = 256

#: Rejections that judge the bytes delivered, not the content their envelope id names: the steps
#: before the signature holds (size, envelope decode, signature). The id does not cover the
#: signature, so a broken copy of an honest envelope has its id (red team F2): the core must still
#: pull the genuine one from another announcer.
COPY_REASONS: frozenset[RejectReason] = frozenset(STEPS["size"] + STEPS["decode"] + STEPS["signature"])
#: Rejections that, without an authenticated signer (``Rejected.sender`` None), are about the
#: delivering peer (banned, or out of CPU budget, at step 0), not about the id either.
DELIVERER_REASONS: frozenset[RejectReason] = frozenset({RejectReason.BANNED, RejectReason.CPU_BUDGET})
#: Rejections for the receiver's own state, shared by every peer (the new-identity budget, a full
#: replay cache): like a full admission queue (``Judged.busy``), not held against the server
#: (red team rt23: draining the new-identity budget got an honest newcomer paused for 10 min).
RECEIVER_STATE_REASONS: frozenset[RejectReason] = frozenset(
    {RejectReason.NEW_IDENTITY_LIMIT, RejectReason.REPLAY_CACHE_FULL}
)


def refuses_only_the_copy(verdict: Rejected) -> bool:
    """Whether ``verdict`` leaves the id open: it judged these bytes or their deliverer, not the
    signed content the id names (a racer that got itself banned must not close the ids of the
    honest envelopes it announced beside their signer)."""
    return verdict.reason in COPY_REASONS or (verdict.sender is None and verdict.reason in DELIVERER_REASONS)


# ---------------------------------------------------------------------------------------------
# Own envelopes.


def publication(envelope: Envelope, data: bytes) -> Publish:
    """The core's event for our own ``envelope``, encoded as ``data`` (what peers will pull)."""
    return Publish(envelope.envelope_id(), len(data))


def envelope_digest(data: bytes) -> bytes:
    """The envelope id a payload must hash to (b"" when it is not an envelope at all)."""
    envelope = decode_envelope(data)
    return b"" if isinstance(envelope, WireError) else envelope.envelope_id()


# ---------------------------------------------------------------------------------------------
# Pulled bytes: decoded once.


class DecodedEnvelopes:
    """The decode of each pulled payload, held from its pull until its ``Admit``.

    Keyed by the very bytes object the core passes through from ``PullSucceeded`` to ``Admit``,
    not by digest: an envelope id does not cover the signature, so two different byte strings
    can share a digest, and admission must judge the decode of exactly the bytes it is given.
    ``clear`` after the core has handled the pull results (what it dropped is never asked for),
    so this holds at most the items of the results handled in one go."""

    def __init__(self) -> None:
        self._by_payload: dict[int, tuple[bytes, Envelope]] = {}

    def put(self, payload: bytes, envelope: Envelope) -> None:
        self._by_payload[id(payload)] = (payload, envelope)  # holding payload keeps its id unique

    def take(self, payload: bytes) -> Envelope | None:
        """The decode of ``payload`` (None if it was never put or already taken)."""
        held = self._by_payload.get(id(payload))
        if held is None or held[0] is not payload:
            return None
        del self._by_payload[id(payload)]
        return held[1]

    def clear(self) -> None:
        self._by_payload.clear()

    def __len__(self) -> int:
        return len(self._by_payload)


#: Why a pulled envelope of another kind than a rollout batch is refused. Announcements list
#: rollout batches only (SPEC.md §1.4), so an honest server never serves another kind; admitted,
#: heartbeats and self-signed weight manifests (544 KiB each) bought their server score and pull
#: credit that then downloaded unusable items free of the budget (red team rt32 F1, F4).
NOT_A_ROLLOUT_BATCH = "not_rollout_batch"


@dataclass(frozen=True)
class Pulled:
    """One pull response, decoded: items for the core, and bytes it refuses before admission."""

    items: tuple[tuple[Digest, bytes], ...]  # (envelope id, the bytes as received), for PullSucceeded
    not_envelopes: tuple[bytes, ...]  # for admission, which charges the peer that sent them
    # Why each refused payload is refused, for PullSucceeded: the WireReason of each of
    # ``not_envelopes``, then NOT_A_ROLLOUT_BATCH for each envelope of another kind.
    unreadable: tuple[str, ...]


def decode_pulled(payloads: Sequence[bytes], decoded: DecodedEnvelopes) -> Pulled:
    """Decode each pulled payload once; its decode waits in ``decoded`` for the ``Admit`` of it.

    A payload that is not an envelope (too large, malformed, ...) has no digest to tie it to a
    request: its reason goes to the core (``PullSucceeded.unreadable``), which holds it against
    the server, and its bytes to admission, to charge the peer that sent them, as for any other
    bytes from a peer. An envelope of another kind than a rollout batch goes to the core alone
    (``NOT_A_ROLLOUT_BATCH``): never admitted, so it earns nothing."""
    items: list[tuple[Digest, bytes]] = []
    refused: list[bytes] = []
    reasons: list[str] = []
    other_kinds = 0
    for payload in payloads:
        envelope = decode_envelope(payload)
        if isinstance(envelope, WireError):
            refused.append(payload)
            reasons.append(envelope.reason.value)
            continue
        if envelope.kind is not Kind.ROLLOUT_BATCH:
            other_kinds += 1
            continue
        decoded.put(payload, envelope)
        items.append((envelope.envelope_id(), payload))
    return Pulled(tuple(items), tuple(refused), (*reasons, *[NOT_A_ROLLOUT_BATCH] * other_kinds))


# ---------------------------------------------------------------------------------------------
# Verdicts.


def admission_events(
    peer: PeerId,
    digest: Digest | None,
    *,
    accepted: bool,
    reason: str,
    banned_until: float | None,
    copy_refused: bool = False,
    charged: bool = True,
    busy: bool = False,
    overloaded: bool = False,
    ban_on_signer: bool = False,
    sent_at: float | None = None,
    stale_at: float | None = None,
    signer: PeerId | None = None,
) -> list[GossipEvent]:
    """The core's events for a verdict on an item ``peer`` delivered (``digest`` None: bytes that
    were no envelope, which the core never asked to admit). A rejection that left a ban (on the
    signer or the delivering peer it charged, or whom a ``banned`` verdict names) stops the core
    pulling from the delivering peer until then. ``copy_refused``: the rejection judged only these
    bytes or their deliverer (``refuses_only_the_copy``), so the core keeps the digest open for
    another announcer. ``charged``: admission lowered someone's score for it (False: a reason
    that depends on the receiver, which the core does not hold against the server either).
    ``busy``: refused unjudged because this node's admission queue was full (``Judged.busy``);
    ``overloaded``: full with every peer's work, not the deliverer's share (``Judged.overloaded``).
    ``ban_on_signer``: the ban is the signer's, not the delivering peer's: the core stops pulling
    from it, but its pulls in flight run to their end (``PeerBanned.for_signer``). In the node a
    peer is its libp2p id and a signer its Ed25519 id, which the node does not tie together, so
    only a ban charged to the transport peer itself cancels its pulls (red team rt50 F3: the
    extra is one burst of pulls already granted, as a shun for rejections allows). Cancelled, a
    pull split in two had the items of its second half never judged, the transport peer's bad
    signature among them (``tests/swarm/test_adversary.py``, about one run in three)."""
    events: list[GossipEvent] = []
    if digest is not None:
        events.append(
            AdmissionResult(
                peer,
                digest,
                accepted,
                reason,
                copy_refused=copy_refused,
                charged=charged,
                busy=busy,
                overloaded=busy and overloaded,
                sent_at=sent_at if accepted else None,
                stale_at=stale_at if accepted else None,
                signer=signer if accepted else None,
            )
        )
    if not accepted and banned_until is not None:
        events.append(PeerBanned(peer, banned_until, for_signer=ban_on_signer))
    return events


def verdict_events(
    peer: PeerId,
    digest: Digest | None,
    verdict: Verdict,
    banned_until: float | None,
    *,
    busy: bool = False,
    overloaded: bool = False,
    max_age_s: float | None = None,
) -> list[GossipEvent]:
    """``admission_events`` for a pipeline verdict (``banned_until``: its ``ban_left_by``; ``busy``,
    ``overloaded``: ``Judged``'s, refused because our admission queue was full; ``max_age_s``:
    admission's, so that an accepted envelope's result says when it turns too old). A reason in
    ``RECEIVER_STATE_REASONS`` is reported busy too, never overloaded: a proven peer serving
    envelopes of fresh signers drains the new-identity budget itself (red team rt29 F1)."""
    if isinstance(verdict, Rejected):
        overloaded = overloaded and verdict.reason not in RECEIVER_STATE_REASONS
        busy = busy or verdict.reason in RECEIVER_STATE_REASONS
        return admission_events(
            peer,
            digest,
            accepted=False,
            reason=verdict.reason.value,
            banned_until=banned_until,
            copy_refused=not busy and refuses_only_the_copy(verdict),
            charged=verdict.charged is not None,
            busy=busy,
            overloaded=overloaded,
            # ``ban_left_by`` names the charged party, else the signer, else the deliverer.
            ban_on_signer=(verdict.charged or verdict.sender or peer) != peer,
        )
    sent_at = verdict.envelope.sent_at_ms / 1000.0
    stale_at = None if max_age_s is None else sent_at + max_age_s
    return admission_events(
        peer,
        digest,
        accepted=True,
        reason="accepted",
        banned_until=None,
        sent_at=sent_at,
        stale_at=stale_at,
        signer=verdict.sender,
    )


# ---------------------------------------------------------------------------------------------
# Admitted groups.


@dataclass
class PoolEntry:
    group: ScoredGroup
    arrived_round: int


class ExternalPool:
    """Admitted external groups waiting to be trained on; bounded, a fair share per signer.

    Full, it drops the oldest group of the signer (``ScoredGroup.source``) holding the most, so
    one signer's flood evicts its own groups, never another's below its share (red team F3: one
    fresh identity's 512 admitted groups evicted every honest one). With one signer that is
    plain oldest-first. Each operation is O(1): signers are bucketed by how many groups they hold,
    and the largest holding changes by at most one per operation."""

    def __init__(self, capacity: int = 512, keep_rounds: int = 2) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.keep_rounds = keep_rounds
        self._entries: dict[int, PoolEntry] = {}  # arrival number -> entry, in arrival order
        self._next = 0
        self._by_signer: dict[str, deque[int]] = {}  # each signer's arrival numbers, oldest first
        self._holding: dict[int, dict[str, None]] = {}  # group count -> signers holding that many
        self._most = 0  # the largest group count of any signer

    def add(self, group: ScoredGroup, round_index: int) -> None:
        signer = group.source
        arrivals = self._by_signer.setdefault(signer, deque())
        self._move(signer, len(arrivals), len(arrivals) + 1)
        arrivals.append(self._next)
        self._entries[self._next] = PoolEntry(group, round_index)
        self._next += 1
        if len(self._entries) > self.capacity:
            self._evict_from_largest()

    def take_all(self, current_round: int) -> list[ScoredGroup]:
        """Every fresh group (arrived within ``keep_rounds``); each is handed out once."""
        fresh = [
            e.group for e in self._entries.values() if current_round - e.arrived_round <= self.keep_rounds
        ]
        self._entries.clear()
        self._by_signer.clear()
        self._holding.clear()
        self._most = 0
        return fresh

    def _evict_from_largest(self) -> None:
        signer = next(iter(self._holding[self._most]))  # of the largest holders, the first to get there
        arrivals = self._by_signer[signer]
        del self._entries[arrivals.popleft()]
        self._move(signer, len(arrivals) + 1, len(arrivals))
        if not arrivals:
            del self._by_signer[signer]

    def _move(self, signer: str, held: int, holds: int) -> None:
        """``signer`` went from holding ``held`` groups to ``holds`` (one more or one fewer)."""
        if held:
            bucket = self._holding[held]
            del bucket[signer]
            if not bucket:
                del self._holding[held]
        if holds:
            self._holding.setdefault(holds, {})[signer] = None
        if holds > self._most:
            self._most = holds
        elif held == self._most and held not in self._holding:
            self._most = holds

    def __len__(self) -> int:
        return len(self._entries)


@dataclass
class SenderTally:
    """What one signer's groups brought: admitted groups and their rewards as we scored them and as
    it claimed, its batches refused after its signature checked, groups trained on, last arrival."""

    groups: int = 0
    completions: int = 0
    reward_sum: float = 0.0  # our verifier's rewards: the ones training uses
    claimed_reward_sum: float = 0.0  # the sender's own claims: informational, never used
    refused_batches: int = 0  # its signed batches refused after the signature checked
    used: int = 0  # its admitted groups the sharing rule trained on
    replayed: int = 0  # its remembered answers ``replay`` trained on again (one row each)
    last_seen: float = 0.0  # when its last batch was judged (0: never)


class SenderTallies:
    """One ``SenderTally`` per signer, for at most ``limit`` signers (a signer is tallied once one
    of its groups is admitted: refusals alone never take a place). Full, a newcomer takes the place
    of the signer with the fewest groups admitted (the longest unseen among equals): red team, the
    first 256 signers used to keep their places for good, so 256 throwaway identities with one group
    each left every later signer, an attacker's active one included, out of the operator's view."""

    def __init__(self, limit: int = MAX_TALLIED_SENDERS) -> None:
        self.limit = limit
        self._senders: dict[str, SenderTally] = {}

    def add(self, sender: str, rewards: Sequence[float], group: RolloutGroup, now: float = 0.0) -> None:
        tally = self._senders.get(sender)
        if tally is None:
            if len(self._senders) >= self.limit:  # bounded: O(limit) per newcomer, newcomers are rate-limited
                least = min(self._senders.items(), key=lambda item: (item[1].groups, item[1].last_seen))[0]
                del self._senders[least]
            tally = self._senders[sender] = SenderTally()
        tally.groups += 1
        tally.completions += len(rewards)
        tally.reward_sum += sum(rewards)
        tally.claimed_reward_sum += sum(c.claimed_reward_informational for c in group.completions)
        tally.last_seen = max(tally.last_seen, now)

    def refused(self, sender: str, now: float) -> None:
        """A batch ``sender`` signed (signature checked) was refused; counted if it is tallied."""
        tally = self._senders.get(sender)
        if tally is not None:
            tally.refused_batches += 1
            tally.last_seen = max(tally.last_seen, now)

    def used(self, by_sender: Mapping[str, int], replayed: Mapping[str, int]) -> None:
        """Groups the sharing rule trained on this round, and remembered answers it replayed, per
        signer (signers not tallied, ours among them, are not counted)."""
        for sender, count in by_sender.items():
            tally = self._senders.get(sender)
            if tally is not None:
                tally.used += count
        for sender, count in replayed.items():
            tally = self._senders.get(sender)
            if tally is not None:
                tally.replayed += count

    def as_dict(self) -> dict[str, dict[str, float]]:
        """Per signer (Ed25519 peer id): its ``SenderTally`` as a dict."""
        return {sender: asdict(tally) for sender, tally in self._senders.items()}


__all__ = [
    "COPY_REASONS",
    "DELIVERER_REASONS",
    "MAX_TALLIED_SENDERS",
    "NOT_A_ROLLOUT_BATCH",
    "DecodedEnvelopes",
    "ExternalPool",
    "PoolEntry",
    "Pulled",
    "SenderTallies",
    "SenderTally",
    "admission_events",
    "decode_pulled",
    "envelope_digest",
    "publication",
    "refuses_only_the_copy",
    "verdict_events",
]
