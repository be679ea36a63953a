"""DAPO: the clip-higher token-mean loss."""

import math

import pytest
import torch

from swarmnode.learn import dapo_loss, grpo_loss


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
