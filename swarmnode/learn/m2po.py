"""M2PO (arXiv 2510.01161): train on stale rollouts by bounding the second moment of the log-ratio.

Owns: the M2PO token mask and loss. Must not: decide which rollouts are too stale (the scheduler's bound),
run a model, or do any I/O.

Equations (M2PO paper: M2 Eq. 4, masking Algorithm 1, objective Eq. 5; tau_M2 = 0.04 in all its runs)::

    r_t   = pi_theta(y_t) / pi_behav(y_t)                  pi_behav = the policy that generated the token
    M2    = 1/N * sum_t (log r_t)^2                         over the N candidate tokens of the batch
    mask  = drop the candidates with the largest (log r)^2, as few as possible, until the mean of
            (log r)^2 over the remaining candidates is <= tau
    J     = 1 / sum_i |o_i| * sum_i sum_t M_it * r_it * A_i     (no eps-clip; normalised by ALL tokens,
                                                               paper footnote 2)

Candidates: by default every completion token (ALGORITHMS.md's rule). ``trust_region_only=True`` applies
the paper's Sec. 5.2 refinement ("only constrain trust-region tokens"): candidates are only the tokens
PPO could clip, ``A > 0 and r > 1`` or ``A < 0 and r < 1``; M2 is then their mean, and other tokens are
always kept. Both variants mask greedily exactly as Algorithm 1 (remove the argmax until the mean is
<= tau); removing the largest value never raises the mean, so the result is the minimal such mask.
If even the smallest candidate exceeds tau, every candidate is masked.

Not implemented: the authors' released code (Infini-AI-Lab/M2PO, ``compute_m2po_policy_loss``) instead
solves for one threshold on trust-region tokens and PPO-clips at ``[min(e^-tau', 0.7), max(e^tau', 1.5)]``.
Other references: AReaL ``docs/en/algorithms/m2po.md`` (same objective as here), Trinity-RFT's M2PO
loss (trust-region-only variant, token-mean over all valid tokens).
"""

from __future__ import annotations

import torch
from torch import Tensor


@torch.no_grad()
def m2po_mask(
    logp: Tensor,
    behav_logp: Tensor,
    mask: Tensor,
    tau: float = 0.04,
    *,
    advantages: Tensor | None = None,
) -> Tensor:
    """Keep-mask (B, T) float: ``mask`` minus the fewest largest-(log r)^2 tokens so that M2 <= ``tau``.

    With ``advantages`` (B,) given, only trust-region tokens are candidates (``trust_region_only`` above).
    """
    if logp.dim() != 2 or logp.shape != behav_logp.shape or logp.shape != mask.shape:
        raise ValueError(
            f"logp, behav_logp and mask must all be (B, T); got {tuple(logp.shape)}, "
            f"{tuple(behav_logp.shape)}, {tuple(mask.shape)}"
        )
    if tau < 0:
        raise ValueError(f"tau must be >= 0, got {tau}")
    valid = mask > 0
    log_r = (logp - behav_logp).to(torch.float64)  # float64: the sort/cumsum must not drift around tau
    candidates = valid
    if advantages is not None:
        if advantages.shape != (logp.shape[0],):
            raise ValueError(f"advantages must be (B,) = ({logp.shape[0]},), got {tuple(advantages.shape)}")
        adv = advantages.unsqueeze(1)
        candidates = valid & (((adv > 0) & (log_r > 0)) | ((adv < 0) & (log_r < 0)))

    second = log_r.square()[candidates]
    keep = valid.clone()
    n = second.numel()
    if n == 0 or float(second.mean()) <= tau:
        return keep.to(mask.dtype)

    # Removing the largest value never raises the mean, so "drop the argmax until mean <= tau" keeps the
    # longest prefix of the ascending order whose mean is <= tau. Summing that prefix directly (rather than
    # total minus the dropped values) keeps an all-zero remainder exactly 0, so tau = 0 behaves.
    ordered, order = torch.sort(second)
    counts = torch.arange(1, n + 1, dtype=ordered.dtype, device=ordered.device)
    fits = torch.nonzero(ordered.cumsum(0) / counts <= tau)
    n_keep = int(fits.max()) + 1 if fits.numel() else 0

    flat_index = torch.nonzero(candidates.reshape(-1)).squeeze(1)
    keep.view(-1)[flat_index[order[n_keep:]]] = False
    return keep.to(mask.dtype)


def m2po_loss(
    logp: Tensor,
    behav_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    tau: float = 0.04,
    trust_region_only: bool = False,
    max_log_ratio: float = 20.0,
) -> tuple[Tensor, dict[str, float]]:
    """M2PO loss ``-J`` (Eq. 5) and float stats; inputs as ``grpo_loss``, ``behav_logp`` as old policy.

    The mask is recomputed from the current ``logp`` on every call (it depends on theta) and carries no
    gradient. ``max_log_ratio`` clamps |log r| before exp, as in our GRPO.
    """
    if advantages.shape != (logp.shape[0],):
        raise ValueError(f"advantages must be (B,) = ({logp.shape[0]},), got {tuple(advantages.shape)}")
    keep = m2po_mask(
        logp.detach(), behav_logp.detach(), mask, tau, advantages=advantages if trust_region_only else None
    ).to(logp.dtype)
    mask = mask.to(logp.dtype)
    log_r = (logp - behav_logp.detach()).clamp(-max_log_ratio, max_log_ratio)
    ratio = torch.exp(log_r)
    per_token = -ratio * advantages.to(logp.dtype).unsqueeze(1)
    loss = (per_token * keep).sum() / mask.sum().clamp(min=1.0)

    with torch.no_grad():
        n_valid = mask.sum().clamp(min=1.0)
        second = log_r.square()
        stats = {
            "loss": float(loss),
            "m2_before": float((second * mask).sum() / n_valid),
            "m2_after": float((second * keep).sum() / keep.sum().clamp(min=1.0)),
            "masked_frac": float((mask - keep).sum() / n_valid),
            "ratio_mean": float((ratio * mask).sum() / n_valid),
        }
    return loss, stats
