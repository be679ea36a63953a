"""Adapter versions: a learner that trains LoRA adapters broadcasts the adapter, not the model.

Owns: the base model's identity (``weights_hash``), the layout rule of an adapter version and its
check (``adapter_layout``), and installing one or a whole version into a plain model exactly
(``BaseWeights``).
Must not: move bytes or decide what to receive (``swarmnode.broadcast.weights``), or train.

With ``learn.lora_rank`` > 0 only the adapters change: a version is ``W + s * (B @ A)`` for each
adapted weight ``W`` of a base everyone already holds, ``s = alpha / r``. Its blob carries the pairs
``<module>.lora_A.weight`` (r x in) and ``<module>.lora_B.weight`` (out x r) and its manifest the
base's ``weights_hash`` and ``s`` (SPEC 1.5): at Qwen2.5-0.5B's shape with r = 16 on the seven
projections 35 MB instead of 1.98 GB.

A receiver installs an adapter only on the base it names (the hash of the model as it was loaded,
before any version was installed) and computes each adapted weight from a saved copy of the base
with ``merge_delta``, the expression the learner's own engine, spot checks and exports use: the
worker samples from the same bits the learner checks it against. Weights the adapter does not name
hold the base. The copy is taken the first time a weight is adapted, while the model still holds
its base there; a receiver that installed a whole version since it started no longer holds the
base anywhere and refuses adapters until it restarts.
"""

from __future__ import annotations

import functools
import hashlib
import struct
from collections.abc import Mapping

import torch

from swarmnode.broadcast.driver import (
    Blob,
    BroadcastError,
    _blob_parts,
    blob_to_state_dict,
    load_blob_into,
    publishable,
    tied_to,
)
from swarmnode.policy.lora import merge_delta
from swarmnode.wire import TensorEntry
from swarmnode.wire.messages import WeightManifestBody

LORA_A, LORA_B = ".lora_A.weight", ".lora_B.weight"


def weights_hash(state: Mapping[str, torch.Tensor]) -> bytes:
    """SHA-256 of a model's weights, as SPEC 1.5 defines it: over its tensors in byte order of
    their names, tied aliases left out (as in a blob), each as ``u32 len(name) || name ||
    u32 len(dtype) || dtype || u32 ndims || u64 dims... || u64 nbytes || bytes`` (little-endian)."""
    digest = hashlib.sha256()
    for entry, data in _blob_parts(publishable(state)):
        name, dtype = entry.name.encode(), entry.dtype.encode()
        digest.update(struct.pack("<I", len(name)) + name + struct.pack("<I", len(dtype)) + dtype)
        digest.update(struct.pack(f"<I{len(entry.shape)}Q", len(entry.shape), *entry.shape))
        digest.update(struct.pack("<Q", entry.nbytes))
        digest.update(data)
    return digest.digest()


def adapter_layout(
    targets: Mapping[str, torch.Tensor], tensors: Mapping[str, tuple[tuple[int, ...], torch.dtype]]
) -> dict[str, tuple[str, str]]:
    """Each weight an adapter version adapts -> the names of its (A, B), once ``tensors`` (name ->
    shape, dtype) is a valid adapter for the model whose ``state_dict`` is ``targets``: only pairs
    ``<m>.lora_A.weight`` (r x in) and ``<m>.lora_B.weight`` (out x r) for a 2-D ``<m>.weight``
    (out x in) of the model, untied, in its dtype, 1 <= r <= min(out, in). Otherwise a
    ``BroadcastError`` naming what is wrong, before anything is loaded."""
    pairs: dict[str, dict[str, str]] = {}
    for name in tensors:
        suffix = LORA_A if name.endswith(LORA_A) else LORA_B if name.endswith(LORA_B) else None
        if suffix is None:
            raise BroadcastError(f"adapter tensor {name!r} is neither <module>{LORA_A} nor <module>{LORA_B}")
        pairs.setdefault(name[: -len(suffix)] + ".weight", {})[suffix] = name
    tied = tied_to(targets)
    tied_names = set(tied) | set(tied.values())
    layout: dict[str, tuple[str, str]] = {}
    for weight, pair in sorted(pairs.items()):
        if set(pair) != {LORA_A, LORA_B}:
            raise BroadcastError(
                f"adapter for {weight!r} lacks its {LORA_A if LORA_A not in pair else LORA_B}"
            )
        target = targets.get(weight)
        if target is None or target.dim() != 2:
            raise BroadcastError(f"adapter for {weight!r}, which is not a 2-D weight of this model")
        if weight in tied_names:
            raise BroadcastError(f"adapter for {weight!r}, which is tied to another weight of this model")
        a_name, b_name = pair[LORA_A], pair[LORA_B]
        (a_shape, a_dtype), (b_shape, b_dtype) = tensors[a_name], tensors[b_name]
        out_features, in_features = target.shape
        rank = a_shape[0] if len(a_shape) == 2 else -1
        if (
            tuple(a_shape) != (rank, in_features)
            or tuple(b_shape) != (out_features, rank)
            or not 1 <= rank <= min(out_features, in_features)
        ):
            raise BroadcastError(
                f"adapter for {weight!r} {tuple(target.shape)}: A {tuple(a_shape)} and B {tuple(b_shape)} "
                "are not (r, in) and (out, r) with 1 <= r <= min(out, in)"
            )
        if a_dtype != target.dtype or b_dtype != target.dtype:
            raise BroadcastError(
                f"adapter for {weight!r}: {a_dtype} / {b_dtype}, the weight is {target.dtype}"
            )
        layout[weight] = (a_name, b_name)
    return layout


