"""Recomputing a worker's reported log-probs for a spot-check (the torch half of ``core.spotcheck``).

Owns: one forward pass that scores completion tokens under our policy, with the same rule as the
trainer and the rollout engines (``completion_logprobs``: logits / temperature, log-softmax, before
any top-p truncation); and the check of the tokens themselves against keyed sampling (#20), both
from one forward pass (``group_logits``, then ``logprobs_at`` and ``tokens_at`` per seed).
Must not: decide what to check or judge the result (``core.spotcheck``).

The caller passes the policy *version the group claims* it was generated with, in eval mode
(dropout off), and runs this off the event loop like any torch work.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from swarmnode.admit.spotcheck import SpotCheckRequest
from swarmnode.policy.model import Policy
from swarmnode.rollout.keyed import DEFAULT_MARGIN, TokenCheck, check_token, keyed_uniform
from swarmnode.rollout.types import SamplingParams
from swarmnode.train.batch import completion_logits, completion_logprobs


def _model(policy: Policy | torch.nn.Module) -> torch.nn.Module:
    return policy.model if isinstance(policy, Policy) else policy


def recompute_logprobs(
    policy: Policy | torch.nn.Module,
    prompt_ids: Sequence[int],
    completion_token_ids: Sequence[int],
    temperature: float = 1.0,
) -> list[float]:
    """Log-prob of each completion token under ``policy`` (one value per token, in order).

    ``policy`` may be a bare causal LM (e.g. a scratch model loaded with an older version's
    weights). One row is never padded, so no pad token is needed.
    """
    if not completion_token_ids:
        return []
    with torch.no_grad():
        values, _ = completion_logprobs(
            _model(policy), [list(prompt_ids)], [list(completion_token_ids)], temperature
        )
    return [float(v) for v in values[0, : len(completion_token_ids)]]


def _check_request(request: SpotCheckRequest, completions: Sequence[Sequence[int]]) -> None:
    """A request naming tokens beyond the group is a ``ValueError`` (it was made for another group)."""
    for t in request.tokens:
        if t.completion >= len(completions) or t.position >= len(completions[t.completion]):
            raise ValueError(
                f"spot-check request names completion {t.completion} beyond the group it was made for"
            )


def group_logits(
    policy: Policy | torch.nn.Module,
    prompt_ids: Sequence[int],
    completions: Sequence[Sequence[int]],
    pad_token_id: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits (float32, before temperature) that score every token of a group, ``(G, T,
    vocab)``, and its ``(G, T)`` mask: one forward pass, the prompt scored once (packed). The
    learner's spot check reads its log-probs (``pick`` at the request) and chooses and checks its
    keyed-sampling tokens (``top_probabilities``, ``SpotChecker.select_uncertain``) from it."""
    rows = [list(c) for c in completions]
    with torch.no_grad():
        return completion_logits(_model(policy), [list(prompt_ids)] * len(rows), rows, pad_token_id)


def pick(logits: torch.Tensor, request: SpotCheckRequest) -> torch.Tensor:
    """``group_logits`` rows at ``request``'s tokens, in its order: ``(len(request.tokens), vocab)``."""
    rows = torch.tensor([t.completion for t in request.tokens], dtype=torch.long)
    positions = torch.tensor([t.position for t in request.tokens], dtype=torch.long)
    return logits[rows, positions]


def top_probabilities(
    logits: torch.Tensor, completions: Sequence[Sequence[int]], temperature: float
) -> list[list[float]]:
    """Per token of the group, the probability our policy gives its most likely token (after
    temperature): ``[c][t]`` for each completion's own length."""
    scaled = logits / temperature if temperature != 1.0 else logits
    top = torch.softmax(scaled, dim=-1).max(dim=-1).values
    return [[float(v) for v in top[c, : len(row)]] for c, row in enumerate(completions)]


def logprobs_at(
    logits: torch.Tensor, request: SpotCheckRequest, completions: Sequence[Sequence[int]], temperature: float
) -> list[float]:
    """Our log-probs at ``request``'s tokens (``pick`` rows), with the trainer's rule:
    logits / temperature, log-softmax."""
    if not request.tokens:
        return []
    scaled = logits / temperature if temperature != 1.0 else logits
    tokens = torch.tensor([completions[t.completion][t.position] for t in request.tokens], dtype=torch.long)
    values = torch.log_softmax(scaled, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return [float(v) for v in values]


def tokens_at(
    logits: torch.Tensor,
    request: SpotCheckRequest,
    completions: Sequence[Sequence[int]],
    params: SamplingParams,
    seed: bytes,
    task_key: str,
    margin: float = DEFAULT_MARGIN,
) -> list[TokenCheck]:
    """Whether each of ``request``'s tokens is the one keyed sampling picks with ``seed`` under
    these logits (``pick`` rows; protocol/SPEC.md 1.8), in the request's order."""
    return [
        check_token(
            logits[k],
            params,
            keyed_uniform(seed, task_key, t.completion, t.position),
            completions[t.completion][t.position],
            margin,
        )
        for k, t in enumerate(request.tokens)
    ]


def recompute_request(
    policy: Policy | torch.nn.Module,
    request: SpotCheckRequest,
    prompt_ids: Sequence[int],
    completions: Sequence[Sequence[int]],
    temperature: float = 1.0,
    pad_token_id: int = 0,
) -> list[float]:
    """Our log-probs at ``request``'s tokens, in its order (pass the result as ``recomputed``), on a
    forward pass of its own (``group_logits``)."""
    _check_request(request, completions)
    logits, _ = group_logits(policy, prompt_ids, completions, pad_token_id)
    return logprobs_at(pick(logits, request), request, completions, temperature)


def check_request_tokens(
    policy: Policy | torch.nn.Module,
    request: SpotCheckRequest,
    prompt_ids: Sequence[int],
    completions: Sequence[Sequence[int]],
    params: SamplingParams,
    seed: bytes,
    task_key: str,
    pad_token_id: int = 0,
    margin: float = DEFAULT_MARGIN,
) -> list[TokenCheck]:
    """``tokens_at`` on a forward pass of its own (``group_logits``)."""
    _check_request(request, completions)
    logits, _ = group_logits(policy, prompt_ids, completions, pad_token_id)
    return tokens_at(pick(logits, request), request, completions, params, seed, task_key, margin)
