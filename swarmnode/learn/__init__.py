"""Losses and sample-selection rules for RL on language models: pure torch functions, no I/O.

One file per algorithm, each readable top to bottom beside its equation and sources:
advantages (group-relative), aggregate (loss reduction modes), grpo, dapo, gspo, hacpo, m2po, sapo,
transfer (sharing rules that teach a node its peers' skills).
Shapes: logp / old_logp / ref_logp / mask are (B, T) float, advantages (B,); a loss returns
``(scalar tensor to minimise, dict[str, float] of stats)``. This package must not run models, read files or
talk to peers.
"""

from swarmnode.learn.advantages import group_advantages, zero_advantage
from swarmnode.learn.aggregate import AGG_MODES, AggMode, aggregate
from swarmnode.learn.dapo import dapo_loss
from swarmnode.learn.grpo import clip_stats, grpo_loss, k3_kl
from swarmnode.learn.gspo import gspo_loss, sequence_log_ratio
from swarmnode.learn.hacpo import (
    CapabilityTracker,
    capability_advantages,
    discrepancy_coefficients,
    exponential_is,
    hacpo_loss,
    sequence_mean_logp,
    stepwise_clip_lower,
)
from swarmnode.learn.m2po import m2po_loss, m2po_mask
from swarmnode.learn.sapo import HasRewards, fair_sample, has_signal, select_groups

__all__ = [
    "AGG_MODES",
    "AggMode",
    "CapabilityTracker",
    "HasRewards",
    "aggregate",
    "capability_advantages",
    "clip_stats",
    "dapo_loss",
    "discrepancy_coefficients",
    "exponential_is",
    "fair_sample",
    "group_advantages",
    "grpo_loss",
    "gspo_loss",
    "hacpo_loss",
    "has_signal",
    "k3_kl",
    "m2po_loss",
    "m2po_mask",
    "select_groups",
    "sequence_log_ratio",
    "sequence_mean_logp",
    "stepwise_clip_lower",
    "zero_advantage",
]
