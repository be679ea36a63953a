"""DAPO: dynamic sampling, the soft overlong punishment (Eq. 13) and the clip-higher token-mean loss."""

import math

import pytest
import torch

from swarmnode.learn import dapo_loss, dynamic_sampling_keep, grpo_loss, overlong_penalty


def test_dynamic_sampling_keeps_only_groups_with_some_right_and_some_wrong() -> None:
    rewards = torch.tensor(
        [
            [1.0, 0.0, 0.0],  # 1 of 3 right: keep
            [1.0, 1.0, 1.0],  # all right: drop
            [0.0, 0.0, 0.0],  # all wrong: drop
            [0.01, 1.0, 0.0],  # 1 right (0.01 = reasoning-gym's "answered but wrong"): keep
            [0.01, 0.01, 0.0],  # none right although rewards differ: drop
        ]
    )
    assert dynamic_sampling_keep(rewards).tolist() == [True, False, False, True, False]


def test_dynamic_sampling_threshold_is_adjustable() -> None:
    rewards = torch.tensor([[0.6, 0.2], [0.4, 0.2]])
    assert dynamic_sampling_keep(rewards, correct_at=0.5).tolist() == [True, False]


def test_dynamic_sampling_by_variance_keeps_any_group_whose_rewards_differ() -> None:
    rewards = torch.tensor([[0.5, 0.5], [0.5, 0.0], [0.01, 0.01], [1.0, 1.0]])
    assert dynamic_sampling_keep(rewards, correct_at=None).tolist() == [False, True, False, False]


def test_overlong_penalty_by_hand() -> None:
    # L_max 10, L_cache 4: free up to 6, then -(|y| - 6) / 4, and -1 beyond 10
    lengths = torch.tensor([3, 6, 7, 8, 10, 11])
    torch.testing.assert_close(
        overlong_penalty(lengths, 10, 4), torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0])
    )


def test_overlong_penalty_factor_and_hard_cutoff() -> None:
    torch.testing.assert_close(overlong_penalty(torch.tensor([8]), 10, 4, factor=0.5), torch.tensor([-0.25]))
    torch.testing.assert_close(overlong_penalty(torch.tensor([10, 11]), 10, 0), torch.tensor([0.0, -1.0]))
    with pytest.raises(ValueError, match="cache_len"):
        overlong_penalty(torch.tensor([1]), 10, 11)


def test_overlong_penalty_matches_trl_reward_function() -> None:
    rewards = pytest.importorskip("trl.rewards")
    trl_fn = rewards.get_soft_overlong_punishment(max_completion_len=20, soft_punish_cache=8)
    lengths = list(range(0, 25))
    expected = trl_fn(completion_ids=[[1] * n for n in lengths])
    torch.testing.assert_close(
        overlong_penalty(torch.tensor(lengths), 20, 8), torch.tensor(expected, dtype=torch.float32)
    )


def test_dapo_loss_by_hand_uses_clip_higher_and_token_mean() -> None:
    # Same tokens as the GRPO hand example: ratios [[1.1, 1.5], [0.5, -]], A = [+1, -1].
    # eps_high 0.28: the 1.5 token is clipped at 1.28. Token-mean: (-1.1 - 1.28 + 0.8) / 3
    logp = torch.tensor([[1.1, 1.5], [0.5, 0.9]], dtype=torch.float64).log()
    old = torch.zeros(2, 2, dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    loss, stats = dapo_loss(logp, old, adv, mask)
    assert loss.item() == pytest.approx(-1.58 / 3)
    same, _ = grpo_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28, agg="token-mean")
    assert loss.item() == same.item()
    assert math.isfinite(stats["approx_kl_old"])
