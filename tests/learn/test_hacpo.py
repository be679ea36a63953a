"""HACPO: capability tracking, capability-aware advantages, exponential IS, stepwise clipping, the loss."""

import math

import pytest
import torch

from swarmnode.learn import (
    CapabilityTracker,
    capability_advantages,
    discrepancy_coefficients,
    exponential_is,
    gspo_loss,
    hacpo_loss,
    sequence_mean_logp,
    stepwise_clip_lower,
)


def _tracker() -> CapabilityTracker:
    tracker = CapabilityTracker(window=2)
    for value in (0.2, 0.4, 0.6):  # window 2 keeps [0.4, 0.6]: P(a) = 0.5
        tracker.update("a", value)
    tracker.update("b", 0.25)  # P(b) = 0.25
    tracker.update("c", 0.001)  # P(c) = 0.001
    return tracker


def test_capability_is_the_mean_of_the_last_k_batch_means() -> None:
    tracker = _tracker()
    assert tracker.capability("a") == pytest.approx(0.5)
    assert tracker.capability("b") == pytest.approx(0.25)
    assert tracker.capability("nobody") is None


def test_capability_ratio_by_hand_and_clamped_to_0_1_and_10() -> None:
    tracker = _tracker()
    assert tracker.ratio("a", "b") == pytest.approx(2.0)
    assert tracker.ratio("b", "a") == pytest.approx(0.5)
    assert tracker.ratio("a", "c") == pytest.approx(10.0)  # 500, clamped
    assert tracker.ratio("c", "a") == pytest.approx(0.1)  # 0.002, clamped
    assert tracker.ratio("a", "newcomer") == 1.0  # no history: neutral


def test_a_zero_capability_is_floored_not_a_division_by_zero() -> None:
    tracker = CapabilityTracker()
    tracker.update("zero", 0.0)
    tracker.update("b", 0.5)
    assert tracker.ratio("b", "zero") == pytest.approx(10.0)
    assert tracker.ratio("zero", "b") == pytest.approx(0.1)


def test_tracker_rejects_non_finite_values_and_round_trips_its_state() -> None:
    tracker = _tracker()
    with pytest.raises(ValueError, match="finite"):
        tracker.update("a", float("nan"))
    copy = CapabilityTracker(window=2)
    copy.load_state_dict(tracker.state_dict())
    assert copy.state_dict() == tracker.state_dict() == {"a": [0.4, 0.6], "b": [0.25], "c": [0.001]}
    copy.forget("c")
    assert copy.agents() == ["a", "b"]


def test_the_tracker_forgets_the_agent_updated_least_recently_past_its_bound() -> None:
    # Red team rt61 F2: every signer that ever sent a group stayed (memory and checkpoints grew by
    # one entry a signer); signers are free.
    tracker = CapabilityTracker(window=2, max_agents=3)
    for agent in ("local", "a", "b"):
        tracker.update(agent, 0.5)
    tracker.update("local", 0.7)  # our own sample each step keeps us in
    tracker.update("c", 0.1)
    assert tracker.agents() == ["b", "c", "local"]  # "a" went: the least recently updated
    tracker.update("d", 0.2)
    assert tracker.agents() == ["c", "d", "local"] and tracker.capability("local") == pytest.approx(0.6)
    assert tracker.ratio("local", "a") == 1.0  # forgotten: neutral, as a newcomer
    copy = CapabilityTracker(window=2, max_agents=2)
    copy.load_state_dict(tracker.state_dict())  # a checkpoint of a larger tracker: the two updated last
    assert copy.agents() == ["c", "d"]


def test_capability_aware_advantages_by_hand() -> None:
    # learner a (P 0.5), responses from a and b (P 0.25): w(a, a) = 1, w(a, b) = 2
    # mu = (1*1 + 1*0 + 2*1 + 2*0) / 4 = 0.75; std of [1, 0, 1, 0] = sqrt(1/3) = 0.57735
    # A = (R - 0.75) / 0.57735 = [0.433013, -1.299038, 0.433013, -1.299038]
    adv = capability_advantages(
        torch.tensor([1.0, 0.0, 1.0, 0.0]), ["a", "a", "b", "b"], "a", _tracker(), eps=0.0
    )
    torch.testing.assert_close(adv, torch.tensor([0.433013, -1.299038, 0.433013, -1.299038]))


def test_baseline_above_one_falls_back_to_the_learners_own_mean() -> None:
    # mu = (0 + 2 + 2 + 2) / 4 = 1.5 > 1 -> own mean = 0; std of [0, 1, 1, 1] = 0.5 -> A = R / 0.5
    rewards = torch.tensor([0.0, 1.0, 1.0, 1.0])
    adv = capability_advantages(rewards, ["a", "b", "b", "b"], "a", _tracker(), eps=0.0)
    torch.testing.assert_close(adv, torch.tensor([0.0, 2.0, 2.0, 2.0]))
    # without the guard the baseline stays 1.5: A = (R - 1.5) / 0.5
    raw = capability_advantages(rewards, ["a", "b", "b", "b"], "a", _tracker(), eps=0.0, binary_guard=False)
    torch.testing.assert_close(raw, torch.tensor([-3.0, -1.0, -1.0, -1.0]))


