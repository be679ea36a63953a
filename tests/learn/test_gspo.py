"""gspo_loss(): the sequence-level ratio and clip, by hand and against GRPO where they must agree."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmnode.learn import grpo_loss, gspo_loss, sequence_log_ratio

# Row 0: A = +1, token log-ratios [0.2, -0.2] -> s = exp(0) = 1 (inside the band).
# Row 1: A = -1, one real token with log-ratio ln 0.5 -> s = 0.5, below 1 - 3e-4: clipped.
LOG_R = torch.tensor([[0.2, -0.2], [math.log(0.5), 3.0]], dtype=torch.float64)
ADV = torch.tensor([1.0, -1.0], dtype=torch.float64)
MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
OLD = torch.zeros(2, 2, dtype=torch.float64)


def test_sequence_log_ratio_is_the_masked_token_mean() -> None:
    torch.testing.assert_close(
        sequence_log_ratio(LOG_R, OLD, MASK), torch.tensor([0.0, math.log(0.5)], dtype=torch.float64)
    )


def test_gspo_loss_by_hand() -> None:
    loss, stats = gspo_loss(LOG_R.clone(), OLD, ADV, MASK)
    # row 0: -min(1 * 1, 1 * 1) = -1 ; row 1: -min(-0.5, -(1 - 3e-4)) = 0.9997 ; mean over B = 2
    assert loss.item() == pytest.approx((-1 + 0.9997) / 2)
    assert stats["clip_low_frac"] == pytest.approx(0.5)  # one completion of two
    assert stats["seq_ratio_mean"] == pytest.approx(0.75)


def test_gspo_gradient_by_hand() -> None:
    logp = LOG_R.clone().requires_grad_(True)
    loss, _ = gspo_loss(logp, OLD, ADV, MASK)
    loss.backward()
    # row 0 unclipped: d/dlogp_t of -s A / B = -(1/B) * A * s * (1/|y|) = -(1/2)(1)(1)(1/2)
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.25, -0.25], [0.0, 0.0]], dtype=torch.float64))


def test_gspo_kl_is_seq_mean_token_mean() -> None:
    ref = LOG_R + math.log(2)  # k3 = 1 - ln 2 on every token
    loss, stats = gspo_loss(LOG_R.clone(), OLD, ADV, MASK, beta=0.5, ref_logp=ref)
    assert loss.item() == pytest.approx((-1 + 0.9997) / 2 + 0.5 * (1 - math.log(2)))
    assert stats["kl"] == pytest.approx(1 - math.log(2))


def test_an_empty_completion_contributes_zero() -> None:
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    loss, _ = gspo_loss(LOG_R.clone(), OLD, ADV, mask)
    assert loss.item() == pytest.approx(-1 / 2)


def test_log_sequence_ratio_is_clamped_to_ten() -> None:
    logp = torch.full((1, 3), 50.0, dtype=torch.float64, requires_grad=True)
    loss, stats = gspo_loss(
        logp,
        torch.zeros(1, 3, dtype=torch.float64),
        torch.tensor([1.0], dtype=torch.float64),
        torch.ones(1, 3, dtype=torch.float64),
        eps_high=1e9,
    )
    assert stats["seq_ratio_mean"] == pytest.approx(math.exp(10))
    loss.backward()
    assert logp.grad is not None and torch.equal(logp.grad, torch.zeros_like(logp))


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.floats(-0.5, 0.5), st.floats(-2, 2)), min_size=1, max_size=5),
    st.sampled_from([(3e-4, 4e-4), (0.2, 0.28)]),
)
def test_with_one_token_per_completion_gspo_is_grpo(
    rows: list[tuple[float, float]], eps: tuple[float, float]
) -> None:
    log_r = torch.tensor([[r] for r, _ in rows], dtype=torch.float64)
    adv = torch.tensor([a for _, a in rows], dtype=torch.float64)
    mask = torch.ones_like(log_r)
    gspo, _ = gspo_loss(log_r, torch.zeros_like(log_r), adv, mask, eps_low=eps[0], eps_high=eps[1])
    grpo, _ = grpo_loss(log_r, torch.zeros_like(log_r), adv, mask, eps_low=eps[0], eps_high=eps[1])
    assert gspo.item() == pytest.approx(grpo.item(), abs=1e-12)


@settings(max_examples=30, deadline=None)
@given(st.integers(min_value=0, max_value=10_000))
def test_gspo_ignores_the_order_of_tokens_within_a_completion(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    log_r = torch.randn(3, 5, generator=gen, dtype=torch.float64) * 0.01
    adv = torch.randn(3, generator=gen, dtype=torch.float64)
    mask = torch.ones(3, 5, dtype=torch.float64)
    perm = torch.randperm(5, generator=gen)
    a, _ = gspo_loss(log_r, torch.zeros_like(log_r), adv, mask, eps_low=0.2, eps_high=0.2)
    b, _ = gspo_loss(log_r[:, perm], torch.zeros_like(log_r), adv, mask, eps_low=0.2, eps_high=0.2)
    assert a.item() == pytest.approx(b.item(), abs=1e-12)
