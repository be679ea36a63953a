"""LoRA adapters (peft) on a policy's model, and the merged weights everything else sees.

With ``learn.lora_rank`` > 0 a training role (solo, trainer, learner) trains low-rank adapters on a
frozen base (Hu et al. 2021, arXiv 2106.09685): each adapted linear layer computes

    y = W x + (alpha / r) * B (A x),        A: (r, in), B: (out, r), B = 0 at the start

so only A and B take gradients and optimizer state: for a 0.5 B model at r = 16, about 1% of the
parameters. peft injects the adapters into the HF model in place (``inject_adapter_in_model``): the
policy's ``model`` stays the same ``...ForCausalLM`` object, with its forward, ``config`` and
``generation_config``, and every training and scoring path runs through it unchanged.

What leaves the training loop is the merged model, ``W + (alpha / r) B A`` under the base
architecture's own names (``merged_state_dict``, every delta by ``merge_delta``): the rollout
engine's fused weights (``effective_weight``), the learner's spot-check copy (``plain_copy``),
whole weight versions and ``swarmnode export``. A learner's workers hold plain models: they take
each version as the adapter alone (``broadcast_adapter``) and add it to the base they loaded with
the same ``merge_delta`` (``swarmnode.broadcast.adapter``), or whole. ``adapter_state_dict`` is
the adapter in peft's file format (``swarmnode export --adapter``).

Adapter dropout is fixed at 0: the loss compares log-probs of the same completions under two
forward passes (the old policy's and the current one) and a dropout mask would make them differ by
noise, and a worker's engine (merged weights, no dropout) would not sample from the policy trained.

Must not: choose which roles train adapters (``roles.common.build_policy``), or save files.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from swarmnode.errors import ModelError

#: peft's name for the one adapter a policy has.
ADAPTER = "default"
#: Where ``PeftModel`` keeps the model it adapts: the prefix of every key in peft's adapter files.
PEFT_PREFIX = "base_model.model."


def _lora_layers(model: nn.Module) -> list[tuple[str, Any]]:
    from peft.tuners.lora import LoraLayer

    return [(name, m) for name, m in model.named_modules() if isinstance(m, LoraLayer)]


def has_lora(model: nn.Module) -> bool:
    """Does ``model`` carry LoRA adapters?"""
    return bool(_lora_layers(model))


def apply_lora(model: nn.Module, rank: int, alpha: float, target_modules: list[str]) -> nn.Module:
    """Inject rank-``rank`` adapters into ``model``'s ``target_modules`` (in place; returned) and
    freeze everything else. A target the model does not have is an error naming the modules it has."""
    from peft import LoraConfig, inject_adapter_in_model

    present = {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    missing = sorted(set(target_modules) - present)
    if missing:
        raise ModelError(
            f"learn.lora_target_modules names {missing}, which this model does not have; "
            f"its linear layers are {sorted(present)}"
        )
    # A tied layer (an LM head sharing its weight with the input embedding) cannot take a delta of
    # its own: the merged model every worker and spot check loads has one storage for both.
    owners: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        owners.setdefault(parameter.data_ptr(), []).append(name)
    tied = sorted(
        name
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear)
        and name.rsplit(".", 1)[-1] in target_modules
        and len(owners.get(m.weight.data_ptr(), ())) > 1
    )
    if tied:
        raise ModelError(
            f"learn.lora_target_modules adapts {tied}, whose weight is tied to another layer's "
            "(tie_word_embeddings): a worker's model could not hold the adapted weights"
        )
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,  # type: ignore[arg-type]  # peft accepts a float scale
        target_modules=list(target_modules),
        lora_dropout=0.0,
    )
    model = inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    for name, parameter in model.named_parameters():
        parameter.requires_grad_("lora_" in name)
    return model


def merge_delta(weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    """``W + scale * (B @ A)``, in this one order of operations everywhere (the learner's engine,
    its broadcasts and spot checks, a worker adding a broadcast adapter to its base), so that every
    holder of the same base and adapter computes the same bits."""
    with torch.no_grad():
        return weight + (b @ a) * scale


def effective_weight(linear: nn.Module) -> torch.Tensor:
    """The weight ``linear`` applies, adapter included: ``W + (alpha / r) B A`` for an unmerged
    LoRA layer, else its ``weight`` (detached)."""
    layer: Any = linear  # a peft layer's attributes are only known at run time
    if not hasattr(layer, "get_delta_weight") or layer.merged:
        return layer.weight.detach()
    weight = layer.get_base_layer().weight.detach()
    for adapter in layer.active_adapters:
        a, b = layer.lora_A[adapter].weight.detach(), layer.lora_B[adapter].weight.detach()
        weight = merge_delta(weight, a, b, float(layer.scaling[adapter]))
    return weight


def _plain_names(model: nn.Module, *, merged: bool) -> dict[str, torch.Tensor]:
    """``model``'s weights under its base architecture's names (detached): each adapted weight
    merged (``W + (alpha / r) B A``) or the frozen base ``W``."""
    layers = dict(_lora_layers(model))
    if not layers:
        return {k: v.detach() for k, v in model.state_dict().items()}
    out: dict[str, torch.Tensor] = {}
    for key, value in model.state_dict().items():
        if ".lora_" in key:
            continue
        module_name, _, leaf = key.rpartition(".")
        if module_name.endswith(".base_layer"):
            owner = module_name[: -len(".base_layer")]
            base_key = f"{owner}.{leaf}"
            adapted = merged and leaf == "weight"
            out[base_key] = effective_weight(layers[owner]) if adapted else value.detach()
        else:
            out[key] = value.detach()
    return out


def merged_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s weights under its base architecture's names, adapters merged in (a plain model's
    ``state_dict``, detached, when it has none): what a worker, a peer or another tool loads."""
    return _plain_names(model, merged=True)


