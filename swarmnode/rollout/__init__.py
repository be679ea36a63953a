"""Rollout engines: sample completions with per-token log-probs from a policy.

Owns: choosing an engine by name. ``torch`` is the fast plain-torch sampler
(KV cache, each group's prompt prefilled once), ``hf`` wraps transformers'
``generate`` as the reference, ``vllm`` is the GPU engine (imported lazily).
Must not: score completions or train.
"""

from __future__ import annotations

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
    from swarmnode.rollout.vllm_engine import VLLMEngine  # lazy: vllm is imported only when chosen

    return VLLMEngine(policy)  # EngineUnavailable without vllm or a CUDA GPU


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
