"""Rollout engines: sample completions with per-token log-probs from a policy.

Owns: choosing an engine by name. ``torch`` is the fast plain-torch sampler
(KV cache, each group's prompt prefilled once), ``hf`` wraps transformers'
``generate`` as the reference, ``vllm`` is the GPU engine (imported lazily).
Must not: score completions or train.
"""

from __future__ import annotations

import importlib.util

import torch

from swarmnode.errors import EngineUnavailable
from swarmnode.policy.model import Policy
from swarmnode.rollout.hf_engine import HFEngine
from swarmnode.rollout.torch_engine import TorchEngine
from swarmnode.rollout.types import Completion, GenerationResult, RolloutEngine, SamplingParams

ENGINE_NAMES = ("torch", "hf", "vllm")


def make_engine(name: str, policy: Policy) -> RolloutEngine:
    """The engine called ``name`` ("torch" | "hf" | "vllm") serving ``policy``.

    Raises ``EngineUnavailable`` when the engine cannot run here (unknown name,
    vllm or CUDA missing, an architecture the torch engine does not run).
    """
    if name == "torch":
        return TorchEngine(policy)
    if name == "hf":
        return HFEngine(policy)
    if name == "vllm":
        return _make_vllm_engine(policy)
    raise EngineUnavailable(f"unknown rollout engine {name!r}; choose one of: {', '.join(ENGINE_NAMES)}")


def _make_vllm_engine(policy: Policy) -> RolloutEngine:
    # find_spec, not import: importing vllm is slow and pulls CUDA libraries.
    if importlib.util.find_spec("vllm") is None:
        raise EngineUnavailable(
            "engine 'vllm' needs the vllm package and a CUDA GPU: install with "
            "pip install 'swarmnode[vllm]' on a GPU machine, or choose engine 'torch'"
        )
    if not torch.cuda.is_available():
        raise EngineUnavailable("engine 'vllm' needs a CUDA GPU and none is visible; choose engine 'torch'")
    raise EngineUnavailable("engine 'vllm' is not implemented in this version yet; choose engine 'torch'")


__all__ = [
    "ENGINE_NAMES",
    "Completion",
    "GenerationResult",
    "HFEngine",
    "RolloutEngine",
    "SamplingParams",
    "TorchEngine",
    "make_engine",
]
