"""What the tools' tests share: a checkpoint made from a model and its optimizer, as a node saves one."""

from __future__ import annotations

import torch

from swarmnode.store.checkpoint import CheckpointState, capture_rng_state


def checkpoint_of(model: torch.nn.Module, optimizer: torch.optim.Optimizer, round_: int) -> CheckpointState:
    return CheckpointState(
        round=round_,
        policy_version=round_,
        model_state={k: v.detach().clone() for k, v in model.state_dict().items()},
        optimizer_state=optimizer.state_dict(),
        rng_state=capture_rng_state(),
    )
