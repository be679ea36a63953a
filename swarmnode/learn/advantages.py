"""Group-relative advantages for outcome rewards (one scalar reward per completion).

Owns: turning a (n_groups, G) reward matrix into a (n_groups, G) advantage matrix, and the one
definition of a zero-advantage group (``zero_advantage``).
Must not: know where rewards come from, or touch tokens (every token of completion i gets A_i).

Equation (DeepSeekMath, arXiv 2402.03300, Sec. 4.1.2, outcome supervision)::

    A_i = (r_i - mean(r)) / (std(r) + eps)            mean and std over the G completions of one prompt

Reference implementations:

- verl ``core_algos.compute_grpo_outcome_advantage``: eps 1e-6, unbiased std (``torch.std``),
  ``norm_adv_by_std_in_grpo=False`` drops the division (Dr. GRPO, arXiv 2503.20783).
- TRL ``grpo_trainer._generate_and_score_completions``: eps 1e-4, unbiased std (``nanstd``),
  ``scale_rewards`` in {"group", "batch", "none"}; "batch" divides by the std of *all* rewards in the batch
  but still subtracts the per-group mean; "none" = Dr. GRPO.

``scale`` follows TRL's three names; ``eps`` defaults to verl's 1e-6 (pass ``eps=1e-4`` for TRL's numbers).

A group of one completion gets advantage 0 (it has no baseline to compare with). This is our rule, and
it differs from verl, which gives such a group mean 0 / std 1, i.e. ``A = r / (1 + eps)``; TRL never
trains on G = 1. A group whose rewards are all equal gets advantage 0 under every scale.

Zero-advantage group: all its rewards equal (compared exactly; a group of one or none counts). Its
advantages are 0 under every scale above, so it carries no learning signal. Every rule that tests for it
calls ``zero_advantage``: the trainer's ``learn.drop_zero_advantage``, SAPO's filter (``sapo.has_signal``),
HACPO's baseline guard (``hacpo.capability_advantages``) and the simulator's early skip.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import torch
from torch import Tensor

Scale = Literal["group", "batch", "none"]


def group_advantages(
    rewards: Tensor, *, eps: float = 1e-6, scale: Scale = "group", unbiased: bool = True
) -> Tensor:
    """Advantages (n_groups, G) for ``rewards`` (n_groups, G): subtract each group's mean, divide by a std.

    ``scale``: "group" divides by each group's std, "batch" by the std of all rewards, "none" not at all.
    ``unbiased``: Bessel-corrected std (verl and TRL both use it).
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be (n_groups, G), got shape {tuple(rewards.shape)}")
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"scale must be 'group', 'batch' or 'none', got {scale!r}")
    rewards = rewards.detach().to(torch.float32) if not rewards.is_floating_point() else rewards.detach()
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError("rewards must all be finite")
    if rewards.shape[1] == 1:
        return torch.zeros_like(rewards)
    centered = rewards - rewards.mean(dim=1, keepdim=True)
    correction = 1 if unbiased else 0
    if scale == "none":
        return centered
    if scale == "group":
        std = rewards.std(dim=1, keepdim=True, correction=correction)
    else:
        std = rewards.std(correction=correction)
    denominator = std + eps
    # With eps = 0 an all-equal group would be 0 / 0; its advantages are 0 by definition.
    safe = denominator.clamp(min=torch.finfo(rewards.dtype).tiny)
    return torch.where(denominator > 0, centered / safe, 0.0)


def zero_advantage(rewards: Iterable[float]) -> bool:
    """True when a group with these rewards is a zero-advantage group: its rewards are all equal."""
    values = iter(rewards)
    first = next(values, None)
    return first is None or all(value == first for value in values)
