"""The admission pipeline: every byte from a peer passes here before anything uses it.

Owns: the order of the checks, per-reason counters, and the calls that lower a
peer's score. Must not: read a clock (``now`` is an argument), open sockets,
raise on any input (every refusal is a ``Rejected`` value), or use a reward a
peer claims.

Steps, in order (protocol/SPEC.md "Admission"; ``reasons.STEPS`` names them):

0. the transport peer (``via``) is not banned
1. size: raw bytes <= ``MAX_ENVELOPE_BYTES``
2. decode: field scan, then the envelope parses; version, kind, key/signature
   lengths, payload cap; then, before anything it would cost its signer, an
   envelope id already seen is a ``replay`` (step 6's id check, done early) and a
   ``sent_at`` older than ``max_age`` is ``too_old`` (step 7's, done early)
3. signature over the exact received bytes (``wire.envelope`` signing rule)
4. sender: not banned, on the allowlist if there is one, a slot for a new
   identity if we have never seen it, ``1 + payload bytes // 64 KiB`` tokens
   from the delivering peer's rate bucket (the signer's when no ``via`` is
   known), and CPU budget left (the delivering peer's is checked
   at step 0 too; ``charge_cpu`` spends both after the fact)
5. payload: decodes under the kind's schema and limits; per-kind checks
   (a peer record names its signer; a manifest's publisher signature holds;
   a control message is addressed to us)
6. replay: the envelope id, and each rollout group's content from this signer,
   not seen within the freshness window; the signer and the delivering peer
   each within their quota of the replay cache
7. freshness: ``sent_at`` within [now - max_age, now + max_future]; each
   group's policy version within ``max_policy_lag`` of the version we know for
   its model (where we know one)
8. re-derivation: each group's task is one we accept, regenerates, and its
   prompt equals the group's prompt exactly
9. re-scoring: each completion rendered as this node will train it (``render``:
   our tokenization, refused if longer than we generate) and that text scored
   by the verification boundary (``score_groups``: sandboxed workers in a node);
   claimed rewards are never read

The payload is decoded after the signature check (DESIGN.md's order:
signature, schema, replay, ...): a forged envelope never reaches the payload
parser, and a malformed payload is provably the signer's fault.

A rollout batch is admitted whole or not at all: one bad group rejects the
envelope (the signer vouched for every group in it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

from swarmnode.admit.limits import BucketMap, ReplayCache, TokenBucket
from swarmnode.admit.peers import BanLedger, PeerBook, ScoreRule
from swarmnode.admit.reasons import CHARGE, DEFAULT_PENALTIES, Charge, RejectReason
from swarmnode.admit.verdict import Accepted, AdmittedGroup, Rejected, TrainedText, Verdict
from swarmnode.errors import TaskError
from swarmnode.identity import KeyAllowlist
from swarmnode.tasks import Task, TaskId, TaskMixture, UnsafeScorerError, check_family
from swarmnode.tasks import regenerate as _regenerate
from swarmnode.verify.outcome import GroupScorer, Scored, VerifierReason, score_in_process
from swarmnode.wire.envelope import Envelope, decode_envelope, verify_manifest
from swarmnode.wire.limits import MAX_ENVELOPE_BYTES
from swarmnode.wire.messages import (
    Activate,
    Deactivate,
    Message,
    PeerRecord,
    RolloutBatch,
    WeightManifest,
    decode_payload,
)
from swarmnode.wire.reasons import WireError, WireReason, clip

#: (dataset, canonical config, prompt format): a family of tasks a node accepts rollouts for.
TaskFamily: TypeAlias = tuple[str, str, str]

_WIRE_TO_REJECT = {
    WireReason.TOO_LARGE: RejectReason.TOO_LARGE,
    WireReason.MALFORMED: RejectReason.MALFORMED,
    WireReason.UNSUPPORTED_VERSION: RejectReason.UNSUPPORTED_VERSION,
    WireReason.UNKNOWN_KIND: RejectReason.UNKNOWN_KIND,
    WireReason.INVALID_PAYLOAD: RejectReason.INVALID_PAYLOAD,
    WireReason.LIMIT_EXCEEDED: RejectReason.LIMIT_EXCEEDED,
}


def task_families(mixture: TaskMixture) -> frozenset[TaskFamily]:
    """The task families of a mixture: what a SAPO node accepts from its swarm."""
    families = set()
    for spec in mixture.specs:
        tid = spec.task_id(0, 0)
        families.add((tid.dataset, tid.config, tid.prompt_format))
    return frozenset(families)


@dataclass(frozen=True)
class AdmissionConfig:
    max_age_s: float = 300.0  # oldest sent_at accepted
    max_future_s: float = 30.0  # clock skew tolerated the other way
    max_policy_lag: int = 8  # versions behind the one we know (prime-rl's max_off_policy_steps)
    new_identities: int = 64  # never-seen signers admitted per window ...
    new_identity_window_s: float = 60.0  # ... of this many seconds (token bucket)
    replay_capacity: int = 200_000  # digests remembered (~150 bytes each)
    #: Live digests one signer, and one delivering peer, may hold: an honest node publishing 16
    #: groups every 5 s holds ~1,000 over the 300-s window; one flooder at 13 envelopes/s reached
    #: the old global cap in ~4 min.
    replay_quota: int = 20_000
    #: Admission CPU (our thread's and the verifier's, in seconds) each signer and each delivering
    #: peer may spend per second, and the most it may spend at once. An honest 16-group batch costs
    #: ~2 ms; a valid 64 x 64 batch ~75 ms.
    cpu_rate: float = 0.1
    cpu_burst: float = 2.0
    #: What a party never seen before may spend at once (its bucket then fills at cpu_rate):
    #: cheap identities must not each bring a whole burst.
    cpu_initial: float = 0.25
    bytes_per_token: int = 64 * 1024  # an envelope costs 1 + payload bytes // this from its sender's bucket
    max_tracked_peers: int = 10_000
    score: ScoreRule = field(default_factory=ScoreRule)
    penalties: Mapping[RejectReason, float] = field(default_factory=lambda: dict(DEFAULT_PENALTIES))
    allowlist: KeyAllowlist | None = None  # private swarm: only these signers
    trusted_publishers: frozenset[bytes] | None = None  # weight manifest keys; None: any
    local_peer_id: str | None = None  # to check Activate/Deactivate recipients
    #: Task families accepted (``task_families(mixture)``), or None for any task that
    #: regenerates. No default on purpose: a node must choose. Regenerating generator
    #: configs chosen by strangers costs what they make it cost (reasoning-gym's arc_1d
    #: with size 10**6 takes ~3 s per task here), so None is for local tools only.
    allowed_tasks: frozenset[TaskFamily] | None = field(kw_only=True)
    #: Our own ``Policy.system_prompt_sha256``: groups must carry the same (empty: bare question
    #: prompts; else the id of the system turn our chat prompts carry), SPEC.md 1.3 and step 8.
    system_prompt_sha256: bytes = field(default=b"", kw_only=True)

    def __post_init__(self) -> None:
        missing = set(RejectReason) - set(self.penalties)
        if missing:
            raise ValueError(f"admission penalties miss {sorted(missing)}")


def _prompt_kind(system_prompt_sha256: bytes) -> str:
    if not system_prompt_sha256:
        return "bare question prompts"
    return f"chat prompts of system prompt {system_prompt_sha256.hex()[:16]}"


class AdmissionPipeline:
    """Sans-IO admission: ``admit(bytes, now) -> Verdict``; state is counters, scores, bans, digests.

    ``ledger`` (``swarmnode.store.Ledger`` in the node) persists bans and
    rejection counts; bans active at ``now`` are loaded from it here. Ledger
    errors (a failing disk) propagate: they are the node's problem, not a peer's.
    ``regenerate`` defaults to ``swarmnode.tasks``'; ``score_groups`` to the
    in-process safe scorers (a node passes its ``VerifierPool.score``).
    ``render(texts)`` gives, per received completion, what this node will train
    (its own tokenization and the text it decodes to) or the reason it cannot train it
    (``completion_too_long``, ``completion_untrainable``); scoring that text, not
    the received one, makes the reward belong to exactly what is trained. None:
    score the text as received (tools, tests, the simulator).
    """

    def __init__(
        self,
        config: AdmissionConfig,
        *,
        now: float,
        ledger: BanLedger | None = None,
        regenerate: Callable[[TaskId], Task] = _regenerate,
        score_groups: GroupScorer = score_in_process,
        render: Callable[[Sequence[str]], Sequence[TrainedText | RejectReason]] | None = None,
    ) -> None:
        self.config = config
        self.peers = PeerBook(self.config.score, self.config.max_tracked_peers, ledger, now)
        self.replay = ReplayCache(self.config.replay_capacity, self.config.replay_quota)
        self.cpu = BucketMap(
            self.config.cpu_rate,
            self.config.cpu_burst,
            self.config.max_tracked_peers,
            initial=min(self.config.cpu_initial, self.config.cpu_burst),
        )
        self.last_scoring_cpu_s = 0.0  # what the verifier spent on the last admit (for charge_cpu)
        self.counters: Counter[str] = Counter()
        self._new_identities = TokenBucket(
            self.config.new_identities / self.config.new_identity_window_s,
            float(self.config.new_identities),
            updated=now,
        )
        self._versions: dict[str, int] = {}
        self._regenerate = regenerate
        self._score_groups = score_groups
        self._render = render

    # -- inputs besides bytes ------------------------------------------------------------------

    def set_policy_version(self, model_id: str, version: int) -> None:
        """The current version of ``model_id`` (e.g. our own policy, as a learner); enables staleness."""
        self._versions[model_id] = version

    def penalize(self, peer_id: str, reason: RejectReason, now: float) -> bool:
        """Charge ``peer_id`` for misbehaviour seen elsewhere (a chunk failing its hash); True if banned."""
        self.counters[reason.value] += 1
        return self.peers.penalize(peer_id, self.config.penalties[reason], reason.value, now)

    def banned_until(self, peer_id: str, now: float) -> float | None:
        return self.peers.banned(peer_id, now)

    def ban_left_by(self, verdict: Verdict, via: str | None, now: float) -> float | None:
        """Until when a rejection left the party it concerns banned: the one it charged, else its
        signer, else the delivering peer ``via`` (a ``banned`` verdict charges whom it names); None
        for an acceptance or no ban. Ask right after ``admit``: asked later, a ban earned by a later
        envelope would show here too."""
        if not isinstance(verdict, Rejected):
            return None
        suspect = verdict.charged or verdict.sender or via
        return None if suspect is None else self.peers.banned(suspect, now)

    def remember_own(self, envelope: Envelope, now: float) -> bool:
        """Remember our own ``envelope`` (just published) as seen, for as long as freshness would
        accept it: handed back to us by a peer it is then a replay. Admission remembers only what
        it admitted, so without this it would admit our own rollouts as a peer's once the gossip
        core has forgotten the digest (measured: tests/swarm/test_adversary.py). Owned by nobody:
        it counts against no peer's quota. False (not remembered) when the cache has no room."""
        if not self.replay.room(now, 1):
            return False
        self.replay.add(envelope.envelope_id(), envelope.sent_at_ms / 1000.0 + self.config.max_age_s)
        return True

    def charge_cpu(self, signer: str | None, via: str | None, seconds: float, now: float) -> None:
        """Spend ``seconds`` of admission CPU from the signer's and the delivering peer's budgets."""
        for party in dict.fromkeys(p for p in (signer, via) if p is not None):
            self.cpu.spend(party, now, seconds)

    def counts(self) -> dict[str, int]:
        """Verdicts so far: ``accepted`` and one entry per rejection reason seen."""
        return dict(self.counters)

    # -- the pipeline ------------------------------------------------------------------------

    def _reject(
        self,
        reason: RejectReason,
        detail: str,
        now: float,
        *,
        signer: str | None,
        via: str | None,
        charge: Charge | None = None,
    ) -> Rejected:
        self.counters[reason.value] += 1
        charge = CHARGE[reason] if charge is None else charge
        target = signer if charge is Charge.SIGNER else via if charge is Charge.VIA else None
        if target is not None:
            self.peers.penalize(target, self.config.penalties[reason], reason.value, now)
        return Rejected(reason, detail, sender=signer, charged=target)

    def _wire(self, error: WireError, now: float, *, signer: str | None, via: str | None) -> Rejected:
        return self._reject(_WIRE_TO_REJECT[error.reason], error.detail, now, signer=signer, via=via)

    def admit(
        self,
        data: bytes,
        now: float,
        *,
        via: str | None = None,
        solicited: bool = False,
        envelope: Envelope | None = None,
        message: Message | None = None,
    ) -> Verdict:
        """Run ``data`` (one envelope as received) through every step; see the module docstring.

        ``via``: the transport-level id of the peer that delivered the bytes, when
        the driver knows it; it is charged for failures the signer cannot be blamed for.
        ``solicited``: the driver asked for these bytes (a pull by envelope id, a chunk
        it requested) and paces those requests itself, so the sender's rate bucket is
        not charged; every other check applies. Never set it on a peer's say-so.
        ``envelope``: ``decode_envelope(data)``, when the caller decoded these very bytes
        already (the gossip driver does, for their digest): it is used instead of decoding
        them again (STYLE.md: decode once, then pass the value along). The size limit is
        still applied to ``data``, at the same step; every later step is the same.
        ``message``: ``decode_payload(envelope.kind, envelope.payload)``, when the caller decoded
        the payload of that ``envelope`` already (the data plane does, for its handlers); used at
        step 5 instead of decoding it again, and only together with ``envelope``. A signature the
        caller verified is not checked twice either: ``Envelope.verify`` remembers its answer.
        """
        # 0. transport peer
        if via is not None and (until := self.peers.banned(via, now)) is not None:
            return self._reject(
                RejectReason.BANNED,
                f"delivering peer {via} banned until {until:.0f}",
                now,
                signer=None,
                via=via,
            )
        self.last_scoring_cpu_s = 0.0
        if via is not None and not self.cpu.has(via, now):
            return self._reject(
                RejectReason.CPU_BUDGET,
                f"delivering peer {via} has spent its CPU budget",
                now,
                signer=None,
                via=via,
            )
        # 1-2. size and envelope decode
        if message is not None and envelope is None:
            raise ValueError("admit: a decoded message comes only with the envelope it was decoded from")
        decoded = _decoded(data, envelope)
        if isinstance(decoded, WireError):
            return self._wire(decoded, now, signer=None, via=via)
        envelope = decoded
        # 2b. an envelope id already seen: refused by its id alone, before anything that costs the
        # signer (signature check, rate tokens, CPU budget). The id hashes the key and the signed
        # bytes, and ids are remembered only once they verified, so it names the signer's own
        # content: re-sending it is the deliverer's doing (red team: 100 re-sends of one valid
        # envelope by free identities spent the signer's rate bucket and got it banned).
        envelope_id = envelope.envelope_id()
        if self.replay.seen(envelope_id, now):
            # Nobody is charged when the signer delivers its own envelope after another peer relayed
            # it first: a race it cannot see (red team: 34 such races banned an honest signer). A
            # pulled replay is still the deliverer's: a gossip core pulls an id once, and an honest
            # relay lists an id only in its signed round, which a reader stops reading before it
            # forgets the id (SPEC 1.4, Relaying): a second copy comes from someone who chose to.
            race = via is not None and via == envelope.sender_id
            return self._reject(
                RejectReason.REPLAY,
                f"envelope {envelope_id.hex()[:16]} already seen",
                now,
                signer=None,
                via=via,
                charge=Charge.NOBODY if race else None,
            )
        # 2c. too old: decided from the header alone, so before anything it would cost its signer
        # (red team: re-sends of one expired envelope spent the signer's rate tokens and CPU budget,
        # then banned it). Only a deliverer can make an old envelope arrive: charged to it.
        if envelope.sent_at_ms < now * 1000.0 - self.config.max_age_s * 1000.0:
            return self._reject(
                RejectReason.TOO_OLD,
                f"sent {now - envelope.sent_at_ms / 1000.0:.1f} s ago; window {self.config.max_age_s} s",
                now,
                signer=None,
                via=via,
            )
        # 3. signature
        if not envelope.verify():
            return self._reject(
                RejectReason.BAD_SIGNATURE,
                f"{envelope.kind.label} signature does not verify",
                now,
                signer=None,
                via=via,
            )
        signer = envelope.sender_id
        # 4. sender
        if self.config.local_peer_id is not None and signer == self.config.local_peer_id:
            # Our own envelope handed back (also one sent before a restart): a replay by whoever
            # delivered it, never "rollouts from a peer".
            return self._reject(
                RejectReason.REPLAY, "envelope signed by this node itself", now, signer=None, via=via
            )
        rejected = self._check_sender(envelope, signer, now, solicited, via)
        if rejected is not None:
            return rejected
        # 5. payload
        decoded_payload = decode_payload(envelope.kind, envelope.payload) if message is None else message
        if isinstance(decoded_payload, WireError):
            return self._wire(decoded_payload, now, signer=signer, via=via)
        message = decoded_payload
        rejected = self._check_kind(message, signer, now, via)
        if rejected is not None:
            return rejected
        # 6. replay / duplicate (the envelope id was looked up at 2b)
        group_keys: list[bytes] = []
        if isinstance(message, RolloutBatch):
            for i, group in enumerate(message.groups):
                key = envelope.sender_key + group.content_digest()
                if key in group_keys or self.replay.seen(key, now):
                    return self._reject(
                        RejectReason.DUPLICATE,
                        f"groups[{i}] ({group.task.key()}) already received",
                        now,
                        signer=signer,
                        via=via,
                    )
                group_keys.append(key)
        owners = tuple(dict.fromkeys(p for p in (signer, via) if p is not None))
        self.replay.purge(now)
        over = self.replay.over_quota(owners, 1 + len(group_keys))
        if over is not None:
            return self._reject(
                RejectReason.REPLAY_QUOTA_SIGNER if over == signer else RejectReason.REPLAY_QUOTA_VIA,
                f"{over} already holds {self.replay.held(over)} of the replay cache's digests "
                f"(quota {self.replay.quota})",
                now,
                signer=signer,
                via=via,
            )
        # One millisecond past the last instant freshness accepts it (sent_at + max_age, inclusive),
        # so the id is never forgotten while the envelope could still be admitted (red team: at
        # exactly that instant a replay was admitted twice).
        expiry = envelope.sent_at_ms / 1000.0 + self.config.max_age_s + 0.001
        if expiry <= self.replay.forgotten_until(signer, now):
            return self._reject(
                RejectReason.REPLAY,
                f"envelope {envelope_id.hex()[:16]} is no newer than digests of {signer} "
                "forgotten to make room",
                now,
                signer=signer,
                via=via,
            )
        # 7. freshness
        rejected = self._check_freshness(envelope, signer, now, via)
        if rejected is not None:
            return rejected
        # Room is made only now: an envelope that fails freshness must not make us forget anything.
        if not self.replay.make_room(now, 1 + len(group_keys)):
            return self._reject(
                RejectReason.REPLAY_CACHE_FULL,
                f"{len(self.replay)} digests live",
                now,
                signer=signer,
                via=via,
            )
        # Remembered only once fresh: a far-future sent_at must not pin a digest for long.
        for key in (envelope_id, *group_keys):
            self.replay.add(key, expiry, owners)
        # 7b. policy lag, after the id is remembered: the verdict depends on this receiver's versions,
        # so it charges nobody, and a re-send is then a replay at step 2b, charged to the deliverer.
        # The signer pays the CPU of judging each envelope it signed once (red team: a signer's stale
        # envelopes re-judged through fresh transport ids cost 16-25 ms each, charged to nobody).
        rejected = self._check_policy_lag(message, signer, now, via)
        if rejected is not None:
            return rejected
        # 8-9. re-derivation and re-scoring
        groups: tuple[AdmittedGroup, ...] = ()
        if isinstance(message, RolloutBatch):
            admitted = self._rederive_and_rescore(message, signer, now, via)
            if isinstance(admitted, Rejected):
                return admitted
            groups = admitted
        self.counters["accepted"] += 1
        self.peers.reward(signer, now)
        return Accepted(envelope=envelope, sender=signer, message=message, groups=groups)

    def _check_sender(
        self, envelope: Envelope, signer: str, now: float, solicited: bool, via: str | None
    ) -> Rejected | None:
        until = self.peers.banned(signer, now)
        if until is not None:
            return self._reject(
                RejectReason.BANNED, f"sender {signer} banned until {until:.0f}", now, signer=signer, via=None
            )
        allowlist = self.config.allowlist
        if allowlist is not None and not allowlist.allows(envelope.sender_key):
            return self._reject(
                RejectReason.NOT_ALLOWLISTED,
                f"sender {signer} is not on the allowlist",
                now,
                signer=signer,
                via=None,
            )
        if not self.peers.known(signer):
            if not self._new_identities.take(now):
                return self._reject(
                    RejectReason.NEW_IDENTITY_LIMIT,
                    f"more than {self.config.new_identities} new senders "
                    f"in {self.config.new_identity_window_s:.0f} s",
                    now,
                    signer=signer,
                    via=None,
                )
            # Tracked from its first slot on: otherwise each re-send of an envelope that charges its
            # signer nothing would take another slot (red team: a third party re-sending one honest
            # signer's stale envelope used up every new identity's slot).
            self.peers.state(signer, now)
        if not self.cpu.has(signer, now):
            return self._reject(
                RejectReason.CPU_BUDGET,
                f"sender {signer} has spent its CPU budget",
                now,
                signer=signer,
                via=None,
            )
        # Large envelopes cost more tokens: parsing cost grows with size (~70 ms for 1 MiB of tiny fields).
        # The tokens are the deliverer's when it is known: the party pushing bytes at us is the one to
        # slow down, and a third party re-sending a signer's envelopes must not spend the signer's
        # tokens (red team: that got an honest signer banned for rate_limited).
        cost = 1.0 + len(envelope.payload) // self.config.bytes_per_token
        pusher = signer if via is None else via
        if not solicited and not self.peers.state(pusher, now).bucket.take(now, cost):
            return self._reject(
                RejectReason.RATE_LIMITED,
                f"{'sender' if pusher == signer else 'delivering peer'} {pusher} over its rate",
                now,
                signer=signer,
                via=via,
                charge=Charge.SIGNER if pusher == signer else Charge.VIA,
            )
        return None

    def _check_kind(self, message: Message, signer: str, now: float, via: str | None) -> Rejected | None:
        if isinstance(message, PeerRecord) and message.peer_id != signer:
            return self._reject(
                RejectReason.SENDER_MISMATCH,
                f"peer record for {clip(message.peer_id)} signed by {signer}",
                now,
                signer=signer,
                via=via,
            )
        if isinstance(message, WeightManifest):
            if not verify_manifest(message):
                return self._reject(
                    RejectReason.BAD_MANIFEST_SIGNATURE,
                    f"manifest {clip(message.body.model_id)} v{message.body.version}: "
                    "publisher signature does not verify",
                    now,
                    signer=signer,
                    via=via,
                )
            trusted = self.config.trusted_publishers
            if trusted is not None and message.publisher_key not in trusted:
                return self._reject(
                    RejectReason.UNTRUSTED_PUBLISHER,
                    f"publisher key {message.publisher_key.hex()[:16]} is not trusted",
                    now,
                    signer=signer,
                    via=via,
                )
        local = self.config.local_peer_id
        if (
            isinstance(message, Activate | Deactivate)
            and local is not None
            and message.worker_peer_id != local
        ):
            return self._reject(
                RejectReason.WRONG_RECIPIENT,
                f"addressed to {clip(message.worker_peer_id)}, not to us",
                now,
                signer=signer,
                via=via,
            )
        return None

    def _check_freshness(
        self, envelope: Envelope, signer: str, now: float, via: str | None
    ) -> Rejected | None:
        now_ms = now * 1000.0  # too old: at step 2c
        if envelope.sent_at_ms > now_ms + self.config.max_future_s * 1000.0:
            return self._reject(
                RejectReason.FROM_FUTURE,
                f"sent {envelope.sent_at_ms / 1000.0 - now:.1f} s in the future; "
                f"skew allowed {self.config.max_future_s} s",
                now,
                signer=signer,
                via=via,
            )
        return None

    def _check_policy_lag(
        self, message: Message, signer: str, now: float, via: str | None
    ) -> Rejected | None:
        if isinstance(message, RolloutBatch) and self._versions:
            for i, group in enumerate(message.groups):
                current = self._versions.get(group.model_id)
                if current is None:
                    continue
                lag = current - group.policy_version
                if lag < 0 or lag > self.config.max_policy_lag:
                    return self._reject(
                        RejectReason.STALE_POLICY,
                        f"groups[{i}] policy version {group.policy_version} of {clip(group.model_id)}; "
                        f"current {current}, lag allowed 0..{self.config.max_policy_lag}",
                        now,
                        signer=signer,
                        via=via,
                    )
        return None

    def _rederive_and_rescore(
        self, batch: RolloutBatch, signer: str, now: float, via: str | None
    ) -> tuple[AdmittedGroup, ...] | Rejected:
        allowed = self.config.allowed_tasks
        tasks: list[Task] = []
        for i, group in enumerate(batch.groups):
            tid = group.task
            if allowed is not None and (tid.dataset, tid.config, tid.prompt_format) not in allowed:
                return self._reject(
                    RejectReason.TASK_NOT_ALLOWED,
                    f"groups[{i}] task family {clip(tid.dataset)} {clip(tid.config)} "
                    f"{tid.prompt_format} is not one we train on",
                    now,
                    signer=signer,
                    via=via,
                )
            if group.system_prompt_sha256 != self.config.system_prompt_sha256:
                return self._reject(
                    RejectReason.SYSTEM_PROMPT_MISMATCH,
                    f"groups[{i}] was generated with {_prompt_kind(group.system_prompt_sha256)}; "
                    f"we train with {_prompt_kind(self.config.system_prompt_sha256)}",
                    now,
                    signer=signer,
                    via=via,
                )
            try:
                check_family(tid.dataset)  # cached: the audit runs once per family
                task = self._regenerate(tid)
            except UnsafeScorerError as exc:
                return self._reject(
                    RejectReason.TASK_NOT_ALLOWED,
                    f"groups[{i}]: {clip(str(exc), 200)}",
                    now,
                    signer=signer,
                    via=via,
                )
            except TaskError as exc:
                return self._reject(
                    RejectReason.TASK_INVALID,
                    f"groups[{i}]: {clip(str(exc), 200)}",
                    now,
                    signer=signer,
                    via=via,
                )
            if task.prompt != group.prompt:
                return self._reject(
                    RejectReason.PROMPT_MISMATCH,
                    f"groups[{i}] prompt {clip(group.prompt)} but {tid.key()} regenerates "
                    f"{clip(task.prompt)}",
                    now,
                    signer=signer,
                    via=via,
                )
            tasks.append(task)
        to_score: list[tuple[Task, tuple[str, ...]]] = []
        token_ids: list[tuple[tuple[int, ...], ...]] = []
        for i, (group, task) in enumerate(zip(batch.groups, tasks, strict=True)):
            texts = tuple(c.text for c in group.completions)
            if self._render is not None:
                rendered = self._render(texts)
                refused = next((j for j, text in enumerate(rendered) if isinstance(text, RejectReason)), None)
                if refused is not None:
                    reason = rendered[refused]
                    assert isinstance(reason, RejectReason)
                    return self._reject(
                        reason,
                        f"groups[{i}] completion {refused}: "
                        + (
                            "longer than this node generates"
                            if reason is RejectReason.COMPLETION_TOO_LONG
                            else "spells special tokens or characters this node's tokenizer cannot train"
                        ),
                        now,
                        signer=signer,
                        via=via,
                    )
                trained = [r for r in rendered if isinstance(r, TrainedText)]
                texts = tuple(r.text for r in trained)
                token_ids.append(tuple(r.token_ids for r in trained))
            to_score.append((task, texts))
        outcome = self._score_groups(to_score)
        self.last_scoring_cpu_s = outcome.cpu_s
        if not isinstance(outcome, Scored):
            reason = (
                RejectReason.VERIFIER_TIMEOUT
                if outcome.reason is VerifierReason.TIMEOUT
                else RejectReason.VERIFIER_FAILED
            )
            return self._reject(reason, clip(outcome.detail, 200), now, signer=signer, via=via)
        admitted = [
            AdmittedGroup(
                group=group,
                task=task,
                rewards=rewards,
                sender=signer,
                texts=texts,
                token_ids=token_ids[i] if token_ids else (),
            )
            for i, (group, (task, texts), rewards) in enumerate(
                zip(batch.groups, to_score, outcome.rewards, strict=True)
            )
        ]
        return tuple(admitted)


def _decoded(data: bytes, envelope: Envelope | None) -> Envelope | WireError:
    """``decode_envelope(data)``, or the caller's decode of it; the size rule holds either way."""
    if envelope is None:
        return decode_envelope(data)
    if len(data) > MAX_ENVELOPE_BYTES:  # as decode_envelope's first check: nothing above the cap
        return WireError(WireReason.TOO_LARGE, f"envelope is {len(data)} bytes; limit {MAX_ENVELOPE_BYTES}")
    return envelope


__all__ = ["AdmissionConfig", "AdmissionPipeline", "TaskFamily", "task_families"]