def test_equal_rewards_give_zero_advantages_whatever_the_weights() -> None:
    adv = capability_advantages(torch.tensor([1.0, 1.0, 1.0]), ["a", "b", "c"], "a", _tracker())
    assert torch.equal(adv, torch.zeros(3))


def test_with_equal_capabilities_the_advantage_is_plain_grpo_on_the_joint_group() -> None:
    tracker = CapabilityTracker()
    tracker.update("a", 0.5)
    tracker.update("b", 0.5)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    adv = capability_advantages(rewards, ["a", "a", "b", "b"], "a", tracker, eps=0.0)
    torch.testing.assert_close(adv, torch.tensor([0.866025, -0.866025, -0.866025, 0.866025]))


def test_discrepancy_coefficient_is_source_over_learner() -> None:
    coeff = discrepancy_coefficients(["a", "b", "c"], "a", _tracker())
    torch.testing.assert_close(coeff, torch.tensor([1.0, 0.5, 0.1]))


def test_exponential_is_value_and_gradient() -> None:
    s = torch.tensor(2.0, requires_grad=True)
    value = exponential_is(s, alpha=1.0)
    value.backward()
    assert value.item() == pytest.approx(4.0)  # s * sg[s]
    assert s.grad is not None and s.grad.item() == pytest.approx(2.0)  # sg[s]^alpha
    assert exponential_is(torch.tensor(2.0), alpha=3.0).item() == pytest.approx(16.0)


def test_stepwise_clip_lower_rises_from_0_8_by_0_025_per_update_up_to_1() -> None:
    assert [stepwise_clip_lower(m) for m in (0, 4, 8, 100)] == pytest.approx([0.8, 0.9, 1.0, 1.0])
    with pytest.raises(ValueError):
        stepwise_clip_lower(-1)


# Hete example: row 0 learner mean log-prob -1.1 and s = 0.9; row 1 (one token) s = 1.5.
HETE_LOGP = torch.tensor([[-1.0, -1.2], [-0.5, 9.0]], dtype=torch.float64)
HETE_MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
HETE_SOURCE = torch.tensor([-1.1 - math.log(0.9), -0.5 - math.log(1.5)], dtype=torch.float64)
HETE_ADV = torch.tensor([1.0, -0.5], dtype=torch.float64)
HETE_W = torch.tensor([2.0, 0.5], dtype=torch.float64)


