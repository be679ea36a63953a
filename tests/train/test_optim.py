"""The optimizer every update uses (``swarmnode.train.optim``)."""

from __future__ import annotations

import copy

import torch

from swarmnode.policy import build_tiny_policy
from swarmnode.train.optim import adamw, load_optimizer_state


def _after_steps(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int, seed: int
) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=generator)
        optimizer.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_the_fused_adamw_on_cpu_takes_the_steps_the_per_tensor_loop_takes() -> None:
    model = build_tiny_policy(0).model
    start = torch.cat([p.detach().flatten() for p in model.parameters()])
    looped = copy.deepcopy(model)
    fused = adamw(model.parameters(), lr=1e-3, weight_decay=0.01)
    reference = torch.optim.AdamW(looped.parameters(), lr=1e-3, weight_decay=0.01)
    assert fused.param_groups[0]["fused"] is True and not reference.param_groups[0]["fused"]
    ours, theirs = _after_steps(model, fused, 3, seed=0), _after_steps(looped, reference, 3, seed=0)
    assert (ours - start).abs().max() > 1e-3  # three steps of lr 1e-3 moved the weights
    torch.testing.assert_close(ours, theirs, rtol=0.0, atol=1e-6)


def test_a_state_saved_by_the_per_tensor_loop_resumes_fused_where_it_left_off() -> None:
    # Checkpoints written before the fused kernel hold the loop's groups (fused: None): loading
    # one must neither switch the node back to the loop nor lose its moments and step count.
    model = build_tiny_policy(0).model
    looped = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    _after_steps(model, looped, 2, seed=0)
    saved = copy.deepcopy(looped.state_dict())  # as read back from a checkpoint file
    resumed_model = copy.deepcopy(model)
    resumed = adamw(resumed_model.parameters(), lr=1e-3, weight_decay=0.01)
    load_optimizer_state(resumed, saved)
    assert resumed.param_groups[0]["fused"] is True
    ours, theirs = _after_steps(resumed_model, resumed, 1, seed=1), _after_steps(model, looped, 1, seed=1)
    torch.testing.assert_close(ours, theirs, rtol=0.0, atol=1e-6)
