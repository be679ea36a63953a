"""Attention for a long packed group, split by what each token may see (PrefixGrouper's idea).

A pack is one prompt followed by its G completions. With one masked attention over the whole
pack (``batch._packed_forward``'s 4D mask), every query pays for all ``L = P + sum T_j`` keys,
although a prompt token sees only the prompt and a completion token only the prompt and its own
completion: ``L^2`` work where ``P^2 + sum_j T_j (P + T_j)`` is needed. For a group of 8 completions
of ~100 tokens behind a 100-token prompt that is 4.6x the attention the unshared rows would do,
and at a narrow model's width (the built-in chat model's 128) it cost what sharing the prompt saved.

Here each layer's attention runs in two calls on gathered rows, exactly: the prompts (causal,
each over its own prompt), and the completions (each over its sequence's prompt, then causally
over itself). Outputs are scattered back to the pack's positions; padding positions get zeros.

It runs inside the model's own forward: transformers' "sdpa" attention function is wrapped once
(``install``), and the layout travels in a context variable that ``running`` sets for one
forward. Every other call (another thread's forward, a ``generate``) gets the original function
on the full 4D mask the forward was also given. Checkpointed layers keep the masked path
(``usable``).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class SplitLayout:
    """Where a forward's prompts and completions sit: n sequences of L positions, C completions."""

    prompt_index: torch.Tensor  # (n * Pmax,) flat positions (seq * L + pos) of each prompt, padded
    prompt_mask: torch.Tensor  # (n, 1, Pmax, Pmax) bool: causal within the prompt's own tokens
    prompt_keep: torch.Tensor  # (n * Pmax,) bool: a real prompt token (padding is not written back)
    prompt_shape: tuple[int, int]  # (n, Pmax)
    query_index: torch.Tensor  # (C * Tmax,) flat positions of each completion's tokens, padded
    key_index: torch.Tensor  # (C * (Pmax + Tmax),) its sequence's prompt, then its own tokens
    completion_mask: torch.Tensor  # (C, 1, Tmax, Pmax + Tmax) bool
    completion_keep: torch.Tensor  # (C * Tmax,) bool
    completion_shape: tuple[int, int, int]  # (C, Tmax, Pmax + Tmax)
    length: int  # L: a forward of another length is not this layout's


def layout(length: int, spans: Sequence[tuple[int, Sequence[tuple[int, int]]]]) -> SplitLayout:
    """The layout of sequences of ``length`` positions, each ``(prompt_length, [(start, tokens) of
    each completion])`` with the prompt at positions ``0 .. prompt_length - 1``."""
    n = len(spans)
    p_max = max(prompt for prompt, _ in spans)
    completions = [
        (s, start, tokens) for s, (_, rows) in enumerate(spans) for start, tokens in rows if tokens
    ]
    t_max = max((tokens for _, _, tokens in completions), default=1)
    positions = torch.arange(p_max)
    prompt_lengths = torch.tensor([prompt for prompt, _ in spans])
    prompt_valid = positions.unsqueeze(0) < prompt_lengths.unsqueeze(1)  # (n, Pmax)
    prompt_index = (torch.arange(n).unsqueeze(1) * length + positions.clamp(max=length - 1)).reshape(-1)
    causal = torch.ones(p_max, p_max, dtype=torch.bool).tril()
    # A padding query sees key 0 (a real token: every prompt has one), so no softmax is empty.
    prompt_mask = (causal.unsqueeze(0) & prompt_valid.unsqueeze(1)).unsqueeze(1)
    c = len(completions)
    own = torch.arange(t_max)
    seq = torch.tensor([s for s, _, _ in completions], dtype=torch.long)
    start = torch.tensor([st for _, st, _ in completions], dtype=torch.long)
    tokens = torch.tensor([t for _, _, t in completions], dtype=torch.long)
    own_valid = own.unsqueeze(0) < tokens.unsqueeze(1)  # (C, Tmax)
    query_pos = (start.unsqueeze(1) + own.unsqueeze(0)).clamp(max=length - 1)
    query_index = (seq.unsqueeze(1) * length + query_pos).reshape(-1)
    key_pos = torch.cat([positions.unsqueeze(0).expand(c, -1), query_pos], dim=1)
    key_index = (seq.unsqueeze(1) * length + key_pos).reshape(-1)
    key_prompt_valid = prompt_valid[seq]  # (C, Pmax)
    own_causal = torch.ones(t_max, t_max, dtype=torch.bool).tril().unsqueeze(0) & own_valid.unsqueeze(1)
    completion_mask = torch.cat(
        [key_prompt_valid.unsqueeze(1).expand(c, t_max, p_max), own_causal], dim=2
    ).unsqueeze(1)
    return SplitLayout(
        prompt_index=prompt_index,
        prompt_mask=prompt_mask,
        prompt_keep=prompt_valid.reshape(-1),
        prompt_shape=(n, p_max),
        query_index=query_index,
        key_index=key_index,
        completion_mask=completion_mask,
        completion_keep=own_valid.reshape(-1),
        completion_shape=(c, t_max, p_max + t_max),
        length=length,
    )


