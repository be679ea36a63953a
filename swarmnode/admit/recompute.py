"""Recomputing a worker's reported log-probs for a spot-check (the torch half of ``core.spotcheck``).

Owns: one forward pass that scores completion tokens under our policy, with the same rule as the
trainer and the rollout engines (``completion_logprobs``: logits / temperature, log-softmax, before
any top-p truncation); and one that checks the tokens themselves against keyed sampling
(``check_request_tokens``, #20). Must not: decide what to check or judge the result
(``core.spotcheck``).

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
from swarmnode.train.batch import completion_logprobs


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


def _cut_rows(
    request: SpotCheckRequest, completions: Sequence[Sequence[int]]
) -> tuple[tuple[int, ...], list[list[int]]]:
    """The completions ``request`` names and each cut at the last token it needs; a request naming
    tokens beyond the group is a ``ValueError`` (it was made for another group)."""
    wanted = request.completions
    for i in wanted:
        if i >= len(completions) or request.prefix(i) > len(completions[i]):
            raise ValueError(f"spot-check request names completion {i} beyond the group it was made for")
    return wanted, [list(completions[i][: request.prefix(i)]) for i in wanted]


def recompute_request(
    policy: Policy | torch.nn.Module,
    request: SpotCheckRequest,
    prompt_ids: Sequence[int],
    completions: Sequence[Sequence[int]],
    temperature: float = 1.0,
    pad_token_id: int = 0,
) -> list[float]:
    """Our log-probs at ``request``'s tokens, in its order (pass the result as ``recomputed``).

    One batched forward over only the completions the request names, each cut at the last token
    it needs (a causal LM scores a token from its prefix alone, so the cut changes nothing).
    Rows are right-padded with ``pad_token_id`` under an attention mask, so its value does not
    change the result.
    """
    wanted, rows = _cut_rows(request, completions)
    if not wanted:
        return []
    with torch.no_grad():  # the rows share one prompt: scored once (``shared_prefix``)
        values, _ = completion_logprobs(
            _model(policy),
            [list(prompt_ids)] * len(rows),
            rows,
            temperature,
            pad_token_id,
            shared_prefix=True,
        )
    row_of = {completion: r for r, completion in enumerate(wanted)}
    return [float(values[row_of[t.completion], t.position]) for t in request.tokens]


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
    """Whether each of ``request``'s tokens is the one keyed sampling picks (protocol/SPEC.md 1.8)
    under our logits at that position, in the request's order: one batched forward over the
    completions it names, each cut at the last token it needs, right-padded under a mask."""
    wanted, cut = _cut_rows(request, completions)
    if not wanted:
        return []
    prompt = list(prompt_ids)
    rows = [prompt + row for row in cut]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for r, row in enumerate(rows):
        ids[r, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[r, : len(row)] = 1
    with torch.no_grad():
        logits = _model(policy)(input_ids=ids, attention_mask=mask).logits  # (rows, width, vocab)
    row_of = {completion: r for r, completion in enumerate(wanted)}
    out = []
    for t in request.tokens:
        at = logits[row_of[t.completion], len(prompt) - 1 + t.position]  # predicts token t.position
        u = keyed_uniform(seed, task_key, t.completion, t.position)
        out.append(check_token(at, params, u, completions[t.completion][t.position], margin))
    return out
