"""Specification of the bounded-staleness gate (swarmnode/admit/staleness.py). Each test name is a rule."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from swarmnode.admit.staleness import StalenessGate, StaleReason
from swarmnode.errors import ConfigError


def test_a_group_exactly_s_versions_behind_is_accepted_and_s_plus_one_is_dropped() -> None:
    gate = StalenessGate(bound=8)  # prime-rl's default max_off_policy_steps
    assert gate.accept(group_version=92, current_version=100).accepted
    verdict = gate.accept(group_version=91, current_version=100)
    assert not verdict.accepted and verdict.reason is StaleReason.TOO_OLD and verdict.lag == 9
    assert "bound 8" in verdict.detail


def test_bound_zero_is_strictly_on_policy() -> None:
    gate = StalenessGate(0)
    assert gate.accept(5, 5).accepted
    assert gate.accept(4, 5).reason is StaleReason.TOO_OLD


def test_a_group_from_a_version_the_learner_has_not_published_is_dropped() -> None:
    verdict = StalenessGate(4).accept(group_version=11, current_version=10)
    assert not verdict.accepted and verdict.reason is StaleReason.FROM_FUTURE and verdict.lag == -1


def test_verdicts_are_counted_by_reason_and_accepted_lags_are_histogrammed() -> None:
    gate = StalenessGate(2)
    for version in [10, 9, 8, 7, 11, 10, 6]:
        gate.accept(version, current_version=10)
    assert gate.counters == {"accepted": 4, "too_old": 2, "from_future": 1}
    assert gate.accepted_by_lag == [2, 1, 1]
    assert gate.dropped == 3


def test_check_judges_without_counting() -> None:
    gate = StalenessGate(1)
    assert not gate.check(0, 5).accepted
    assert gate.counters == {"accepted": 0, "too_old": 0, "from_future": 0}


@pytest.mark.parametrize("bound", [-1, 1.5, True, "8"])
def test_an_invalid_bound_is_refused_with_the_field_named(bound: object) -> None:
    with pytest.raises(ConfigError, match=r"staleness.bound"):
        StalenessGate(bound)  # type: ignore[arg-type]


@given(st.integers(0, 50), st.integers(-100, 100), st.integers(-100, 100))
def test_accepted_exactly_when_the_lag_is_within_zero_and_the_bound(
    bound: int, group: int, current: int
) -> None:
    verdict = StalenessGate(bound).accept(group, current)
    assert verdict.accepted == (0 <= current - group <= bound)
    assert (verdict.reason is None) == verdict.accepted