_CURRENT: contextvars.ContextVar[SplitLayout | None] = contextvars.ContextVar(
    "swarmnode_split_layout", default=None
)


def _gather(states: torch.Tensor, index: torch.Tensor, rows: int, columns: int) -> torch.Tensor:
    """(n, H, L, D) states at flat positions ``index`` -> (rows, H, columns, D)."""
    n, heads, length, dim = states.shape
    flat = states.transpose(1, 2).reshape(n * length, heads, dim)
    return flat.index_select(0, index).view(rows, columns, heads, dim).transpose(1, 2)


def split_attention(
    plan: SplitLayout,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    dropout: float = 0.0,
    scaling: float | None = None,
) -> torch.Tensor:
    """Attention by ``plan``: query (n, H, L, D), key/value (n, Hkv, L, D) -> (n, L, H, D)."""
    n, heads, length, dim = query.shape
    gqa = key.shape[1] != heads
    _, p_max = plan.prompt_shape
    c, t_max, keys = plan.completion_shape

    out = query.new_zeros(n * length, heads, dim)

    def attend(  # queries at q_index attend to keys at k_index; kept rows written back to ``out``
        q_index: torch.Tensor,
        k_index: torch.Tensor,
        shape: tuple[int, int, int],
        mask: torch.Tensor,
        keep: torch.Tensor,
        into: torch.Tensor,
    ) -> torch.Tensor:
        rows, q_cols, k_cols = shape
        attended = F.scaled_dot_product_attention(
            _gather(query, q_index, rows, q_cols),
            _gather(key, k_index, rows, k_cols),
            _gather(value, k_index, rows, k_cols),
            attn_mask=mask,
            dropout_p=dropout,
            scale=scaling,
            enable_gqa=gqa,
        )  # (rows, H, q_cols, D)
        return into.index_copy(0, q_index[keep], attended.transpose(1, 2).reshape(-1, heads, dim)[keep])

    out = attend(
        plan.prompt_index, plan.prompt_index, (n, p_max, p_max), plan.prompt_mask, plan.prompt_keep, out
    )
    if c:
        out = attend(
            plan.query_index,
            plan.key_index,
            (c, t_max, keys),
            plan.completion_mask,
            plan.completion_keep,
            out,
        )
    return out.view(n, length, heads, dim)


_ORIGINAL: list[Any] = []  # transformers' own "sdpa" attention function, once wrapped


def _sdpa_or_split(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' "sdpa" attention, split by the layout ``running`` set in this context, if any;
    in float32 under CPU autocast (``learn.precision = "bf16"``)."""
    if query.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
        # CPU autocast runs attention in bf16, and torch's bf16 attention backward on CPU is slow:
        # 419 of 1,023 ms of a tiny-model update step (12 x 128 tokens, one thread) against 85 ms
        # in float32. Matmuls stay bf16; attention is a small part of the FLOPs. Measured: a bf16
        # step 1.15x faster than float32 with bf16 attention, 1.5x with float32 attention.
        with torch.autocast("cpu", enabled=False):
            return _sdpa_or_split(
                module,
                query.float(),
                key.float(),
                value.float(),
                attention_mask,
                dropout=dropout,
                scaling=scaling,
                **kwargs,
            )
    plan = _CURRENT.get()
    if plan is None or plan.length != query.shape[2]:
        result: tuple[torch.Tensor, None] = _ORIGINAL[0](
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
        return result
    return split_attention(plan, query, key, value, dropout, scaling), None


def install() -> None:
    """Wrap transformers' "sdpa" attention once. Without a layout (every other forward in this
    process, and a checkpointed layer recomputed in the backward pass, after ``running`` ended)
    it is the original, on the full mask the forward was given."""
    if _ORIGINAL:
        return
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    _ORIGINAL.append(ALL_ATTENTION_FUNCTIONS["sdpa"])
    AttentionInterface.register("sdpa", _sdpa_or_split)


def usable(model: torch.nn.Module) -> bool:
    """Whether ``model``'s attention goes through transformers' "sdpa" function (which ``running``
    splits; "eager" attention keeps the masked path) and its layers are not checkpointed: a
    checkpointed layer is recomputed in the backward pass, after ``running`` ended, on the plain
    path, and torch refuses a recomputation that saves other tensors than the forward did."""
    if getattr(getattr(model, "config", None), "_attn_implementation", None) != "sdpa":
        return False
    return not any(getattr(module, "gradient_checkpointing", False) for module in model.modules())


@contextlib.contextmanager
def running(plan: SplitLayout) -> Iterator[None]:
    """Attention split by ``plan`` for the sdpa forward passes inside, in this context only."""
    install()
    token = _CURRENT.set(plan)
    try:
        yield
    finally:
        _CURRENT.reset(token)


__all__ = ["SplitLayout", "install", "layout", "running", "split_attention", "usable"]
