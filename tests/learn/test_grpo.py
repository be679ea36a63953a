"""grpo_loss(): GRPO's clipped surrogate, worked by hand; ratio-1 and clipping-gradient properties."""

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from swarmnode.learn import grpo_loss, k3_kl

# Hand example. old_logp = 0, so logp = log(ratio). Row 0: A = +1, ratios 1.1 and 1.5, both tokens real.
# Row 1: A = -1, ratios 0.5 and 0.9, only the first token real.
RATIOS = torch.tensor([[1.1, 1.5], [0.5, 0.9]], dtype=torch.float64)
OLD = torch.zeros(2, 2, dtype=torch.float64)
ADV = torch.tensor([1.0, -1.0], dtype=torch.float64)
MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
# Per-token loss -min(r A, clip(r, 0.8, 1.2) A):
#   row 0: -min(1.1, 1.1) = -1.1 ; -min(1.5, 1.2) = -1.2 (clipped high)
#   row 1: -min(-0.5, -0.8) = 0.8 (clipped low) ; masked


def _logp() -> torch.Tensor:
    return RATIOS.log().requires_grad_(True)


def test_seq_mean_token_mean_by_hand() -> None:
    loss, _ = grpo_loss(_logp(), OLD, ADV, MASK)
    # ((-1.1 - 1.2) / 2 + 0.8 / 1) / 2 = (-1.15 + 0.8) / 2
    assert loss.item() == pytest.approx(-0.175)


def test_token_mean_by_hand() -> None:
    loss, _ = grpo_loss(_logp(), OLD, ADV, MASK, agg="token-mean")
    # (-1.1 - 1.2 + 0.8) / 3
    assert loss.item() == pytest.approx(-0.5)


def test_gradient_by_hand_flows_only_through_unclipped_tokens() -> None:
    logp = _logp()
    loss, _ = grpo_loss(logp, OLD, ADV, MASK)
    loss.backward()
    assert logp.grad is not None
    # d/dlogp of -r * A / (|o_0| * B) = -1.1 / 4 for the one unclipped token; 0 for clipped and padding
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.275, 0.0], [0.0, 0.0]], dtype=torch.float64))


def test_clip_stats_by_hand() -> None:
    _, stats = grpo_loss(_logp(), OLD, ADV, MASK)
    assert stats["clip_low_frac"] == pytest.approx(1 / 3)
    assert stats["clip_high_frac"] == pytest.approx(1 / 3)
    assert stats["clip_frac"] == pytest.approx(2 / 3)
    assert stats["ratio_mean"] == pytest.approx((1.1 + 1.5 + 0.5) / 3)
    assert stats["loss"] == pytest.approx(-0.175)


def test_k3_kl_by_hand() -> None:
    # ref - logp = ln 2: 2 - ln 2 - 1 = 0.306853; equal policies: 0
    kl = k3_kl(torch.tensor([0.0, -1.0]), torch.tensor([math.log(2), -1.0]))
    torch.testing.assert_close(kl, torch.tensor([1 - math.log(2), 0.0]))


def test_kl_penalty_is_added_per_token_before_aggregation() -> None:
    logp = _logp()
    ref = logp.detach() + math.log(2)  # k3 = 1 - ln 2 = 0.306853 on every token
    loss, stats = grpo_loss(logp, OLD, ADV, MASK, beta=0.1, ref_logp=ref)
    assert loss.item() == pytest.approx(-0.175 + 0.1 * (1 - math.log(2)))
    assert stats["kl"] == pytest.approx(1 - math.log(2))


def test_beta_without_reference_is_an_error() -> None:
    with pytest.raises(ValueError, match="ref_logp"):
        grpo_loss(_logp(), OLD, ADV, MASK, beta=0.1)


def test_shapes_are_checked() -> None:
    with pytest.raises(ValueError, match="advantages"):
        grpo_loss(_logp(), OLD, ADV.unsqueeze(1), MASK)
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        grpo_loss(_logp(), OLD[:, :1], ADV, MASK)


