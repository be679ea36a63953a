"""DAPO (arXiv 2503.14476): clip-higher, token-level loss, dynamic sampling, soft overlong punishment.

Owns: the three DAPO rules that are pure functions of tensors. Must not: resample prompts (the trainer
decides what to do with the groups ``dynamic_sampling_keep`` rejects), run a model, or do any I/O.

Equations (DAPO paper: objective and its constraint Eqs. 8-12 in Sec. 3.1-3.3, dynamic sampling Eq. 11,
soft overlong punishment Eq. 13 in Sec. 3.4)::

    J = 1 / sum_i |o_i| * sum_i sum_t min(rho_t A_i, clip(rho_t, 1 - eps_low, 1 + eps_high) A_i)
        eps_low = 0.2, eps_high = 0.28 (clip-higher), token-level aggregation ("token-mean")
    subject to 0 < |{o_i : o_i is correct}| < G            (dynamic sampling: keep informative groups)

    R_length(y) =  0                                  if |y| <= L_max - L_cache
                   ((L_max - L_cache) - |y|) / L_cache if L_max - L_cache < |y| <= L_max
                   -1                                 if |y| > L_max

Reference implementations: TRL ``GRPOTrainer._compute_loss`` with ``loss_type="dapo"`` (token-mean over
``num_items_in_batch``) and ``trl.rewards.get_soft_overlong_punishment``; verl ``recipe/dapo``
(``filter_groups`` keeps groups whose metric has std > 0; the overlong reward is
``min(-(|y| - (L_max - L_cache)) / L_cache * factor, 0)`` with no -1 floor, which only differs once
``|y| > L_max``, a length the generator never produces).
DAPO's other overlong rule, overlong *filtering* (zero loss mask for truncated completions), is a one-line
mask edit the trainer makes from ``Completion.finished``; it needs no function here.
"""

from __future__ import annotations

import torch
from torch import Tensor

from swarmnode.learn.grpo import grpo_loss


def dynamic_sampling_keep(rewards: Tensor, *, correct_at: float | None = 1.0) -> Tensor:
    """Bool (n_groups,) mask of groups worth training on, for ``rewards`` (n_groups, G).

    ``correct_at`` (default 1.0): a completion counts as correct when its reward is >= this; a group is kept
    iff ``0 < #correct < G`` (the paper's rule). ``correct_at=None``: keep a group iff its rewards are not all
    equal (verl's ``filter_groups`` on reward std), which also keeps partial-credit groups.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be (n_groups, G), got shape {tuple(rewards.shape)}")
    if correct_at is None:
        return (rewards != rewards[:, :1]).any(dim=1)
    n_correct = (rewards >= correct_at).sum(dim=1)
    return (n_correct > 0) & (n_correct < rewards.shape[1])


def overlong_penalty(lengths: Tensor, max_len: int, cache_len: int, *, factor: float = 1.0) -> Tensor:
    """Soft overlong punishment R_length (Eq. 13) for completion ``lengths`` (any shape, in tokens).

    Added to the task reward before advantages are computed. ``factor`` scales it (verl's
    ``overlong_buffer.penalty_factor``; 1.0 in the paper). ``cache_len = 0`` gives a hard -1 beyond max_len.
    """
    if not 0 <= cache_len <= max_len:
        raise ValueError(f"need 0 <= cache_len <= max_len, got cache_len={cache_len}, max_len={max_len}")
    lengths = lengths.to(torch.float32)
    if cache_len == 0:
        penalty = torch.where(lengths > max_len, -1.0, 0.0)
    else:
        soft_start = max_len - cache_len
        penalty = ((soft_start - lengths) / cache_len).clamp(min=-1.0, max=0.0)
        penalty = torch.where(lengths > max_len, -1.0, penalty)
    return penalty * factor


def dapo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    beta: float = 0.0,
    ref_logp: Tensor | None = None,
    kl_ratio_correction: bool = False,
) -> tuple[Tensor, dict[str, float]]:
    """DAPO loss: GRPO's clipped surrogate with clip-higher (0.2 / 0.28) and token-mean aggregation.

    Same inputs as ``grpo_loss``. DAPO itself uses no KL (beta 0); it stays available for experiments.
    The token mean is over this call's batch: split a batch into micro-batches only if each is its own step.
    """
    return grpo_loss(
        logp,
        old_logp,
        advantages,
        mask,
        eps_low=eps_low,
        eps_high=eps_high,
        beta=beta,
        ref_logp=ref_logp,
        agg="token-mean",
        kl_ratio_correction=kl_ratio_correction,
    )
