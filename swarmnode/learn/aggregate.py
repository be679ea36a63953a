"""Reduce a (B, T) matrix of per-token losses to one scalar, the four ways the GRPO family does it.

Owns: the aggregation rule only. Must not: compute losses, look at advantages, or do any I/O.

Notation: ``v[i, t]`` the per-token value, ``m[i, t]`` the 0/1 completion mask, ``|o_i| = sum_t m[i, t]``,
``B`` the number of sequences, ``T`` the padded length.

======================== ============================================== ==========================
mode (verl name)         formula                                        also known as
======================== ============================================== ==========================
token-mean               sum_i sum_t m v / sum_i |o_i|                  DAPO (arXiv 2503.14476,
                                                                        token-level loss), TRL
                                                                        ``loss_type="dapo"/"bnpo"``
seq-mean-token-mean      1/B sum_i (sum_t m v / |o_i|)                  GRPO (arXiv 2402.03300,
                                                                        Eq. 3), TRL ``"grpo"``
seq-mean-token-sum       1/B sum_i sum_t m v                            (verl only)
seq-mean-token-sum-norm  1/B sum_i sum_t m v / L                        Dr. GRPO (arXiv 2503.20783),
                                                                        TRL ``"dr_grpo"``
======================== ============================================== ==========================

``L`` is a constant length, ``norm_len`` (TRL uses ``max_completion_length``; default: ``T``).

Where the references disagree: verl ``core_algos.agg_loss`` computes seq-mean-token-sum-norm as
``sum_i sum_t m v / T`` *without* the ``1/B``; Dr. GRPO's own code and TRL (``grpo_trainer._compute_loss``,
``loss_type == "dr_grpo"``: ``(per_token_loss * mask).sum() / (B * max_completion_length)``) divide by ``B``
too. We follow TRL / Dr. GRPO, so every mode is a mean over the batch and learning rates stay comparable.
A sequence with no tokens counts as a zero in the sequence means (TRL's ``clamp(min=1)``), never NaN.
"""

from __future__ import annotations

from typing import Literal, get_args

from torch import Tensor

AggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
AGG_MODES: tuple[str, ...] = get_args(AggMode)


def aggregate(values: Tensor, mask: Tensor, mode: AggMode, *, norm_len: float | None = None) -> Tensor:
    """Aggregate per-token ``values`` (B, T) under ``mask`` (B, T) to a scalar by ``mode`` (see module doc).

    ``norm_len`` is the constant divisor ``L`` of ``seq-mean-token-sum-norm`` (default ``T``); it is an error
    to pass it with another mode.
    """
    if values.dim() != 2 or values.shape != mask.shape:
        raise ValueError(
            f"values and mask must both be (B, T); got {tuple(values.shape)} and {tuple(mask.shape)}"
        )
    if norm_len is not None and mode != "seq-mean-token-sum-norm":
        raise ValueError(f"norm_len only applies to seq-mean-token-sum-norm, not {mode!r}")
    m = mask.to(values.dtype)
    masked = values * m
    batch = values.shape[0]
    if mode == "token-mean":
        return masked.sum() / m.sum().clamp(min=1.0)
    if mode == "seq-mean-token-mean":
        return (masked.sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
    if mode == "seq-mean-token-sum":
        return masked.sum(-1).mean()
    if mode == "seq-mean-token-sum-norm":
        length = float(values.shape[1]) if norm_len is None else float(norm_len)
        if length <= 0:
            raise ValueError(f"norm_len must be positive, got {norm_len}")
        return masked.sum() / (batch * length)
    raise ValueError(f"unknown aggregation mode {mode!r}; expected one of {AGG_MODES}")
