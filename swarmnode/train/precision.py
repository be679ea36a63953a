"""The arithmetic of the update's forward and backward passes (``learn.precision``).

``bf16`` runs them under ``torch.autocast`` in bfloat16: matmuls (and attention) in bf16, with
float32 accumulation, softmaxes, norms and log-probs as autocast keeps them. Weights, gradients
and AdamW's moments stay float32, so LoRA merges, weight broadcasts, checkpoints and the
learner's spot checks see the same float32 weights as with ``fp32``; rollouts stay float32 too.
The price is rounding: an update's log-probs differ from the float32 ones its ratios are taken
against by about 1e-3 on average on the built-in models (``tests/train/test_precision.py``), well
inside the clip range. Where the hardware has bf16 units it is faster: on this project's 2-core
CPU (avx512_bf16) a 1024^3 matmul runs 4.7x faster, a Qwen2-shaped model's update 2.6x.
On a CPU, attention stays float32 (torch's bf16 attention backward there is several times slower
than float32's): a tiny-model step of 12 x 128 tokens ran 1.5x faster than float32 so, 1.15x with
bf16 attention.
"""

from __future__ import annotations

import contextlib
from typing import Literal

import torch

from swarmnode.errors import ConfigError
from swarmnode.train import split_attention

Precision = Literal["fp32", "bf16"]


def bf16_supported(device: torch.device) -> bool:
    """Whether ``device`` has bfloat16 arithmetic units (CPU: avx512_bf16 or AMX, via oneDNN)."""
    if device.type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if device.type == "cpu":
        try:
            return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        except (AttributeError, RuntimeError):  # a torch build without oneDNN
            return False
    return False


def check_precision(precision: Precision, device: torch.device) -> None:
    """A ``ConfigError`` naming ``learn.precision`` where the device cannot do it (bf16 emulated in
    software is many times slower than float32: never the right choice)."""
    if precision == "bf16" and not bf16_supported(device):
        raise ConfigError(
            f"learn.precision = 'bf16': this {device.type} has no bfloat16 arithmetic "
            "(a CPU needs avx512_bf16 or AMX); use 'fp32'"
        )


def update_precision(precision: Precision, device: torch.device) -> contextlib.AbstractContextManager[None]:
    """The context an update's forward passes run in (its backward runs outside it, as autocast asks).
    On a CPU, attention inside it runs in float32 (``split_attention.install``'s wrapper)."""
    if precision == "bf16":
        if device.type == "cpu":
            split_attention.install()
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


__all__ = ["Precision", "bf16_supported", "check_precision", "update_precision"]