class BaseWeights:
    """Installs versions, whole or adapter, into one plain model, keeping what an adapter version
    needs: the base's hash and a copy of the base of every weight adapted so far.

    ``base``: the base's adapted weights where they already exist (a learner's frozen
    ``base_state_dict``: no copy is then taken); None to copy them from the model on first use.
    ``adapters``: False for a model only ever given whole versions (a learner that trains no adapters:
    its spot-check copy then never hashes its base).
    """

    def __init__(
        self, model: torch.nn.Module, base: Mapping[str, torch.Tensor] | None = None, *, adapters: bool = True
    ) -> None:
        self.model = model
        self._given = base
        self._adapters = adapters
        self._saved: dict[str, torch.Tensor] = {}
        self._adapted: set[str] = set()  # weights now holding base + delta; every other one is base
        self._whole = False  # a whole version was installed: the model holds the base nowhere

    @functools.cached_property
    def hash(self) -> bytes:
        """The base's ``weights_hash``: taken on first use (a whole install takes it first, while
        the model still holds the base). Seconds for a large model: take it off the event loop."""
        return weights_hash(self._given if self._given is not None else self.model.state_dict())

    def _base(self, name: str) -> torch.Tensor:
        return self._given[name] if self._given is not None else self._saved[name]

    @property
    def holds_base(self) -> bool:
        """Can an adapter version still be installed (no whole version was since start)?"""
        return not self._whole

    def merged(self, adapter: Mapping[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
        """The whole weights of an adapter version, as a blob carries them (tied aliases once),
        computed from the base given: what a learner sends a worker that does not hold its base."""
        if self._given is None:
            raise BroadcastError("no base was given to merge an adapter into")
        layout = adapter_layout(self._given, {n: (tuple(t.shape), t.dtype) for n, t in adapter.items()})
        whole = dict(self._given)
        for weight, (a, b) in layout.items():
            whole[weight] = merge_delta(self._given[weight], adapter[a], adapter[b], scale)
        return publishable(whole)

    def install(self, blob: Blob, body: WeightManifestBody) -> None:
        """Install the version ``blob`` holds as ``body`` describes it into the model."""
        if body.is_adapter:
            self.install_adapter(blob_to_state_dict(blob, body.tensors), body.base_hash, body.adapter_scale)
        else:
            self.install_whole(blob, body.tensors)

    def install_whole(self, blob: Blob, tensors: tuple[TensorEntry, ...]) -> None:
        if self._adapters:
            self.hash  # noqa: B018  # the base's, before it is gone
        load_blob_into(self.model, blob, tensors)  # checked whole first: nothing loaded on a misfit
        self._whole, self._adapted = True, set()

    def install_adapter(self, adapter: Mapping[str, torch.Tensor], base_hash: bytes, scale: float) -> None:
        """Set each weight the adapter names to ``base + scale * (B @ A)`` and every weight a
        previous adapter version named, but this one does not, back to its base."""
        if not self._adapters:
            raise BroadcastError("this model takes whole versions only")
        if base_hash != self.hash:
            raise BroadcastError(
                f"adapter for base {base_hash.hex()[:16]}, but this model's is {self.hash.hex()[:16]}: "
                "a worker must load the learner's model (model.path / model.builtin)"
            )
        if self._whole:
            raise BroadcastError("whole weights were installed since start: restart to take adapter versions")
        targets = self.model.state_dict()
        layout = adapter_layout(targets, {n: (tuple(t.shape), t.dtype) for n, t in adapter.items()})
        if self._given is not None:
            missing = sorted(set(layout) - set(self._given))
            if missing:
                raise BroadcastError(f"adapter for {missing[:3]}, which the base given does not hold")
        else:
            for weight in layout:
                if weight not in self._saved:  # never adapted yet: the model holds its base
                    self._saved[weight] = targets[weight].detach().clone()
        previous, self._adapted = self._adapted, self._adapted | set(layout)  # a failure part-way
        # through leaves some of ``layout`` merged: named here, a later version resets them to base
        with torch.no_grad():
            for weight in previous - set(layout):
                targets[weight].copy_(self._base(weight))
            for weight, (a, b) in layout.items():
                targets[weight].copy_(merge_delta(self._base(weight), adapter[a], adapter[b], scale))
        self._adapted = set(layout)


__all__ = ["LORA_A", "LORA_B", "BaseWeights", "adapter_layout", "weights_hash"]