def test_a_huge_log_ratio_is_clamped_not_inf() -> None:
    logp = torch.tensor([[200.0]], requires_grad=True)
    loss, _ = grpo_loss(logp, torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1))
    loss.backward()
    assert math.isfinite(loss.item()) and logp.grad is not None and math.isfinite(logp.grad.item())


def _batch(data: st.DataObject, t: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    b = data.draw(st.integers(min_value=1, max_value=4))
    lengths = [data.draw(st.integers(min_value=1, max_value=t)) for _ in range(b)]
    mask = torch.tensor([[1.0] * n + [0.0] * (t - n) for n in lengths], dtype=torch.float64)
    floats = st.floats(min_value=-1.0, max_value=1.0, allow_nan=False)
    log_r = torch.tensor([[data.draw(floats) for _ in range(t)] for _ in range(b)], dtype=torch.float64)
    adv = torch.tensor(
        [data.draw(st.floats(min_value=-2.0, max_value=2.0)) for _ in range(b)], dtype=torch.float64
    )
    return log_r, adv, mask, torch.tensor(lengths, dtype=torch.float64)


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_at_ratio_one_the_loss_is_minus_the_mean_advantage(data: st.DataObject) -> None:
    _, adv, mask, lengths = _batch(data)
    logp = torch.randn(mask.shape, dtype=torch.float64)
    token_mean, _ = grpo_loss(logp, logp.clone(), adv, mask, agg="token-mean")
    seq_mean, _ = grpo_loss(logp, logp.clone(), adv, mask)
    # token-mean weighs each completion by its length; seq-mean-token-mean weighs completions equally
    assert token_mean.item() == pytest.approx(-(adv * lengths).sum().item() / lengths.sum().item(), abs=1e-12)
    assert seq_mean.item() == pytest.approx(-adv.mean().item(), abs=1e-12)


@settings(max_examples=50, deadline=None)
@given(st.data(), st.sampled_from([(0.2, 0.2), (0.2, 0.28), (0.1, 0.5)]))
def test_clipped_tokens_get_zero_gradient_and_the_rest_get_minus_a_rho(
    data: st.DataObject, eps: tuple[float, float]
) -> None:
    eps_low, eps_high = eps
    log_r, adv, mask, _ = _batch(data)
    ratio = log_r.exp()
    # stay off the exact clip boundaries, where the subgradient is a matter of convention
    assume(
        bool(((ratio - (1 - eps_low)).abs() > 1e-6).all() and ((ratio - (1 + eps_high)).abs() > 1e-6).all())
    )
    logp = log_r.clone().requires_grad_(True)
    loss, _ = grpo_loss(
        logp, torch.zeros_like(log_r), adv, mask, eps_low=eps_low, eps_high=eps_high, agg="token-mean"
    )
    loss.backward()
    assert logp.grad is not None
    a = adv.unsqueeze(1).expand_as(ratio)
    clipped = ((a > 0) & (ratio > 1 + eps_high)) | ((a < 0) & (ratio < 1 - eps_low))
    expected = torch.where(clipped, 0.0, -a * ratio / mask.sum()) * mask
    torch.testing.assert_close(logp.grad, expected)


def test_kl_ratio_correction_weights_each_tokens_kl_by_its_ratio() -> None:
    logp = _logp()
    ref = logp.detach() + math.log(2)
    loss, _ = grpo_loss(logp, OLD, ADV, MASK, beta=0.1, ref_logp=ref, kl_ratio_correction=True)
    # KL term per token c * rho with c = 1 - ln 2: seq-mean-token-mean ((1.1 + 1.5) / 2 + 0.5) / 2 = 0.9 c
    assert loss.item() == pytest.approx(-0.175 + 0.1 * 0.9 * (1 - math.log(2)))
