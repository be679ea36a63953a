"""DAPO (arXiv 2503.14476): the clip-higher, token-level loss.

Owns: DAPO's loss, GRPO's clipped surrogate with clip-higher and token-mean aggregation. Must not: run a
model or do any I/O.

Equation (DAPO paper: the objective, Eqs. 8-10 in Sec. 3.1-3.3)::

    J = 1 / sum_i |o_i| * sum_i sum_t min(rho_t A_i, clip(rho_t, 1 - eps_low, 1 + eps_high) A_i)
        eps_low = 0.2, eps_high = 0.28 (clip-higher), token-level aggregation ("token-mean")

Reference implementation: TRL ``GRPOTrainer._compute_loss`` with ``loss_type="dapo"`` (token-mean over
``num_items_in_batch``).
DAPO's other rules are not implemented here. Dynamic sampling (Eq. 11, keep groups with
``0 < #correct < G``) is, for 0/1 rewards, the sampler's rule of dropping groups whose rewards are all
equal (``swarmnode.learn.advantages.zero_advantage``); the soft overlong punishment (Eq. 13) and overlong
filtering are not used by the trainer (unused functions for them were removed, issue #13).
"""

from __future__ import annotations

from torch import Tensor

from swarmnode.learn.grpo import grpo_loss


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
