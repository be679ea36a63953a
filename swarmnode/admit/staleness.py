"""Bounded staleness: which rollout groups a learner may still train on (ALGORITHMS.md §5).

Owns
    The accept/drop rule for a group by the policy version that generated it, and per-reason
    counters (plus a histogram of accepted lags, which shows that nothing older than S got in).

Must not
    Decode groups, read a clock, or decide how stale data is weighted (M2PO masking does that,
    ``swarmnode.learn.m2po``, on the groups this gate accepted).

Convention
    ``lag = current_version - group_version``. A group is accepted when ``0 <= lag <= S``: a group
    exactly S versions behind is accepted, S + 1 behind is dropped (``too_old``), and a group that
    claims a version newer than the learner's (``lag < 0``) is dropped (``from_future``: no honest
    worker can have weights the learner has not published). This is prime-rl's
    ``max_off_policy_steps`` semantics (a rollout is discarded when the number of trainer steps
    since it was generated *exceeds* the limit; 0 means strictly on-policy), ALGORITHMS.md's "older
    than ``current - S`` is dropped", and the admission pipeline's ``max_policy_lag`` check, so a
    bound means the same thing in every layer: "S updates of staleness are fine".
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from swarmnode.errors import ConfigError


class StaleReason(StrEnum):
    """Why a group was dropped; the value is the metrics / log label."""

    TOO_OLD = "too_old"
    FROM_FUTURE = "from_future"


@dataclass(frozen=True)
class StalenessVerdict:
    """The gate's answer for one group. ``reason`` is None exactly when ``accepted``."""

    accepted: bool
    lag: int  # current_version - group_version (negative: from the future)
    reason: StaleReason | None = None
    detail: str = ""


class StalenessGate:
    """Accepts a group generated ``lag`` versions ago when ``0 <= lag <= bound``; see the module docstring."""

    def __init__(self, bound: int) -> None:
        if isinstance(bound, bool) or not isinstance(bound, int) or bound < 0:
            raise ConfigError(f"staleness.bound must be an integer >= 0 (versions), got {bound!r}")
        self.bound = bound
        #: "accepted", "too_old", "from_future" -> count (monotonic).
        self.counters: dict[str, int] = {"accepted": 0, **{r.value: 0 for r in StaleReason}}
        #: accepted_by_lag[k] = groups accepted k versions behind, k in 0..bound.
        self.accepted_by_lag: list[int] = [0] * (bound + 1)

    def check(self, group_version: int, current_version: int) -> StalenessVerdict:
        """The verdict without counting it (for a dry run, e.g. before pulling a group)."""
        lag = current_version - group_version
        if lag < 0:
            return StalenessVerdict(
                False,
                lag,
                StaleReason.FROM_FUTURE,
                f"group version {group_version} is newer than the learner's {current_version}",
            )
        if lag > self.bound:
            return StalenessVerdict(
                False,
                lag,
                StaleReason.TOO_OLD,
                f"group version {group_version} is {lag} behind {current_version}; bound {self.bound}",
            )
        return StalenessVerdict(True, lag)

    def accept(self, group_version: int, current_version: int) -> StalenessVerdict:
        """Judge one group and count the verdict."""
        verdict = self.check(group_version, current_version)
        if verdict.reason is None:
            self.counters["accepted"] += 1
            self.accepted_by_lag[verdict.lag] += 1
        else:
            self.counters[verdict.reason.value] += 1
        return verdict

    @property
    def dropped(self) -> int:
        return sum(self.counters[r.value] for r in StaleReason)
