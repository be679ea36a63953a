"""GRPO: the token-level clipped surrogate with group-relative advantages, and the k3 KL penalty.

Owns: the GRPO loss and the two pieces the other losses reuse (``k3_kl``, ``clip_stats``).
Must not: compute advantages (see ``advantages.py``), run a model, or do any I/O.

Equations (DeepSeekMath, arXiv 2402.03300, Eq. 3 and Eq. 4; asymmetric clip from DAPO, arXiv 2503.14476)::

    rho_t    = exp(logp_theta(y_t) - logp_old(y_t))
    l_t      = -min(rho_t * A_i, clip(rho_t, 1 - eps_low, 1 + eps_high) * A_i) + beta * KL_t
    KL_t     = pi_ref/pi_theta - log(pi_ref/pi_theta) - 1                      (k3 estimator, Eq. 4)
    loss     = aggregate(l, mask, agg)                                          (see aggregate.py)

Reference implementations: TRL ``trl/trainer/grpo_trainer.py::GRPOTrainer._compute_loss``
(``loss_type`` "grpo" = seq-mean-token-mean, "dapo"/"bnpo" = token-mean, "dr_grpo" =
seq-mean-token-sum-norm with ``norm_len = max_completion_length``); verl
``verl/trainer/ppo/core_algos.py::compute_policy_loss_vanilla`` + ``agg_loss``. The tests check our numbers
and gradients against TRL's ``_compute_loss`` on the same model and inputs.

Choices where the references differ:

- The log-ratio is clamped to +-``max_log_ratio`` (20) before ``exp``, as verl does, so a very stale token
  cannot overflow to inf and poison the batch with NaN; TRL does not clamp. Identical for |log rho| < 20.
- verl's default dual-clip (``clip_ratio_c = 3``, a floor of ``-3 * A`` on the loss of negative-advantage
  tokens) is not applied: neither the GRPO paper nor TRL has it.
- The KL term is added per token before aggregation (TRL); verl aggregates it separately with the same
  mode, which is the same number since aggregation is linear.
- ``kl_ratio_correction=True`` multiplies the per-token KL by rho (DeepSeek-V3.2, arXiv 2512.02556:
  the unbiased reverse-KL gradient off-policy). TRL 1.16 turns this on by default
  (``use_bias_correction_kl=True``); the GRPO paper and verl do not, and neither do we by default.
"""

from __future__ import annotations

import torch
from torch import Tensor

from swarmnode.learn.aggregate import AggMode, aggregate


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(pi_theta || pi_ref): ``exp(ref - logp) - (ref - logp) - 1`` (>= 0)."""
    delta = ref_logp - logp
    return torch.exp(delta) - delta - 1.0


def _masked_mean(values: Tensor, mask: Tensor) -> float:
    return float((values * mask).sum() / mask.sum().clamp(min=1.0))


def clip_stats(
    ratio: Tensor, advantages: Tensor, mask: Tensor, eps_low: float, eps_high: float
) -> dict[str, float]:
    """Fractions of masked tokens whose clip is active (TRL's ``clip_ratio/*`` metrics).

    ``ratio`` is (B, T) or (B, 1) for sequence-level ratios; ``advantages`` broadcasts against it.
    """
    low = ((ratio < 1.0 - eps_low) & (advantages < 0)).to(mask.dtype)
    high = ((ratio > 1.0 + eps_high) & (advantages > 0)).to(mask.dtype)
    low, high = low.expand_as(mask), high.expand_as(mask)
    return {
        "clip_low_frac": _masked_mean(low, mask),
        "clip_high_frac": _masked_mean(high, mask),
        "clip_frac": _masked_mean(low + high, mask),
    }


def _check_shapes(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor) -> None:
    if logp.dim() != 2 or logp.shape != old_logp.shape or logp.shape != mask.shape:
        raise ValueError(
            f"logp, old_logp and mask must all be (B, T); got {tuple(logp.shape)}, {tuple(old_logp.shape)}, "
            f"{tuple(mask.shape)}"
        )
    if advantages.shape != (logp.shape[0],):
        raise ValueError(f"advantages must be (B,) = ({logp.shape[0]},), got {tuple(advantages.shape)}")


def grpo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    beta: float = 0.0,
    ref_logp: Tensor | None = None,
    agg: AggMode = "seq-mean-token-mean",
    norm_len: float | None = None,
    max_log_ratio: float = 20.0,
    kl_ratio_correction: bool = False,
) -> tuple[Tensor, dict[str, float]]:
    """GRPO loss (to minimise) and float stats.

    Args:
        logp: (B, T) log-probs of the completion tokens under the policy being trained (carries grad).
        old_logp: (B, T) log-probs under the policy that generated them (no grad needed).
        advantages: (B,) one advantage per completion.
        mask: (B, T) 1 for completion tokens, 0 for padding.
        eps_low, eps_high: the clip band ``[1 - eps_low, 1 + eps_high]``.
        beta: weight of the k3 KL to ``ref_logp`` (0 = no reference model needed).
        kl_ratio_correction: weight the per-token KL by rho (TRL's ``use_bias_correction_kl``).
        agg: aggregation mode (aggregate.py); ``norm_len`` is its L for seq-mean-token-sum-norm.
        max_log_ratio: clamp on |logp - old_logp| before exp (verl's 20).
    """
    _check_shapes(logp, old_logp, advantages, mask)
    mask = mask.to(logp.dtype)
    adv = advantages.to(logp.dtype).unsqueeze(1)  # (B, 1): every token of completion i shares A_i

    log_ratio = (logp - old_logp.detach()).clamp(-max_log_ratio, max_log_ratio)
    ratio = torch.exp(log_ratio)
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    per_token = -torch.min(ratio * adv, clipped * adv)

    stats: dict[str, float] = {}
    if beta != 0.0:
        if ref_logp is None:
            raise ValueError("beta != 0 needs ref_logp")
        kl = k3_kl(logp, ref_logp.detach())
        stats["kl"] = _masked_mean(kl.detach(), mask)
        per_token = per_token + beta * (kl * ratio if kl_ratio_correction else kl)

    loss = aggregate(per_token, mask, agg, norm_len=norm_len)

    with torch.no_grad():
        stats["loss"] = float(loss)
        stats["ratio_mean"] = _masked_mean(ratio, mask)
        stats["approx_kl_old"] = _masked_mean(-log_ratio, mask)
        stats.update(clip_stats(ratio, adv, mask, eps_low, eps_high))
    return loss, stats
