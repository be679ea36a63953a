"""GSPO (arXiv 2507.18071): clip a sequence-level importance ratio instead of per-token ratios.

Owns: the GSPO loss and the sequence log-ratio it is built on. Must not: compute advantages, run a model,
or do any I/O.

Equations (GSPO paper, objective Eq. 5 with the sequence ratio s_i defined beside it; clip ranges
3e-4 / 4e-4 from its experiments section)::

    s_i   = (pi_theta(y_i|x) / pi_old(y_i|x)) ** (1/|y_i|) = exp(1/|y_i| * sum_t (logp_theta - logp_old))
    J     = 1/G * sum_i min(s_i * A_i, clip(s_i, 1 - eps_low, 1 + eps_high) * A_i)
    loss  = -J (+ beta * seq-mean-token-mean of the k3 KL, when a reference is given)

The gradient is ``s_i * A_i / |y_i| * sum_t grad logp_theta(y_t)`` inside the band and zero outside it,
as derived in the paper. This equals TRL's ``_compute_loss`` with
``importance_sampling_level="sequence"``, ``loss_type="grpo"`` (checked in the tests), and verl's
``core_algos.compute_policy_loss_gspo``, which writes the same objective in the GSPO-token form
``s_i,t = sg[s_i] * pi_theta(y_t) / sg[pi_theta(y_t)]`` (identical value and gradient when A is per sequence).

Where the references differ: verl clamps ``log s_i <= 10`` (upper side only) for numerical safety, TRL
not at all; ALGORITHMS.md asks for ``|log s_i| <= 10``, which we apply (``max_log_ratio``). Below
``e^-10`` the lower clip is active anyway for A < 0 and the ratio's gradient is already negligible for A > 0.
A completion with no tokens contributes 0 to the mean over the B completions (TRL's rule).
"""

from __future__ import annotations

import torch
from torch import Tensor

from swarmnode.learn.aggregate import aggregate
from swarmnode.learn.grpo import clip_stats, k3_kl

#: The clip band on s_i from the paper's experiments (HACPO's J_homo uses it too): about 1000x narrower
#: than a token-level band, because s_i is a per-token geometric mean.
EPS_LOW = 3e-4
EPS_HIGH = 4e-4


def sequence_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """(B,) log s_i: mean over each completion's tokens of ``logp - old_logp`` (0 when it has none)."""
    mask = mask.to(logp.dtype)
    return ((logp - old_logp) * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)


def gspo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = EPS_LOW,
    eps_high: float = EPS_HIGH,
    beta: float = 0.0,
    ref_logp: Tensor | None = None,
    max_log_ratio: float = 10.0,
    kl_ratio_correction: bool = False,
) -> tuple[Tensor, dict[str, float]]:
    """GSPO loss (to minimise) and float stats; same inputs as ``grpo_loss``.

    ``beta`` / ``ref_logp`` add a k3 KL aggregated seq-mean-token-mean, as TRL and verl do (HACPO's official
    recipe runs GSPO with a 0.001 KL). ``max_log_ratio`` clamps |log s_i|. ``kl_ratio_correction`` weights
    each completion's KL by s_i, as TRL's default ``use_bias_correction_kl`` does at sequence level.
    """
    if logp.dim() != 2 or logp.shape != old_logp.shape or logp.shape != mask.shape:
        raise ValueError(
            f"logp, old_logp and mask must all be (B, T); got {tuple(logp.shape)}, {tuple(old_logp.shape)}, "
            f"{tuple(mask.shape)}"
        )
    if advantages.shape != (logp.shape[0],):
        raise ValueError(f"advantages must be (B,) = ({logp.shape[0]},), got {tuple(advantages.shape)}")
    mask = mask.to(logp.dtype)
    adv = advantages.to(logp.dtype)
    has_tokens = (mask.sum(-1) > 0).to(logp.dtype)

    log_s = sequence_log_ratio(logp, old_logp.detach(), mask).clamp(-max_log_ratio, max_log_ratio)
    s = torch.exp(log_s)
    s_clipped = s.clamp(1.0 - eps_low, 1.0 + eps_high)
    per_sequence = -torch.min(s * adv, s_clipped * adv) * has_tokens
    loss = per_sequence.mean()

    stats: dict[str, float] = {}
    if beta != 0.0:
        if ref_logp is None:
            raise ValueError("beta != 0 needs ref_logp")
        kl = k3_kl(logp, ref_logp.detach())
        stats["kl"] = float((kl.detach() * mask).sum() / mask.sum().clamp(min=1.0))
        weighted = kl * s.unsqueeze(1) if kl_ratio_correction else kl
        loss = loss + beta * aggregate(weighted, mask, "seq-mean-token-mean")

    with torch.no_grad():
        stats["loss"] = float(loss)
        stats["seq_ratio_mean"] = float((s * has_tokens).sum() / has_tokens.sum().clamp(min=1.0))
        # Fractions of completions (not tokens) whose clip is active, like TRL's sequence-level metrics.
        stats.update(clip_stats(s.unsqueeze(1), adv.unsqueeze(1), has_tokens.unsqueeze(1), eps_low, eps_high))
    return loss, stats
