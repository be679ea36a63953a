"""Spot-checks of the log-probs a rollout worker reports, as a sans-IO policy.

Owns
    Which batches of a worker's rollouts to re-check, which group of each and which of its
    tokens (sample rate, at most K tokens a check, a seeded rng), the comparison rule
    (``judge``), strikes per worker, the verdict (ok / deactivate, with a score change) after
    ``max_strikes`` failures, and each worker's record (batches, checks, tokens skipped, when
    it was deactivated).

Must not
    Run a model (``swarmnode.admit.recompute.scan_group`` does, in the driver), read a clock, or
    ban anyone itself: it returns a verdict; the driver lowers the peer's score
    (``AdmissionPipeline.peers.penalize(peer, -score_delta, ...)``) and, on ``DEACTIVATE``, feeds
    ``PeerBanned`` to the activation core, which sends the ``Deactivate``.

Why
    Workers report per-token log-probs of the policy they sampled from; the learner uses them as
    the behaviour policy in M2PO's importance ratio (``swarmnode.learn.m2po``). A worker that
    misreports them (stale weights claimed as fresh, made-up numbers to inflate or mute its
    groups' updates) corrupts training without changing a single reward; one that samples from
    anything else and reports honest numbers for it is caught by its tokens (keyed sampling,
    protocol/SPEC.md 1.8). Recomputing every token would cost as much as generating: a sample of
    batches, one group of each and at most K tokens within it, catches a persistent cheat with
    high probability at a small cost.

Driving it
    For each accepted batch from worker ``peer``: for each ``index`` in ``checker.begin_batch(peer,
    len(groups))``, ``request = checker.select(peer, key, lengths)`` for that group
    (``lengths``: completion lengths in tokens), recompute the log-probs at ``request``'s tokens
    with the policy version the group claims (and draw its token checks with ``draw_seed()``),
    then ``outcome = checker.check(peer, request.pick(reported), recomputed)``. A batch naming a
    version the learner does not hold cannot be checked: the driver refuses it, unpaid (never a
    strike: an honest worker's batch can arrive late).

Tolerance
    Absolute, in nats, on the largest deviation among the compared tokens. The same weights in
    float32 agree to ~1e-5; bfloat16 engines and batched kernels drift further, so a swarm with
    bf16 workers needs a larger tolerance than the default.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from swarmnode.core.events import PeerId
from swarmnode.errors import ConfigError

_MAX_LOGPROB = 1e-6  # a log-prob above 0 (beyond float noise) is impossible: a sure misreport
_MASK64 = (1 << 64) - 1


#: The shares of a group's keyed-sampling checks drawn uniformly from its completions' last
#: ``TAIL_TOKENS`` tokens (where the answer is: a worker that overwrites only its answers with
#: right ones changes 1-4 tokens of 256, which 16 tokens drawn from the whole group caught in 6% of
#: checks, red team #20) and uniformly from all of its tokens; the rest are drawn where our policy
#: is unsure (``admit.recompute.scan_group``).
TAIL_SHARE = 0.25
TAIL_TOKENS = 8
UNIFORM_SHARE = 0.375
#: Each token's least weight in the draw where our policy is unsure: ``1 - p_top + UNCERTAIN_FLOOR``.
UNCERTAIN_FLOOR = 1.0 / 16


class SplitMix64:
    """A small seeded generator (Steele, Lea & Flood 2014), so the core needs no ``random`` module:
    its whole state is one integer, and the same seed gives the same choices on every platform."""

    def __init__(self, seed: int) -> None:
        self.state = seed & _MASK64

    def next64(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & _MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        return z ^ (z >> 31)

    def random(self) -> float:
        """Uniform in [0, 1)."""
        return (self.next64() >> 11) / float(1 << 53)

    def below(self, n: int) -> int:
        """Uniform in [0, n), without modulo bias."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        limit = ((1 << 64) // n) * n
        while True:
            x = self.next64()
            if x < limit:
                return x % n

    def sample(self, n: int, k: int) -> list[int]:
        """``k`` distinct integers of [0, n), ascending (Floyd's algorithm: O(k) draws whatever n)."""
        chosen: set[int] = set()
        for j in range(n - k, n):
            t = self.below(j + 1)
            chosen.add(j if t in chosen else t)
        return sorted(chosen)


