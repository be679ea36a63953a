"""One definition of a zero-advantage group (``learn.advantages.zero_advantage``), used by every rule."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from swarmnode.learn import (
    CapabilityTracker,
    capability_advantages,
    group_advantages,
    has_signal,
    zero_advantage,
)

REWARDS = st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0]), min_size=1, max_size=12)


@given(REWARDS)
def test_a_group_is_zero_advantage_iff_its_rewards_are_all_equal(rewards: list[float]) -> None:
    assert zero_advantage(rewards) == (len(set(rewards)) == 1)


def test_a_group_of_one_reward_or_none_is_zero_advantage() -> None:
    assert zero_advantage([0.7]) and zero_advantage([])


def test_rewards_are_compared_exactly() -> None:
    assert not zero_advantage([0.5, 0.5 + 1e-12])


@given(REWARDS, st.sampled_from(["group", "batch", "none"]))
def test_a_zero_advantage_group_gets_advantage_zero_under_every_scale(
    rewards: list[float], scale: str
) -> None:
    advantages = group_advantages(torch.tensor([rewards]), scale=scale)  # type: ignore[arg-type]
    assert zero_advantage(rewards) == bool((advantages == 0).all())


class Group:
    def __init__(self, rewards: list[float]) -> None:
        self.rewards = rewards


@given(REWARDS)
def test_sapo_keeps_exactly_the_groups_that_are_not_zero_advantage(rewards: list[float]) -> None:
    assert has_signal(Group(rewards)) is not zero_advantage(rewards)


@given(st.lists(st.sampled_from([0.0, 1.0]), min_size=1, max_size=8))
def test_hacpos_guard_fires_exactly_on_zero_advantage_groups(rewards: list[float]) -> None:
    tracker = CapabilityTracker()
    tracker.update("me", 0.9)
    tracker.update("peer", 0.1)  # weights 9x: without the guard an all-equal group would get a signal
    sources = ["me", "peer"] * len(rewards)
    joint = torch.tensor(rewards * 2)
    advantages = capability_advantages(joint, sources, "me", tracker)
    assert bool((advantages == 0).all()) == zero_advantage(joint.tolist())
