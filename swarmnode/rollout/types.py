"""What every rollout engine takes and returns.

Owns: ``SamplingParams``, ``Completion``, ``GenerationResult`` and the
``RolloutEngine`` protocol, plus the shared sampling rules (log-prob convention,
top-p) so the torch and HF engines cannot drift apart.

Log-prob convention (TRL's rule): the log-prob of a sampled token is
``log_softmax(logits / temperature)`` at that token, taken *before* top-p
truncation. With ``temperature == 0`` (greedy) it is ``log_softmax(logits)``.
The EOS token, when generated, is part of ``token_ids`` and ``logprobs``.
Must not: load models or touch the network.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from swarmnode.policy.model import Policy
    from swarmnode.rollout.sampling_keys import SamplingKeys


@dataclass(frozen=True)
class SamplingParams:
    """``temperature`` 0 means greedy; ``top_p`` 1.0 means no nucleus truncation."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 16

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class Completion:
    """One sampled continuation. ``finished`` is True when it ended with EOS (EOS included)."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finished: bool


@dataclass
class GenerationResult:
    """``completions[p][s]`` is sample ``s`` of prompt ``p``; ``prompt_ids[p]`` are its prompt tokens."""

    prompt_ids: list[list[int]]
    completions: list[list[Completion]]
    policy_version: int
    tokens_generated: int
    seconds: float


def encode_prompts(policy: Policy, prompts: list[str], n: int) -> list[list[int]]:
    """The checks and prompt encoding every engine's ``generate`` starts with."""
    if n < 1:
        raise ValueError(f"samples per prompt must be >= 1, got {n}")
    return [policy.encode_prompt(text) for text in prompts]


class RolloutEngine(Protocol):
    """Samples ``n`` completions per prompt from the current policy."""

    name: str

    def generate(
        self,
        prompts: list[str],
        n: int,
        params: SamplingParams,
        generator: torch.Generator | None = None,
        *,
        keys: SamplingKeys | None = None,
    ) -> GenerationResult: ...

    def update_weights(self, policy: Policy) -> None: ...


def scaled_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Logits divided by the temperature (unchanged when greedy); float32."""
    logits = logits.float()
    return logits if params.greedy else logits / params.temperature


def top_p_filter(scaled: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus truncation exactly as transformers' ``TopPLogitsWarper`` (min 1 token kept).

    Sort ascending, drop the tokens whose cumulative probability is <= 1 - top_p,
    set them to -inf. ``scaled`` is (batch, vocab).
    """
    if top_p >= 1.0:
        return scaled
    sorted_logits, sorted_index = torch.sort(scaled, descending=False, dim=-1)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove_sorted = cumulative <= (1.0 - top_p)
    remove_sorted[..., -1:] = False
    remove = remove_sorted.scatter(-1, sorted_index, remove_sorted)
    return scaled.masked_fill(remove, float("-inf"))


def sequence_logprobs(scores: torch.Tensor, tokens: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Log-probs of ``tokens`` (..., ) under ``scores`` (..., vocab) by the convention above."""
    logp = torch.log_softmax(scaled_logits(scores, params), dim=-1)
    return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def group_completions(
    policy: Policy, token_rows: list[list[int]], logprob_rows: list[list[float]], n: int
) -> tuple[list[list[Completion]], int]:
    """Cut engine rows (row ``p*n + s`` = sample s of prompt p) into ``completions[p][s]``.

    Each row is cut just after its first EOS (engines may pad after it); returns
    the completions and the number of tokens kept.
    """
    eos = policy.eos_token_id
    kept = [row[: row.index(eos) + 1] if eos in row else row[:] for row in token_rows]
    texts = policy.decode_completions(kept)  # one EOS lookup for the batch, not one a row
    completions: list[list[Completion]] = []
    for start in range(0, len(kept), n):
        window = slice(start, start + n)
        rows = zip(kept[window], logprob_rows[window], texts[window], strict=True)
        completions.append(
            [Completion(ids, logprobs[: len(ids)], text, eos in ids) for ids, logprobs, text in rows]
        )
    return completions, sum(len(ids) for ids in kept)