def base_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The frozen base ``model``'s adapters are added to, under the base architecture's names (no
    copy: the model's own tensors, detached). Without adapters: its ``state_dict``."""
    return _plain_names(model, merged=False)


def broadcast_adapter(model: nn.Module) -> tuple[dict[str, torch.Tensor], float]:
    """The adapter as a version broadcasts it (SPEC 1.5): ``<module>.lora_A.weight`` (r x in) and
    ``<module>.lora_B.weight`` (out x r) under the base architecture's module names, and the one
    scale ``alpha / r`` they share."""
    out: dict[str, torch.Tensor] = {}
    scales = set()
    for name, layer in _lora_layers(model):
        for adapter in layer.active_adapters:
            out[f"{name}.lora_A.weight"] = layer.lora_A[adapter].weight.detach()
            out[f"{name}.lora_B.weight"] = layer.lora_B[adapter].weight.detach()
            scales.add(float(layer.scaling[adapter]))
    if not out:
        raise ModelError("this policy has no LoRA adapter (learn.lora_rank is 0)")
    if len(scales) != 1:
        raise ModelError(f"the adapters have {len(scales)} different scales; a broadcast carries one")
    return out, scales.pop()


def adapter_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's tensors under peft's saved names (``adapter_model.safetensors``)."""
    from peft import get_peft_model_state_dict

    if not has_lora(model):
        raise ModelError("this policy has no LoRA adapter (learn.lora_rank is 0)")
    state = get_peft_model_state_dict(model, adapter_name=ADAPTER)
    # A ``PeftModel`` wraps the model as ``base_model.model``, and names what it saves so.
    return {f"{PEFT_PREFIX}{k}": v.detach().contiguous() for k, v in state.items()}


def adapter_config(model: nn.Module) -> Any:
    """The adapter's peft ``LoraConfig`` (``save_pretrained`` writes ``adapter_config.json``)."""
    config = getattr(model, "peft_config", {}).get(ADAPTER)
    if config is None:
        raise ModelError("this policy has no LoRA adapter (learn.lora_rank is 0)")
    return config


def plain_copy(model: nn.Module) -> nn.Module:
    """A frozen copy of ``model`` (no gradients, eval mode) without adapters, holding the merged
    weights: a learner's spot-check model, a KL reference, what is saved. A plain model: a deep copy."""
    if not has_lora(model):
        return copy.deepcopy(model).requires_grad_(False).eval()
    config: Any = model.config  # type: ignore[union-attr]
    plain = type(model)(copy.deepcopy(config)).to(next(model.parameters()).dtype)
    plain.load_state_dict(merged_state_dict(model), strict=True)
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None:
        plain.generation_config = copy.deepcopy(generation_config)
    return plain.requires_grad_(False).eval()


__all__ = [
    "ADAPTER",
    "adapter_config",
    "adapter_state_dict",
    "apply_lora",
    "base_state_dict",
    "broadcast_adapter",
    "effective_weight",
    "has_lora",
    "merge_delta",
    "merged_state_dict",
    "plain_copy",
]
