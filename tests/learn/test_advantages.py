"""group_advantages(): GRPO's group-relative advantages, by hand and as properties."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmnode.learn import group_advantages


def test_two_right_two_wrong_gives_plus_minus_0_866() -> None:
    # mean 0.5, unbiased std = sqrt(4 * 0.25 / 3) = 0.57735; A = +-0.5 / 0.57735 = +-0.866025
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), eps=0.0)
    torch.testing.assert_close(adv, torch.tensor([[0.866025, -0.866025, -0.866025, 0.866025]]))


def test_eps_is_added_to_the_std() -> None:
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), eps=0.5)
    # 0.5 / (0.57735 + 0.5)
    assert adv[0, 0].item() == pytest.approx(0.5 / (0.5773503 + 0.5), rel=1e-6)


def test_biased_std_when_asked() -> None:
    # population std of [1, 0, 0, 1] is 0.5, so A = +-1
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), eps=0.0, unbiased=False)
    torch.testing.assert_close(adv, torch.tensor([[1.0, -1.0, -1.0, 1.0]]))


def test_scale_none_only_subtracts_the_group_mean() -> None:
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0], [3.0, 1.0, 2.0, 2.0]]), scale="none")
    torch.testing.assert_close(adv, torch.tensor([[0.5, -0.5, -0.5, 0.5], [1.0, -1.0, 0.0, 0.0]]))


def test_scale_batch_divides_by_the_std_of_all_rewards_but_centres_per_group() -> None:
    # group means 0.5 and 1 -> centred [[0.5, -0.5], [0, 0]];
    # all rewards [1, 0, 1, 1]: mean 0.75, squared deviations sum 0.75, / 3 -> var 0.25, std 0.5
    adv = group_advantages(torch.tensor([[1.0, 0.0], [1.0, 1.0]]), scale="batch", eps=0.0)
    torch.testing.assert_close(adv, torch.tensor([[1.0, -1.0], [0.0, 0.0]]))


def test_a_group_with_equal_rewards_gets_zero_under_every_scale() -> None:
    for scale in ("group", "batch", "none"):
        adv = group_advantages(torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]), scale=scale)  # type: ignore[arg-type]
        assert torch.equal(adv, torch.zeros(2, 3))


def test_a_group_of_one_gets_zero() -> None:
    assert torch.equal(group_advantages(torch.tensor([[1.0], [0.0]])), torch.zeros(2, 1))


def test_integer_rewards_are_accepted() -> None:
    adv = group_advantages(torch.tensor([[1, 0]]), eps=0.0)
    # mean 0.5, unbiased std sqrt(0.5) = 0.7071
    torch.testing.assert_close(adv, torch.tensor([[0.707107, -0.707107]]))


def test_bad_shape_and_scale_are_rejected() -> None:
    with pytest.raises(ValueError, match="n_groups"):
        group_advantages(torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError, match="scale"):
        group_advantages(torch.tensor([[1.0, 0.0]]), scale="std")  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.floats(min_value=0, max_value=1, allow_nan=False), min_size=4, max_size=4),
        min_size=1,
        max_size=5,
    )
)
def test_group_advantages_have_zero_mean_and_unit_std_per_group(rows: list[list[float]]) -> None:
    rewards = torch.tensor(rows, dtype=torch.float64)
    adv = group_advantages(rewards, eps=0.0)
    for r, a in zip(rewards, adv, strict=True):
        if bool((r == r[0]).all()):
            assert torch.equal(a, torch.zeros_like(a))
        elif r.std().item() > 1e-6:
            assert a.mean().item() == pytest.approx(0.0, abs=1e-9)
            assert a.std().item() == pytest.approx(1.0, rel=1e-9)


def test_non_finite_rewards_are_rejected() -> None:
    with pytest.raises(ValueError, match="finite"):
        group_advantages(torch.tensor([[1.0, float("nan")]]))