@dataclass(frozen=True)
class SpotCheckConfig:
    """Every knob of the spot-checker."""

    sample_rate: float = 0.05  # share of a worker's batches checked (one group each), in [0, 1]
    suspect_sample_rate: float = 1.0  # the share while the worker has a strike
    always_check_first: int = 1  # a worker's first N batches are always checked
    groups_per_check: int = 16  # a checked batch has one group checked per this many (rounded up)
    max_tokens: int = 32  # K: tokens compared per check
    tolerance: float = 0.1  # nats: a check fails when max |reported - recomputed| exceeds it
    max_strikes: int = 3  # failed checks that deactivate the worker
    forgive_after: int = 50  # consecutive passes that remove one strike (0: strikes never expire)
    fail_penalty: float = 10.0  # score lowered on each failed check
    deactivate_penalty: float = 50.0  # added to fail_penalty when the verdict is DEACTIVATE
    seed: int = (
        0  # the node should pass a secret random seed: a worker that can predict the checks can dodge them
    )
    max_workers: int = 4096

    def __post_init__(self) -> None:
        for name in ("sample_rate", "suspect_sample_rate"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, int | float) and 0 <= value <= 1):
                raise ConfigError(f"spotcheck.{name} must be a number in [0, 1], got {value!r}")
        for name, low in (
            ("always_check_first", 0),
            ("groups_per_check", 1),
            ("max_tokens", 1),
            ("max_strikes", 1),
            ("forgive_after", 0),
            ("max_workers", 1),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"spotcheck.{name} must be an integer >= {low}, got {value!r}")
        for name in ("tolerance", "fail_penalty", "deactivate_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (
                isinstance(value, int | float) and value >= 0 and math.isfinite(value)
            ):
                raise ConfigError(f"spotcheck.{name} must be a finite number >= 0, got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"spotcheck.seed must be an integer, got {self.seed!r}")


@dataclass(frozen=True)
class TokenRef:
    """Token ``position`` (0-based, within the completion) of completion ``completion`` of a group."""

    completion: int
    position: int


@dataclass(frozen=True)
class SpotCheckRequest:
    """The tokens of one group to recompute, sorted by (completion, position)."""

    peer: PeerId
    group: Hashable
    tokens: tuple[TokenRef, ...]

    @property
    def completions(self) -> tuple[int, ...]:
        """The completions that need a forward pass, ascending."""
        return tuple(sorted({t.completion for t in self.tokens}))

    def prefix(self, completion: int) -> int:
        """How many leading tokens of ``completion`` the recomputation needs (0: none)."""
        return max((t.position + 1 for t in self.tokens if t.completion == completion), default=0)

    def pick(self, values: Sequence[Sequence[float]]) -> list[float]:
        """The values at this request's tokens from per-completion rows (``values[completion][position]``).

        A missing row or value (a row cut short) is NaN, which ``judge`` fails: a worker that
        reports fewer log-probs than it sent tokens is misreporting.
        """
        picked: list[float] = []
        for t in self.tokens:
            row = values[t.completion] if t.completion < len(values) else ()
            picked.append(float(row[t.position]) if t.position < len(row) else math.nan)
        return picked


@dataclass(frozen=True)
class Judgement:
    """The comparison of one check. ``worst`` indexes the compared lists (None when nothing to compare)."""

    passed: bool
    max_abs_deviation: float
    worst: int | None
    n_tokens: int
    reason: str = ""


def judge(reported: Sequence[float], recomputed: Sequence[float], tolerance: float) -> Judgement:
    """Pass when every ``|reported - recomputed| <= tolerance`` (nats); see the module docstring.

    A length mismatch, a non-finite value on either side, or a reported log-prob above 0 fails
    with deviation ``inf`` (NaN never compares greater than anything, so it is checked explicitly).
    """
    if not (tolerance >= 0 and math.isfinite(tolerance)):
        raise ValueError(f"tolerance must be a finite number >= 0, got {tolerance!r}")
    n = len(reported)
    if n != len(recomputed):
        return Judgement(False, math.inf, None, n, f"{n} reported log-probs for {len(recomputed)} tokens")
    worst, deviation = None, 0.0
    for i, (mine, theirs) in enumerate(zip(recomputed, reported, strict=True)):
        if not math.isfinite(theirs):
            return Judgement(False, math.inf, i, n, f"token {i}: reported log-prob {theirs!r}")
        if theirs > _MAX_LOGPROB:
            return Judgement(False, math.inf, i, n, f"token {i}: reported log-prob {theirs!r} > 0")
        if not math.isfinite(mine):
            return Judgement(False, math.inf, i, n, f"token {i}: our policy gives it log-prob {mine!r}")
        d = abs(theirs - mine)
        if worst is None or d > deviation:
            worst, deviation = i, d
    if deviation > tolerance:
        assert worst is not None
        return Judgement(
            False,
            deviation,
            worst,
            n,
            f"token {worst}: reported {reported[worst]:.6g}, recomputed {recomputed[worst]:.6g}, "
            f"deviation {deviation:.4g} > tolerance {tolerance:g}",
        )
    return Judgement(True, deviation, worst, n)


class Verdict(StrEnum):
    OK = "ok"
    DEACTIVATE = "deactivate"


@dataclass(frozen=True)
class SpotCheckOutcome:
    """What to do after one check. ``score_delta`` is <= 0 (add it to the peer's score)."""

    peer: PeerId
    verdict: Verdict
    strikes: int  # after this check (reset to 0 by a DEACTIVATE verdict)
    score_delta: float
    judgement: Judgement
    reason: str = ""

    @property
    def passed(self) -> bool:
        return self.judgement.passed

    @property
    def deactivate(self) -> bool:
        return self.verdict is Verdict.DEACTIVATE


@dataclass
class SpotCheckStats:
    """Monotonic counters, for metrics and tests."""

    groups_seen: int = 0
    checks_selected: int = 0
    tokens_selected: int = 0
    passes: int = 0
    fails: int = 0
    strikes_forgiven: int = 0
    deactivations: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class _WorkerRecord:
    groups: int = 0
    strikes: int = 0
    passes_in_row: int = 0
    convictions: int = 0
    batches: int = 0  # worker batches begun (``begin_batch``)
    checked_batches: int = 0  # of which one group was chosen for a check
    recent_checked: deque[int] = field(default_factory=lambda: deque(maxlen=16))  # their numbers
    checks: int = 0
    fails: int = 0
    tokens_checked: int = 0  # keyed-sampling token checks (``record_tokens``)
    tokens_skipped: int = 0
    first_conviction: tuple[int, int] | None = None  # (batches, checked batches) when first deactivated

    def as_dict(self) -> dict[str, Any]:
        return {
            "batches": self.batches,
            "checked_batches": self.checked_batches,
            "recent_checked_batches": list(self.recent_checked),
            "groups": self.groups,
            "checks": self.checks,
            "fails": self.fails,
            "strikes": self.strikes,
            "convictions": self.convictions,
            "tokens_checked": self.tokens_checked,
            "tokens_skipped": self.tokens_skipped,
            "skipped_share": self.tokens_skipped / self.tokens_checked if self.tokens_checked else None,
            "first_deactivated_after": None
            if self.first_conviction is None
            else {"batches": self.first_conviction[0], "checked_batches": self.first_conviction[1]},
        }


class SpotChecker:
    """Selection, judgement bookkeeping and verdicts; see the module docstring."""

    def __init__(self, config: SpotCheckConfig | None = None) -> None:
        self.config = config or SpotCheckConfig()
        self.stats = SpotCheckStats()
        self._rng = SplitMix64(self.config.seed)
        self._workers: dict[PeerId, _WorkerRecord] = {}

    def strikes(self, peer: PeerId) -> int:
        record = self._workers.get(peer)
        return 0 if record is None else record.strikes

    def forget(self, peer: PeerId) -> None:
        """Drop what is known about ``peer`` (it left for good)."""
        self._workers.pop(peer, None)

    def begin_batch(self, peer: PeerId, n_groups: int) -> tuple[int, ...]:
        """A batch of ``n_groups`` groups from ``peer`` arrives: which of them to check (their
        indices, ascending; none: not this batch). A worker's first ``always_check_first`` batches
        are checked, then ``sample_rate`` of them (``suspect_sample_rate`` while it has a strike);
        a checked batch has one group in ``groups_per_check`` checked (at least one), drawn
        uniformly without replacement, so a worker that packs more groups into a batch does not
        dilute the checks (red team #20: 64 groups a batch, one checked, trained 64x as many
        cheated groups before deactivation). Then ``select`` each group's tokens. Reproducible
        from the seed and the order of calls."""
        c = self.config
        record = self._record(peer)
        record.batches += 1
        record.groups += max(0, n_groups)  # every group received, checked or not
        self.stats.groups_seen += max(0, n_groups)
        rate = c.suspect_sample_rate if record.strikes > 0 else c.sample_rate
        draw = self._rng.random()
        if n_groups < 1 or (record.batches > c.always_check_first and draw >= rate):
            return ()
        record.checked_batches += 1
        record.recent_checked.append(record.batches)
        return tuple(self._rng.sample(n_groups, -(-n_groups // c.groups_per_check)))

    def record_tokens(self, peer: PeerId, checked: int, skipped: int) -> None:
        """Count one check's keyed-sampling tokens and those skipped (within the margin)."""
        record = self._record(peer)
        record.tokens_checked += checked
        record.tokens_skipped += skipped

    def workers(self, limit: int = 64) -> dict[PeerId, dict[str, Any]]:
        """Per worker (the ``limit`` with the most batches): batches, checks, fails, tokens checked
        and skipped, and after how many batches (and checked batches) it was first deactivated."""
        ranked = sorted(self._workers.items(), key=lambda item: item[1].batches, reverse=True)[:limit]
        return {peer: record.as_dict() for peer, record in ranked}

    def select(
        self, peer: PeerId, group: Hashable, completion_lengths: Sequence[int]
    ) -> SpotCheckRequest | None:
        """The tokens to recompute in a group chosen for a check (``begin_batch``): at most
        ``max_tokens``, distinct, drawn uniformly from all of its tokens (None: it has none)."""
        c = self.config
        lengths = [max(0, int(n)) for n in completion_lengths]
        total = sum(lengths)
        if total == 0:
            return None
        ends = [0] * len(lengths)  # ends[i] = tokens in completions 0..i
        running = 0
        for i, n in enumerate(lengths):
            running += n
            ends[i] = running
        flat = self._rng.sample(total, min(c.max_tokens, total))
        tokens = []
        for index in flat:
            completion = bisect.bisect_right(ends, index)
            start = ends[completion] - lengths[completion]
            tokens.append(TokenRef(completion, index - start))
        self.stats.checks_selected += 1
        self.stats.tokens_selected += len(tokens)
        return SpotCheckRequest(peer, group, tuple(tokens))

    def draw_seed(self) -> int:
        """A seed for drawing one group's keyed-sampling checks (``admit.recompute.scan_group``),
        from the checker's secret stream: draw one for every check, so the stream stays
        reproducible from the seed and the order of calls."""
        return self._rng.next64()

    def record(self, peer: PeerId, judgement: Judgement) -> SpotCheckOutcome:
        """Count one judged check of ``peer`` and return the verdict."""
        c = self.config
        record = self._record(peer)
        record.checks += 1
        if judgement.passed:
            self.stats.passes += 1
            record.passes_in_row += 1
            if c.forgive_after and record.strikes and record.passes_in_row >= c.forgive_after:
                record.strikes -= 1
                record.passes_in_row = 0
                self.stats.strikes_forgiven += 1
            return SpotCheckOutcome(peer, Verdict.OK, record.strikes, 0.0, judgement)
        self.stats.fails += 1
        record.fails += 1
        record.passes_in_row = 0
        record.strikes += 1
        if record.strikes < c.max_strikes:
            reason = f"spot check failed ({record.strikes}/{c.max_strikes} strikes): {judgement.reason}"
            return SpotCheckOutcome(peer, Verdict.OK, record.strikes, -c.fail_penalty, judgement, reason)
        record.strikes = 0
        record.convictions += 1
        if record.first_conviction is None:
            record.first_conviction = (record.batches, record.checked_batches)
        self.stats.deactivations += 1
        reason = f"failed {c.max_strikes} spot checks (log-probs or sampled tokens); last: {judgement.reason}"
        return SpotCheckOutcome(
            peer, Verdict.DEACTIVATE, 0, -(c.fail_penalty + c.deactivate_penalty), judgement, reason
        )

    def check(self, peer: PeerId, reported: Sequence[float], recomputed: Sequence[float]) -> SpotCheckOutcome:
        """``judge`` with the configured tolerance, then ``record``."""
        return self.record(peer, judge(reported, recomputed, self.config.tolerance))

    def _record(self, peer: PeerId) -> _WorkerRecord:
        record = self._workers.get(peer)
        if record is None:
            if len(self._workers) >= self.config.max_workers:
                # Forget the first-inserted peer without strikes (else the first-inserted): bounded memory
                # must not let a liar wipe its record by flooding us with identities.
                victim = next((p for p, r in self._workers.items() if r.strikes == 0), None)
                self._workers.pop(victim if victim is not None else next(iter(self._workers)))
            record = self._workers[peer] = _WorkerRecord()
        return record
