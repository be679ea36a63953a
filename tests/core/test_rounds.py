"""Specification of swarm rounds (swarmnode/core/rounds.py): rounds are wall-clock epochs."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from swarmnode.core.rounds import round_at, round_start


def test_round_is_the_floor_of_elapsed_time_over_round_length() -> None:
    assert round_at(0.0, 30.0) == 0
    assert round_at(29.999, 30.0) == 0
    assert round_at(30.0, 30.0) == 1
    assert round_at(95.0, 30.0, epoch=5.0) == 3
    assert round_at(4.0, 30.0, epoch=5.0) == -1  # before the epoch: negative rounds, no error


def test_a_late_joiner_lands_in_the_same_round_as_a_node_that_has_run_since_the_epoch() -> None:
    round_seconds, epoch = 30.0, 1_700_000_000.0
    # The long-running node has seen every round go by; the late joiner only reads the clock.
    rounds_seen_by_old_node = 0
    t = epoch
    while t < epoch + 3 * 3600:
        t += round_seconds
        rounds_seen_by_old_node += 1
    late_joiner_round = round_at(epoch + 3 * 3600 + 0.5, round_seconds, epoch)
    assert late_joiner_round == round_at(t, round_seconds, epoch) == rounds_seen_by_old_node


def test_boundaries_are_exact_even_where_float_division_is_not() -> None:
    # 0.3 / 0.1 == 2.9999999999999996: plain floor() would say round 2 at the start of round 3.
    assert round_at(round_start(3, 0.1), 0.1) == 3


@given(
    now=st.floats(-1e9, 1e9, allow_nan=False),
    round_seconds=st.floats(1e-2, 1e5),
    epoch=st.floats(-1e9, 1e9, allow_nan=False),
)
def test_every_time_lies_inside_the_round_it_maps_to(now: float, round_seconds: float, epoch: float) -> None:
    r = round_at(now, round_seconds, epoch)
    assert round_start(r, round_seconds, epoch) <= now < round_start(r + 1, round_seconds, epoch)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_a_round_length_that_is_not_positive_and_finite_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="round_seconds"):
        round_at(10.0, bad)
