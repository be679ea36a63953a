"""Scored groups and the log-prob forward pass used by every loss."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from swarmnode.tasks import Task


@dataclass
class ScoredGroup:
    """One prompt's G completions, re-scored by this node's verifier.

    ``behaviour_logprobs`` are per-token log-probs under the policy that
    generated the text (own groups) or re-computed under ours (external text
    re-tokenized by our tokenizer, SAPO §2 step 5). ``source`` is "local" or the
    sender's peer id; ``source_mean_logprobs`` / ``source_reward_mean`` carry what
    a sender reported (HACPO needs them), never used as rewards.
    """

    task: Task
    prompt_ids: list[int]
    completion_ids: list[list[int]]
    behaviour_logprobs: list[list[float]]
    texts: list[str]
    rewards: list[float]
    policy_version: int
    source: str = "local"
    source_mean_logprobs: list[float] = field(default_factory=list)
    source_reward_mean: float | None = None

    @property
    def size(self) -> int:
        return len(self.completion_ids)


def pad_right(rows: Sequence[Sequence[float]], value: float, dtype: torch.dtype) -> torch.Tensor:
    width = max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), max(width, 1)), value, dtype=dtype)
    for i, row in enumerate(rows):
        if row:
            out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out


def completion_logprobs(
    model: torch.nn.Module,
    prompt_ids: list[list[int]],
    completion_ids: list[list[int]],
    temperature: float = 1.0,
    pad_token_id: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of each completion token under ``model``: (B, T) values and (B, T) mask.

    Rows are ``prompt + completion`` right-padded, so position ids are the plain
    0..n-1 a causal LM expects; the completion token at position p is scored by
    the logits at p-1. Logits are divided by the sampling temperature, the same
    rule the rollout engines use (TRL's convention).
    """
    full = [p + c for p, c in zip(prompt_ids, completion_ids, strict=True)]
    input_ids = pad_right(full, pad_token_id, torch.long)
    attention = pad_right([[1] * len(r) for r in full], 0, torch.long)
    logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1, :].float()
    if temperature != 1.0:
        logits = logits / temperature
    token_logp = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    width = max(max((len(c) for c in completion_ids), default=1), 1)
    starts = torch.tensor([len(p) - 1 for p in prompt_ids])
    lengths = torch.tensor([len(c) for c in completion_ids])
    offsets = torch.arange(width)
    index = (starts.unsqueeze(1) + offsets.unsqueeze(0)).clamp(max=token_logp.shape[1] - 1)
    mask = (offsets.unsqueeze(0) < lengths.unsqueeze(1)).float()
    values = token_logp.gather(1, index) * mask
    return values, mask
