"""Fast batched sampling in plain torch over the weights of a Llama-family HF model.

Owns: the ``torch`` rollout engine. Once per weight version it rearranges the
HF model's weights for a lean forward (fused q/k/v and gate/up in (in, out)
layout; RMSNorm weights and the attention scale folded into the projection
after them; q/k rows permuted per head so RoPE is one complex multiply; layer
0's q/k/v as a per-token table when the vocabulary is small) and samples with
a preallocated KV cache:

* each distinct prompt is prefilled once (DESIGN.md: the main win over
  ``generate``); its K/V are copied to the ``n`` samples of its group (short
  prompts) or kept once per group and shared in attention (long prompts);
* decode runs one token per step for the rows still running, per-sequence EOS
  stop: once at most ``COMPACT_AT`` of the rows in the cache are running, the
  finished ones leave it (with the grouped cache, whole groups: their prompt
  K/V are shared), and decode ends as soon as every row has finished;
* positions count from each prompt's first real token, so left padding is
  invisible to the result.

Exactness: the same operations as the HF forward up to re-association (folded
weights), so log-probs agree with a full forward pass to ~1e-6 in float32.
Weight updates: in-place changes (optimizer steps, ``load_state_dict``) bump
the parameters' version counters and the next ``generate`` rebuilds the
layout; call ``update_weights`` after any other kind of replacement.

Supported architectures: llama, mistral, qwen2, qwen3 (the decoder block shape
of ``LlamaDecoderLayer``). Anything else raises ``EngineUnavailable`` pointing
at the ``hf`` engine. Must not: train, score, or mutate the model.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from swarmnode.errors import EngineUnavailable
from swarmnode.policy.lora import effective_weight
from swarmnode.policy.model import Policy
from swarmnode.rollout.keyed import SamplingKeys, choose
from swarmnode.rollout.types import (
    GenerationResult,
    SamplingParams,
    encode_prompts,
    group_completions,
    scaled_logits,
    top_p_filter,
)

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
#: Layer 0's q/k/v depend on the input token alone, so for a small vocabulary they
#: are a lookup table (vocab x q/k/v width), computed once per weight version.
LAYER0_TABLE_LIMIT = 4_000_000
#: Finished rows leave the decode batch once the running ones are at most this share of the
#: cache's rows: each compaction copies the cache, so it is done in few large steps.
COMPACT_AT = 0.75
#: Decode attends over the cache's slots up to the next multiple of this past the newest
#: written one, not over every slot: with 128 new tokens most of the cache is still empty
#: for most steps. Steps of 16 keep softmax rows long enough to run at full speed on CPU.
ATTENTION_WIDTH_STEP = 16
#: An engine keeps the memory of its KV caches between generate calls up to this many bytes
#: (``_CacheArena``); a call whose caches need more allocates them for itself, as it did before.
ARENA_BYTES = 256 * 2**20


def _norm_eps(norm: nn.Module | None, default: float) -> float:
    value = getattr(norm, "variance_epsilon", getattr(norm, "eps", default))
    return float(value)


def _pair_halves(head_dim: int) -> torch.Tensor:
    """Order ``[0, D/2, 1, D/2+1, ...]``: HF's RoPE pairs dim i with i + D/2; complex RoPE wants neighbours.

    Permuting q and k the same way inside every head leaves q.k unchanged, so the
    cache can hold keys in this order and RoPE becomes one complex multiply.
    """
    half = head_dim // 2
    return torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).flatten()


@dataclass
class _Layer:
    """One decoder block, rearranged for the lean forward.

    Weights are stored (in, out) for ``torch.mm``/``addmm``; the RMSNorm weights
    are folded into the projection that follows them; q/k output rows are
    permuted per head (``_pair_halves``); the attention scale is folded into q.
    """

    eps1: float
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor | None  # qwen3: per-head RMSNorm of q and k before RoPE
    k_norm: torch.Tensor | None
    qk_eps: float
    o: torch.Tensor
    o_bias: torch.Tensor | None
    eps2: float
    gate_up: torch.Tensor
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor
    down_bias: torch.Tensor | None
    act: Callable[[torch.Tensor], torch.Tensor]


def _bias(linear: nn.Module) -> torch.Tensor | None:
    bias = getattr(linear, "bias", None)
    return bias.detach() if bias is not None else None


def _cat_bias(*linears: Any) -> torch.Tensor | None:
    biases = [_bias(linear) for linear in linears]
    if all(b is None for b in biases):
        return None
    return torch.cat(
        [
            b if b is not None else linear.weight.new_zeros(linear.weight.shape[0])
            for linear, b in zip(linears, biases, strict=True)
        ]
    )


@dataclass
class _Weights:
    """A snapshot of the model's weights in the layout the lean forward uses."""

    embed: torch.Tensor
    layers: list[_Layer]
    layer0_table: torch.Tensor | None
    final_eps: float
    lm_head: torch.Tensor  # (hidden, vocab), final norm folded in
    lm_head_bias: torch.Tensor | None
    rotary: nn.Module
    n_heads: int
    n_kv_heads: int
    head_dim: int
    sliding_window: int | None

    @staticmethod
    def check(model: nn.Module) -> None:
        """Raise ``EngineUnavailable`` unless the lean forward reproduces this model exactly."""
        config = getattr(model, "config", None)
        model_type = getattr(config, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise EngineUnavailable(
                f"the torch engine runs {', '.join(SUPPORTED_MODEL_TYPES)} models, not model_type "
                f"{model_type!r}; choose the 'hf' engine for this model"
            )
        inner = getattr(model, "model", None)
        for name in ("embed_tokens", "layers", "norm", "rotary_emb"):
            if not hasattr(inner, name):
                raise EngineUnavailable(f"model has no model.{name}; choose the 'hf' engine for this model")
        if not hasattr(model, "lm_head"):
            raise EngineUnavailable("model has no lm_head; choose the 'hf' engine for this model")
        rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
        if isinstance(rope, dict) and rope.get("rope_type", "default") in ("dynamic", "longrope"):
            # These rescale frequencies with the live sequence length; a precomputed
            # table would silently differ from the HF forward.
            raise EngineUnavailable(
                "length-dependent RoPE scaling is not supported by the torch engine; use 'hf'"
            )

    @classmethod
    def build(cls, module: nn.Module) -> _Weights:
        cls.check(module)
        model: Any = module  # HF modules: attribute types are only known at run time
        config = model.config
        inner = model.model
        n_heads = int(config.num_attention_heads)
        n_kv_heads = int(getattr(config, "num_key_value_heads", None) or n_heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // n_heads)
        first_attn = inner.layers[0].self_attn
        scaling = float(getattr(first_attn, "scaling", head_dim**-0.5))
        pairs = _pair_halves(head_dim).to(inner.embed_tokens.weight.device)

        def per_head(rows: torch.Tensor, heads: int) -> torch.Tensor:
            return rows.view(heads, head_dim, *rows.shape[1:])[:, pairs].reshape(rows.shape)

        layers = []
        for block in inner.layers:
            attn, mlp = block.self_attn, block.mlp
            q_norm: Any = getattr(attn, "q_norm", None)
            k_norm: Any = getattr(attn, "k_norm", None)
            has_qk_norm = q_norm is not None and k_norm is not None
            wq = per_head(effective_weight(attn.q_proj), n_heads)
            wk = per_head(effective_weight(attn.k_proj), n_kv_heads)
            bq, bk, bv = _bias(attn.q_proj), _bias(attn.k_proj), _bias(attn.v_proj)
            bq = per_head(bq, n_heads) if bq is not None else None
            bk = per_head(bk, n_kv_heads) if bk is not None else None
            if not has_qk_norm:  # scale q before RoPE (linear), so scores need no scaling
                wq = wq * scaling
                bq = bq * scaling if bq is not None else None
            w_qkv = torch.cat([wq, wk, effective_weight(attn.v_proj)]) * block.input_layernorm.weight.detach()
            qkv_bias = None
            if any(b is not None for b in (bq, bk, bv)):
                zeros = w_qkv.new_zeros
                qkv_bias = torch.cat(
                    [
                        bq if bq is not None else zeros(wq.shape[0]),
                        bk if bk is not None else zeros(wk.shape[0]),
                        bv if bv is not None else zeros(effective_weight(attn.v_proj).shape[0]),
                    ]
                )
            act = mlp.act_fn
            post_norm = block.post_attention_layernorm.weight.detach()
            layers.append(
                _Layer(
                    eps1=_norm_eps(block.input_layernorm, config.rms_norm_eps),
                    qkv=w_qkv.t().contiguous(),
                    qkv_bias=qkv_bias,
                    q_norm=q_norm.weight.detach()[pairs] * scaling if has_qk_norm else None,
                    k_norm=k_norm.weight.detach()[pairs] if has_qk_norm else None,
                    qk_eps=_norm_eps(q_norm, config.rms_norm_eps) if has_qk_norm else 0.0,
                    o=effective_weight(attn.o_proj).t().contiguous(),
                    o_bias=_bias(attn.o_proj),
                    eps2=_norm_eps(block.post_attention_layernorm, config.rms_norm_eps),
                    gate_up=(
                        torch.cat([effective_weight(mlp.gate_proj), effective_weight(mlp.up_proj)])
                        * post_norm
                    )
                    .t()
                    .contiguous(),
                    gate_up_bias=_cat_bias(mlp.gate_proj, mlp.up_proj),
                    down=effective_weight(mlp.down_proj).t().contiguous(),
                    down_bias=_bias(mlp.down_proj),
                    act=F.silu if isinstance(act, nn.SiLU) else act,
                )
            )
        embed = inner.embed_tokens.weight.detach()
        table = None
        first = layers[0]
        if embed.shape[0] * first.qkv.shape[1] <= LAYER0_TABLE_LIMIT:
            table = _project(
                F.rms_norm(embed, (embed.shape[1],), None, first.eps1), first.qkv, first.qkv_bias
            )
        window = getattr(config, "sliding_window", None)
        if config.model_type == "qwen2" and not getattr(config, "use_sliding_window", False):
            window = None
        return cls(
            embed=embed,
            layers=layers,
            layer0_table=table,
            final_eps=_norm_eps(inner.norm, config.rms_norm_eps),
            lm_head=(model.lm_head.weight.detach() * inner.norm.weight.detach()).t().contiguous(),
            lm_head_bias=_bias(model.lm_head),
            rotary=inner.rotary_emb,
            n_heads=n_heads,
            n_kv_heads=n_kv_heads,
            head_dim=head_dim,
            sliding_window=int(window) if window else None,
        )


class _CacheArena:
    """KV-cache memory an engine keeps from one generate call to the next.

    A cache allocated afresh each call is memory the kernel hands out page by page: on the
    question prompts at 128 new tokens (8 x 8 rows, tiny model) that was 17,600 minor page faults
    and 67 of the 423 ms a call took, in the kernel (measured with ``getrusage``). Two regions,
    each holding every cache of a call: the caches live in one, and a compaction
    (``_Runner._compact``) copies the rows it keeps into the other, which then becomes the live
    one, so the memory stays at twice the first cache of a call. Calls needing more than
    ``ARENA_BYTES`` in all get their own tensors. Stale values from an earlier call are never
    read: a slot is written or zeroed before any step attends over it, as with fresh memory.
    """

    def __init__(self) -> None:
        self._regions: list[torch.Tensor] = []
        self._live = 0
        self._used = 0

    def reserve(self, elements: int, dtype: torch.dtype, device: torch.device) -> bool:
        """Make room for a call whose caches hold ``elements`` in all; False when over budget."""
        if 2 * elements * dtype.itemsize > ARENA_BYTES:
            return False
        first = self._regions[0] if self._regions else None
        if first is None or first.numel() < elements or first.dtype != dtype or first.device != device:
            self._regions = [torch.empty(elements, dtype=dtype, device=device) for _ in range(2)]
        self._live, self._used = 0, 0
        return True

    def take(self, shape: tuple[int, ...]) -> torch.Tensor:
        """A contiguous tensor of ``shape`` from the live region (uninitialised)."""
        count = math.prod(shape)
        region = self._regions[self._live]
        tensor = region[self._used : self._used + count].view(shape)
        self._used += count
        return tensor

    def switch(self) -> None:
        """Take from the other region from now on (the live one's caches are about to be copied)."""
        self._live, self._used = 1 - self._live, 0


def _project(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.mm(x, weight) if bias is None else torch.addmm(bias, x, weight)


def _weights_key(model: nn.Module) -> tuple[int, ...]:
    # In-place updates (optimizer steps, load_state_dict) bump a tensor's version
    # counter, so this key changes exactly when a cached snapshot goes stale.
    return (id(model), *(p._version for p in model.parameters()), *(id(p) for p in model.parameters()))


class _Runner:
    """One generate() call: the KV cache and the lean forward for prefill and decode.

    Two cache layouts, same result:

    * expanded: one cache (P*n, Hkv, Lp + new, D); the prompt K/V are copied to the
      n rows of their group after prefill. Fewest ops per step: best for short prompts.
    * grouped: the prompt K/V stay (P, Hkv, Lp, D), shared by the group's n samples,
      and only generated tokens get per-row slots. The prompt part of attention is a
      real matrix product over the group's n queries instead of n matrix-vector
      products: best for long prompts.

    Decode attends over the cache's slots up to the newest written one, rounded up to
    a multiple of ``ATTENTION_WIDTH_STEP``, with an additive mask (-inf) on left
    padding and on slots not generated yet: a width that changes only every 16 steps
    keeps the operands few distinct shapes, and CPU softmax is several times slower
    on rows shorter than 16. Unwritten slots inside the width are zeroed, so masked scores stay finite.
    A slice over slots keeps (rows, Hkv) one batch dimension, so it costs no copy.
    """

    def __init__(
        self,
        weights: _Weights,
        prompts: int,
        n: int,
        prompt_len: int,
        max_new: int,
        grouped: bool,
        pad: torch.Tensor,
        dtype: torch.dtype,
        arena: _CacheArena | None = None,
    ):
        device = pad.device
        self.w = weights
        self.prompts, self.n, self.prompt_len, self.grouped = prompts, n, prompt_len, grouped
        self.dtype = dtype
        batch = prompts * n
        kv_heads, head_dim = weights.n_kv_heads, weights.head_dim
        # Separate K and V tensors (rows, Hkv, slots, D): a slice over slots then keeps
        # (rows, Hkv) collapsible into one batch dimension, which batched matmul needs
        # to avoid a copy (a shared K|V tensor made attention ~3x slower here).
        slots = max_new if grouped else prompt_len + max_new
        per_layer = batch * slots + (prompts * prompt_len if grouped else 0)
        elements = 2 * len(weights.layers) * kv_heads * head_dim * per_layer
        self.arena = arena if arena is not None and arena.reserve(elements, dtype, device) else None

        def tensors(rows: int, length: int) -> list[torch.Tensor]:
            return [self._empty((rows, kv_heads, length, head_dim)) for _ in weights.layers]

        # Every slot is written before it is read except the unwritten ones inside decode's
        # attention width, which ``_zero_to`` zeroes as the width grows (a full memset of a
        # 128-token cache cost more than the short decodes that never reach its end).
        self.k_cache, self.v_cache = tensors(batch, slots), tensors(batch, slots)
        self.zeroed = 0 if grouped else prompt_len  # slots [0, zeroed) hold K/V or zeros
        self.prompt_k, self.prompt_v = (
            (tensors(prompts, prompt_len), tensors(prompts, prompt_len)) if grouped else ([], [])
        )
        positions = torch.arange(prompt_len + max_new, device=device).unsqueeze(0)
        cos, sin = weights.rotary(torch.zeros(1, device=device, dtype=dtype), positions)
        half = weights.head_dim // 2
        # RoPE as complex rotation of neighbouring pairs; float32 so the complex dtype exists.
        self.rotation = torch.complex(cos[0, :, :half].float(), sin[0, :, :half].float())  # (positions, D/2)
        # Masks, as additive float biases. future[s]: -inf on the slots after step s's own.
        inf = float("-inf")
        offset = 0 if grouped else prompt_len
        self.future = torch.full((max_new, slots), inf, device=device).triu(offset + 1)
        self.pad_bias: torch.Tensor | None = None  # (B, 1, 1, Lp): -inf on each row's left padding
        self.row_bias: torch.Tensor | None = None  # (B, 1, 1, slots): the same over the per-row cache
        if bool((pad > 0).any()):
            row_pad = pad.repeat_interleave(n).unsqueeze(1)
            is_pad = torch.arange(prompt_len, device=device).unsqueeze(0) < row_pad
            self.pad_bias = torch.zeros(is_pad.shape, device=device).masked_fill(is_pad, inf)[:, None, None]
            if not grouped:
                self.row_bias = F.pad(self.pad_bias, (0, max_new))

    def _empty(self, shape: tuple[int, ...]) -> torch.Tensor:
        """An uninitialised cache tensor: from the engine's arena when the call fits it."""
        if self.arena is not None:
            return self.arena.take(shape)
        return torch.empty(shape, device=self.w.embed.device, dtype=self.dtype)

    def _rope_(self, x: torch.Tensor, rotation: torch.Tensor) -> None:
        """Rotate ``x`` (..., heads, D) in place by ``rotation`` (..., 1, D/2), pairs (2i, 2i+1)."""
        if x.dtype in (torch.float32, torch.float64):
            torch.view_as_complex(x.unflatten(-1, (-1, 2))).mul_(rotation)
        else:  # no complex type for bf16/fp16: rotate in float32 and write back
            rotated = torch.view_as_complex(x.float().unflatten(-1, (-1, 2))) * rotation
            x.copy_(torch.view_as_real(rotated).flatten(-2))

    def _qkv(self, index: int, layer: _Layer, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """(rows, hidden) -> (rows, H + 2 Hkv, D): q/k normed (qwen3), not yet rotated."""
        w = self.w
        if index == 0 and w.layer0_table is not None:
            qkv = w.layer0_table[tokens]
        else:
            qkv = _project(F.rms_norm(x, (x.shape[-1],), None, layer.eps1), layer.qkv, layer.qkv_bias)
        qkv = qkv.view(qkv.shape[0], w.n_heads + 2 * w.n_kv_heads, w.head_dim)
        if layer.q_norm is not None and layer.k_norm is not None:
            q = F.rms_norm(qkv[:, : w.n_heads], (w.head_dim,), layer.q_norm, layer.qk_eps)
            k = F.rms_norm(
                qkv[:, w.n_heads : w.n_heads + w.n_kv_heads], (w.head_dim,), layer.k_norm, layer.qk_eps
            )
            qkv = torch.cat([q, k, qkv[:, w.n_heads + w.n_kv_heads :]], dim=1)
        return qkv

    def _block_tail(self, layer: _Layer, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Output projection + residual, then the MLP + residual; x and attn are (rows, features)."""
        x = torch.addmm(x, attn, layer.o)
        if layer.o_bias is not None:
            x = x + layer.o_bias
        h = F.rms_norm(x, (x.shape[-1],), None, layer.eps2)
        gate_up = _project(h, layer.gate_up, layer.gate_up_bias)
        width = gate_up.shape[-1] // 2
        hidden = layer.act(gate_up[:, :width]) * gate_up[:, width:]
        x = torch.addmm(x, hidden, layer.down)
        if layer.down_bias is not None:
            x = x + layer.down_bias
        return x

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        h = F.rms_norm(x, (x.shape[-1],), None, self.w.final_eps)
        return _project(h, self.w.lm_head, self.w.lm_head_bias).float()

    def prefill(self, ids: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        """Run the left-padded prompts ``ids`` (P, Lp) once and cache their K/V.

        Returns the next-token logits of each prompt (P, vocab).
        """
        w, n = self.w, self.n
        prompts, length = ids.shape
        heads, kv_heads = w.n_heads, w.n_kv_heads
        slots = torch.arange(length, device=ids.device)
        positions = (slots.unsqueeze(0) - pad.unsqueeze(1)).clamp(min=0)  # (P, Lp)
        rotation = self.rotation[positions].unsqueeze(2)  # (P, Lp, 1, D/2)
        real = slots.unsqueeze(0) >= pad.unsqueeze(1)  # (P, Lp): key is a prompt token
        causal = slots.unsqueeze(1) >= slots.unsqueeze(0)  # (Lp, Lp)
        # Each query always sees itself, so a pad query never has an all-masked row (NaN).
        eye = torch.eye(length, dtype=torch.bool, device=ids.device)
        mask = ((causal.unsqueeze(0) & real.unsqueeze(1)) | eye).unsqueeze(1)  # (P, 1, Lp, Lp)
        if w.sliding_window is not None:
            mask = mask & (slots.unsqueeze(1) - slots.unsqueeze(0) < w.sliding_window)
        flat_ids = ids.reshape(-1)
        x = F.embedding(flat_ids, w.embed)  # (P*Lp, hidden)
        for index, layer in enumerate(w.layers):
            qkv = self._qkv(index, layer, x, flat_ids).view(prompts, length, heads + 2 * kv_heads, w.head_dim)
            self._rope_(qkv[:, :, : heads + kv_heads], rotation)
            qkv = qkv.transpose(1, 2)  # (P, H + 2Hkv, Lp, D)
            q, k, v = qkv.split([heads, kv_heads, kv_heads], dim=1)
            if self.grouped:
                self.prompt_k[index].copy_(k)
                self.prompt_v[index].copy_(v)
            else:  # expand the prompt's K/V to its n samples: one copy each, no recomputation
                for cache, value in ((self.k_cache[index], k), (self.v_cache[index], v)):
                    cache.view(prompts, n, *cache.shape[1:])[:, :, :, :length] = value.unsqueeze(1)
            attn = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, scale=1.0, enable_gqa=kv_heads != heads
            )  # (P, H, Lp, D); the scale is folded into q
            x = self._block_tail(layer, x, attn.transpose(1, 2).reshape(prompts * length, -1))
        return self._logits(x.view(prompts, length, -1)[:, -1])

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only cache rows ``rows`` (ascending); with the grouped cache they must be whole
        groups (``keep_groups``), since a group's samples share its prompt K/V."""
        self._compact(rows, None)

    def keep_groups(self, groups: torch.Tensor) -> torch.Tensor:
        """Keep only prompts ``groups`` (ascending) and their samples; returns the rows kept."""
        n = self.n
        rows = (groups.unsqueeze(1) * n + torch.arange(n, device=groups.device)).reshape(-1)
        self._compact(rows, groups)
        self.prompts = int(groups.numel())
        return rows

    def _compact(self, rows: torch.Tensor, groups: torch.Tensor | None) -> None:
        """Copy the kept rows (and the kept groups' prompt K/V) into new caches. Only the slots
        that hold K/V or zeros are copied: the rest are zeroed before any step reads them."""
        if self.arena is not None:
            self.arena.switch()
        held = self.zeroed

        def kept(cache: torch.Tensor, index: torch.Tensor, slots: int) -> torch.Tensor:
            out = self._empty((int(index.numel()), *cache.shape[1:]))
            torch.index_select(cache[:, :, :slots], 0, index, out=out[:, :, :slots])
            return out

        self.k_cache = [kept(cache, rows, held) for cache in self.k_cache]
        self.v_cache = [kept(cache, rows, held) for cache in self.v_cache]
        if groups is not None:
            length = self.prompt_len
            self.prompt_k = [kept(cache, groups, length) for cache in self.prompt_k]
            self.prompt_v = [kept(cache, groups, length) for cache in self.prompt_v]
        if self.pad_bias is not None:
            self.pad_bias = self.pad_bias.index_select(0, rows)
        if self.row_bias is not None:
            self.row_bias = self.row_bias.index_select(0, rows)

    def _width(self, step: int) -> int:
        """How many of the per-row cache's slots decode ``step`` attends over (the rest are unwritten)."""
        written = step + 1 if self.grouped else self.prompt_len + step + 1
        rounded = -(-written // ATTENTION_WIDTH_STEP) * ATTENTION_WIDTH_STEP
        return min(rounded, self.future.shape[1])

    def _zero_to(self, width: int) -> None:
        """Zero the per-row cache's slots [zeroed, width), so masked scores stay finite."""
        if width > self.zeroed:
            for cache in (*self.k_cache, *self.v_cache):
                cache[:, :, self.zeroed : width].zero_()
            self.zeroed = width

    def _step_bias(self, step: int, width: int) -> torch.Tensor:
        """(B or 1, 1, 1, width): the additive mask over the per-row cache at decode ``step``."""
        future = self.future[step, :width].view(1, 1, 1, -1)
        return future if self.row_bias is None else self.row_bias[..., :width] + future

    def decode(self, tokens: torch.Tensor, step: int, positions: torch.Tensor) -> torch.Tensor:
        """Feed generated token ``step`` (B,) of every row; returns next-token logits (B, vocab)."""
        w = self.w
        batch = tokens.shape[0]
        heads, kv_heads, head_dim = w.n_heads, w.n_kv_heads, w.head_dim
        group = heads // kv_heads
        rotation = self.rotation[positions].unsqueeze(1)  # (B, 1, D/2)
        slot = step if self.grouped else self.prompt_len + step
        width = self._width(step)
        self._zero_to(width)
        bias = self._step_bias(step, width)
        x = F.embedding(tokens, w.embed)  # (B, hidden)
        for index, layer in enumerate(w.layers):
            qkv = self._qkv(index, layer, x, tokens)  # (B, H + 2Hkv, D)
            self._rope_(qkv[:, : heads + kv_heads], rotation)
            k_cache, v_cache = self.k_cache[index], self.v_cache[index]
            k_cache[:, :, slot] = qkv[:, heads : heads + kv_heads]
            v_cache[:, :, slot] = qkv[:, heads + kv_heads :]
            # GQA without repeating K/V: the q heads sharing a kv head are its query rows.
            # Contiguous: a strided q made each batched matmul copy it first, at about twice the cost.
            q = qkv[:, :heads].reshape(batch, kv_heads, group, head_dim).contiguous()
            keys, values = k_cache[:, :, :width], v_cache[:, :, :width]
            scores = torch.matmul(q, keys.transpose(-1, -2)).float() + bias  # (B, Hkv, g, width)
            if self.grouped:
                attn = self._grouped_attention(index, q, scores, values)
            else:
                attn = torch.matmul(scores.softmax(dim=-1).to(self.dtype), values)  # (B, Hkv, g, D)
            x = self._block_tail(layer, x, attn.reshape(batch, -1))
        return self._logits(x)

    def _grouped_attention(
        self, index: int, q: torch.Tensor, gen_scores: torch.Tensor, gen_values: torch.Tensor
    ) -> torch.Tensor:
        """Attention over the group's shared prompt keys plus the row's own generated keys."""
        prompts, n, length = self.prompts, self.n, self.prompt_len
        batch, kv_heads, group, _ = q.shape

        def by_group(t: torch.Tensor) -> torch.Tensor:  # (B, Hkv, g, X) -> (P, Hkv, n*g, X)
            grouped = t.view(prompts, n, kv_heads, group, -1).transpose(1, 2)
            return grouped.reshape(prompts, kv_heads, n * group, -1)

        def by_row(t: torch.Tensor) -> torch.Tensor:  # (P, Hkv, n*g, X) -> (B, Hkv, g, X)
            return t.view(prompts, kv_heads, n, group, -1).transpose(1, 2).reshape(batch, kv_heads, group, -1)

        prompt_k, prompt_v = self.prompt_k[index], self.prompt_v[index]
        prompt_scores = by_row(torch.matmul(by_group(q), prompt_k.transpose(-1, -2))).float()
        if self.pad_bias is not None:
            prompt_scores = prompt_scores + self.pad_bias
        probs = torch.cat([prompt_scores, gen_scores], dim=-1).softmax(dim=-1).to(self.dtype)
        from_prompt = by_row(torch.matmul(by_group(probs[..., :length]), prompt_v))
        return from_prompt + torch.matmul(probs[..., length:], gen_values)


def _sample(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    rows: torch.Tensor | None = None,
    batch: int | None = None,
    keyed: tuple[SamplingKeys, int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next tokens (R,) and their log-probs (R,) by the convention in ``rollout.types``.

    Sampling is by inverse CDF: token = #{i : cdf_i < u * cdf_last} with u in (0, 1],
    one uniform per row. A zero-probability token (outside the top-p nucleus) has
    cdf_i == cdf_{i-1} and can never be chosen. On CPU this is several times
    faster than ``torch.multinomial`` for a small batch. ``logits`` may be the rows
    ``rows`` of a batch of ``batch``: the uniforms of the whole batch are drawn and
    those rows' used, so a row's sample does not depend on which others still run.
    ``keyed`` = (keys, n, position): the uniforms are the keyed sampling rule's
    (``rollout.keyed``), a function of the learner's seed, the row and the position.
    """
    scaled = scaled_logits(logits, params)
    logp = torch.log_softmax(scaled, dim=-1)
    if params.greedy:
        tokens = scaled.argmax(dim=-1)
    else:
        probs = top_p_filter(scaled, params.top_p).softmax(dim=-1) if params.top_p < 1.0 else logp.exp()
        cdf = probs.cumsum(dim=-1)
        device = generator.device if generator is not None else probs.device
        if keyed is not None:
            keys, n, position = keyed
            wanted = range(probs.shape[0]) if rows is None else rows.tolist()
            tokens = choose(probs, keys.uniforms(n, position, wanted))
        else:
            draws = probs.shape[0] if batch is None else batch
            uniform = 1.0 - torch.rand((draws, 1), generator=generator, device=device)  # (0, 1]
            if rows is not None:
                uniform = uniform[rows.to(device)]
            threshold = uniform.to(probs.device) * cdf[:, -1:]
            tokens = (cdf < threshold).sum(dim=-1)
    return tokens, logp.gather(1, tokens.unsqueeze(1)).squeeze(1)


class TorchEngine:
    """Plain-torch batched sampler with a KV cache; see the module docstring.

    One engine serves one thread: do not change the weights from another thread
    while ``generate`` runs (the trainer generates, then updates, in turn).
    """

    name = "torch"
    #: Prompts at least this long (tokens, incl. BOS) keep one shared K/V per group
    #: (see ``_Runner``); shorter ones are expanded to every sample.
    grouped_min_prompt = 24

    def __init__(self, policy: Policy) -> None:
        _Weights.check(policy.model)
        self._policy = policy
        self._weights: _Weights | None = None
        self._weights_key: tuple[int, ...] = ()
        self._arena = _CacheArena()

    @property
    def policy(self) -> Policy:
        return self._policy

    def update_weights(self, policy: Policy) -> None:
        """Sample from ``policy`` from now on (its weights are re-read on every generate call)."""
        _Weights.check(policy.model)
        self._policy = policy
        self._weights = None

    def _current_weights(self) -> _Weights:
        """The rearranged weights, rebuilt whenever any parameter changed since the last call."""
        model = self._policy.model
        key = _weights_key(model)
        if self._weights is None or key != self._weights_key:
            self._weights = _Weights.build(model)
            self._weights_key = key
        return self._weights

    def generate(
        self,
        prompts: list[str],
        n: int,
        params: SamplingParams,
        generator: torch.Generator | None = None,
        *,
        keys: SamplingKeys | None = None,
    ) -> GenerationResult:
        """``keys``: sample by the keyed rule (``rollout.keyed``; ``generator`` is then unused), one
        task key per prompt."""
        started = time.perf_counter()
        policy = self._policy
        if keys is not None and len(keys.task_keys) != len(prompts):
            raise ValueError(f"{len(keys.task_keys)} task keys for {len(prompts)} prompts")
        prompt_ids = encode_prompts(policy, prompts, n)
        if not prompt_ids:
            return GenerationResult([], [], policy.version, 0, time.perf_counter() - started)
        with torch.inference_mode():
            tokens, logprobs = self._run(prompt_ids, n, params, generator, keys)
        completions, generated = group_completions(policy, tokens, logprobs, n)
        return GenerationResult(
            prompt_ids=prompt_ids,
            completions=completions,
            policy_version=policy.version,
            tokens_generated=generated,
            seconds=time.perf_counter() - started,
        )

    def _run(
        self,
        prompt_ids: list[list[int]],
        n: int,
        params: SamplingParams,
        generator: torch.Generator | None,
        keys: SamplingKeys | None = None,
    ) -> tuple[list[list[int]], list[list[float]]]:
        """Token ids and log-probs per row (row = prompt * n + sample), cut after the step all rows ended."""
        policy = self._policy
        weights = self._current_weights()
        device, dtype = weights.embed.device, weights.embed.dtype
        lengths = torch.tensor([len(ids) for ids in prompt_ids], device=device)
        prompt_len = int(lengths.max())
        total = prompt_len + params.max_new_tokens
        if weights.sliding_window is not None and total > weights.sliding_window:
            raise EngineUnavailable(
                f"prompt + new tokens ({total}) exceed the model's sliding window "
                f"({weights.sliding_window}); use the 'hf' engine"
            )
        pad_id = policy.pad_token_id
        ids = torch.full((len(prompt_ids), prompt_len), pad_id, dtype=torch.long, device=device)
        for row, prompt in enumerate(prompt_ids):
            ids[row, prompt_len - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        pad = prompt_len - lengths  # (P,) left pads per prompt
        batch = len(prompt_ids) * n
        grouped = n > 1 and prompt_len >= self.grouped_min_prompt
        runner = _Runner(
            weights, len(prompt_ids), n, prompt_len, params.max_new_tokens, grouped, pad, dtype, self._arena
        )
        logits = runner.prefill(ids, pad).repeat_interleave(n, dim=0)
        row_len = lengths.repeat_interleave(n)
        eos = policy.eos_token_id
        live = torch.arange(batch, device=device)  # the batch row of each cache row
        finished = torch.zeros(batch, dtype=torch.bool, device=device)  # per cache row
        out_tokens = torch.full((batch, params.max_new_tokens), pad_id, dtype=torch.long, device=device)
        out_logprobs = torch.zeros((batch, params.max_new_tokens), dtype=torch.float32, device=device)
        steps = 0
        for step in range(params.max_new_tokens):
            keyed = None if keys is None else (keys, n, step)
            token, logp = _sample(logits, params, generator, live, batch, keyed)
            token = token.masked_fill(finished, pad_id)
            out_tokens[live, step] = token
            out_logprobs[live, step] = logp.float()
            finished = finished | (token == eos)
            steps = step + 1
            if step == params.max_new_tokens - 1 or bool(finished.all()):
                break
            running = ~finished
            if int(running.sum()) <= COMPACT_AT * live.numel():
                if grouped:
                    alive = running.view(runner.prompts, n).any(dim=1)
                    if int(alive.sum()) < runner.prompts:
                        kept = runner.keep_groups(alive.nonzero().squeeze(1))
                        live, token, finished = live[kept], token[kept], finished[kept]
                else:
                    kept = running.nonzero().squeeze(1)
                    runner.keep(kept)
                    live, token, finished = live[kept], token[kept], finished[kept]
            logits = runner.decode(token, step, row_len[live] + step)
        token_rows = out_tokens[:, :steps].tolist()
        logprob_rows = out_logprobs[:, :steps].tolist()
        return token_rows, logprob_rows
