"""Shared policies for engine tests: small, deterministic, built once per module."""

from __future__ import annotations

import pytest
import torch

from swarmnode.policy.model import Policy, build_tiny_policy


def peaked(policy: Policy, scale: float = 6.0) -> Policy:
    """Scale every matrix so next-token distributions are sharp: greedy argmax has no near-ties."""
    with torch.no_grad():
        for parameter in policy.model.parameters():
            if parameter.dim() == 2:
                parameter.mul_(scale)
    return policy


@pytest.fixture(scope="module")
def tiny() -> Policy:
    """The built-in tiny model at random init (near-uniform: long completions, EOS now and then)."""
    return build_tiny_policy(0)


@pytest.fixture(scope="module")
def sharp() -> Policy:
    """A tiny model with peaked distributions (for greedy agreement between engines)."""
    return peaked(build_tiny_policy(1))


#: Compact prompts of different lengths: exercises left padding.
PROMPTS = ["58+26=", "7+8=", "46-37=", "2-1=", "77+55=", "16+27=", "9-9=", "26-50="]
#: Prompts long enough for the grouped (shared prompt K/V) decode path.
LONG_PROMPTS = [
    "(12 + 30) * 2 - 7 / 1 = (3 + 4) * 5 - 6 =",
    "1+2+3+4+5+6+7+8+9+10+11+12=",
    "99 - 98 + 97 - 96 + 95 - 94 + 93 - 92 + 91 =",
]