def foreign_loss(
    logp: torch.Tensor,
    mask: torch.Tensor,
    source_mean_logp: torch.Tensor,
    advantages: torch.Tensor,
    capability_ratio: torch.Tensor,
    *,
    update_index: int,
    alpha: float = 1.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``hacpo_loss`` on foreign responses only: ``-J_hete`` averaged over them."""
    is_self = torch.zeros(logp.shape[0], dtype=torch.bool)
    return hacpo_loss(
        logp,
        mask,
        source_mean_logp,
        advantages,
        capability_ratio,
        is_self,
        update_index=update_index,
        alpha=alpha,
    )


def test_hete_loss_by_hand() -> None:
    # row 0: clip(0.9, 0.8, 1) * 0.9^1 * w 2 * A 1 = 1.62 ; row 1: clip(1.5) = 1 -> 1 * 1 * 0.5 * -0.5 = -0.25
    loss, stats = foreign_loss(HETE_LOGP, HETE_MASK, HETE_SOURCE, HETE_ADV, HETE_W, update_index=0)
    assert loss.item() == pytest.approx(-(1.62 - 0.25) / 2)
    assert stats["cross_clip_upper_frac"] == pytest.approx(0.5)
    assert stats["clip_lower"] == pytest.approx(0.8)
    # alpha 3: row 0 becomes 0.9^4 * 2 = 1.3122
    loss3, _ = foreign_loss(HETE_LOGP, HETE_MASK, HETE_SOURCE, HETE_ADV, HETE_W, update_index=0, alpha=3.0)
    assert loss3.item() == pytest.approx(-(1.3122 - 0.25) / 2)


def test_hete_gradient_by_hand_zero_above_one() -> None:
    logp = HETE_LOGP.clone().requires_grad_(True)
    loss, _ = foreign_loss(logp, HETE_MASK, HETE_SOURCE, HETE_ADV, HETE_W, update_index=0)
    loss.backward()
    # row 0: d/dlogp_t of -(s * sg[s] * w * A) / B = -(0.9 * 2 * 1) * (0.9 / 2) / 2 = -0.405; row 1 clipped: 0
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.405, -0.405], [0.0, 0.0]], dtype=torch.float64))


def test_stepwise_clipping_stops_the_gradient_of_a_sample_below_the_rising_bound() -> None:
    # s = 0.85: inside [0.8, 1] at m = 0, below [0.9, 1] at m = 4
    source = torch.tensor([-1.1 - math.log(0.85)], dtype=torch.float64)
    grads = []
    for m in (0, 4):
        logp = HETE_LOGP[:1].clone().requires_grad_(True)
        loss, _ = foreign_loss(logp, HETE_MASK[:1], source, HETE_ADV[:1], HETE_W[:1], update_index=m)
        loss.backward()
        assert logp.grad is not None
        grads.append(logp.grad.abs().sum().item())
    assert grads[0] > 0 and grads[1] == 0


def test_hacpo_on_own_samples_only_is_gspo() -> None:
    gen = torch.Generator().manual_seed(0)
    logp = torch.randn(4, 5, generator=gen, dtype=torch.float64)
    old = logp + torch.randn(4, 5, generator=gen, dtype=torch.float64) * 1e-4
    mask = torch.tensor([[1.0] * n + [0.0] * (5 - n) for n in (5, 3, 1, 4)], dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.3], dtype=torch.float64)
    ours, _ = hacpo_loss(
        logp,
        mask,
        sequence_mean_logp(old, mask),
        adv,
        torch.full((4,), 7.0, dtype=torch.float64),
        torch.ones(4, dtype=torch.bool),
        update_index=0,
    )
    gspo, _ = gspo_loss(logp, old, adv, mask)
    assert ours.item() == pytest.approx(gspo.item(), abs=1e-12)


def test_hacpo_loss_weighs_every_response_equally_across_own_and_foreign() -> None:
    gen = torch.Generator().manual_seed(1)
    logp = torch.randn(5, 4, generator=gen, dtype=torch.float64) - 1.0
    mask = torch.ones(5, 4, dtype=torch.float64)
    old_mean = sequence_mean_logp(logp, mask) + torch.randn(5, generator=gen, dtype=torch.float64) * 0.1
    adv = torch.randn(5, generator=gen, dtype=torch.float64)
    w = torch.tensor([1.0, 1.0, 2.0, 0.5, 3.0], dtype=torch.float64)
    own = torch.tensor([True, True, False, False, False])
    total, _ = hacpo_loss(logp, mask, old_mean, adv, w, own, update_index=2)
    homo, _ = gspo_loss(
        logp[own],
        logp[own] - (sequence_mean_logp(logp, mask) - old_mean)[own].unsqueeze(1),
        adv[own],
        mask[own],
    )
    hete, _ = foreign_loss(logp[~own], mask[~own], old_mean[~own], adv[~own], w[~own], update_index=2)
    assert total.item() == pytest.approx((2 * homo.item() + 3 * hete.item()) / 5, abs=1e-12)


def test_hacpo_kl_applies_to_own_rows_only() -> None:
    logp = torch.zeros(2, 2, dtype=torch.float64)
    mask = torch.ones(2, 2, dtype=torch.float64)
    ref = torch.tensor([[math.log(2), math.log(2)], [5.0, 5.0]], dtype=torch.float64)  # foreign row: huge KL
    own = torch.tensor([True, False])
    args = (
        logp,
        mask,
        torch.zeros(2, dtype=torch.float64),
        torch.zeros(2, dtype=torch.float64),
        torch.ones(2, dtype=torch.float64),
        own,
    )
    loss, stats = hacpo_loss(*args, update_index=0, beta=0.001, ref_logp=ref)
    # advantages 0 -> policy term 0; KL = 1 - ln 2 on the own row only
    assert loss.item() == pytest.approx(0.001 * (1 - math.log(2)))
    assert stats["kl"] == pytest.approx(1 - math.log(2))


def test_junk_capability_ratio_on_own_rows_cannot_reach_the_gradient() -> None:
    logp = torch.zeros(1, 2, dtype=torch.float64, requires_grad=True)
    loss, _ = hacpo_loss(
        logp,
        torch.ones(1, 2, dtype=torch.float64),
        torch.zeros(1, dtype=torch.float64),
        torch.ones(1, dtype=torch.float64),
        torch.tensor([float("nan")], dtype=torch.float64),
        torch.tensor([True]),
        update_index=0,
    )
    loss.backward()
    assert logp.grad is not None and bool(torch.isfinite(logp.grad).all())


def test_guard_without_own_responses_uses_the_plain_mean() -> None:
    # learner a has no response here; mu = (2 + 2 + 0) / 3 > 1 -> plain mean 2/3; std of [1, 1, 0] = 0.57735
    adv = capability_advantages(torch.tensor([1.0, 1.0, 0.0]), ["b", "b", "b"], "a", _tracker(), eps=0.0)
    torch.testing.assert_close(adv, torch.tensor([0.57735, 0.57735, -1.154701]))


def test_non_finite_rewards_are_rejected() -> None:
    with pytest.raises(ValueError, match="finite"):
        capability_advantages(torch.tensor([1.0, float("inf")]), ["a", "b"], "a", _tracker())
