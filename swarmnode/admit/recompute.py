"""Recomputing a worker's reported log-probs for a spot-check (the torch half of ``core.spotcheck``).

Owns: one forward pass that scores completion tokens under our policy, with the same rule as the
trainer and the rollout engines (``completion_logprobs``: logits / temperature, log-softmax, before
any top-p truncation); the draw of the tokens to check against keyed sampling (#20) and their
check, all from one forward pass over the group, pack by pack (``scan_group``, then ``tokens_at``
per seed), the draw following ``core.spotcheck``'s rule (``UNIFORM_SHARE``, ``UNCERTAIN_FLOOR``).
Must not: decide which batches, groups or how many tokens to check, or judge the result
(``core.spotcheck``).

The caller passes the policy *version the group claims* it was generated with, in eval mode
(dropout off), and runs this off the event loop like any torch work.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from swarmnode.admit.spotcheck import (
    TAIL_SHARE,
    TAIL_TOKENS,
    UNCERTAIN_FLOOR,
    UNIFORM_SHARE,
    SpotCheckRequest,
    TokenRef,
)
from swarmnode.policy.model import Policy
from swarmnode.rollout.keyed import DEFAULT_MARGIN, TokenCheck, check_token, keyed_uniform
from swarmnode.rollout.types import SamplingParams
from swarmnode.train.batch import completion_logits, completion_logprobs, pack_rows


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
    vocab)``, and its ``(G, T)`` mask, packed (``train.batch``). All of them at once: for tests and
    benches on small groups; the learner scans a group pack by pack (``scan_group``)."""
    rows = [list(c) for c in completions]
    with torch.no_grad():
        return completion_logits(_model(policy), [list(prompt_ids)] * len(rows), rows, pad_token_id)


@dataclass(frozen=True)
class GroupScan:
    """What a spot check needs from one scan of a group: our log-probs at the log-prob request's
    tokens (its order), the tokens drawn for keyed-sampling checks, and their logits ``(n, vocab)``
    in that request's order."""

    logprobs: list[float]
    tokens: SpotCheckRequest
    token_logits: torch.Tensor


@dataclass
class _Candidates:
    """The best ``keep`` tokens by key seen so far, with their logits rows (bounded memory)."""

    keep: int
    keys: list[float] = field(default_factory=list)
    refs: list[tuple[int, int]] = field(default_factory=list)

    def offer(self, keys: torch.Tensor, refs: list[tuple[int, int]]) -> None:
        merged_keys = self.keys + [float(k) for k in keys]
        merged_refs = self.refs + refs
        order = sorted(range(len(merged_keys)), key=lambda i: merged_keys[i], reverse=True)[: self.keep]
        self.keys = [merged_keys[i] for i in order]
        self.refs = [merged_refs[i] for i in order]


def scan_group(
    policy: Policy | torch.nn.Module,
    request: SpotCheckRequest,
    prompt_ids: Sequence[int],
    completions: Sequence[Sequence[int]],
    temperature: float,
    pad_token_id: int = 0,
    *,
    token_checks: int = 0,
    draw_seed: int = 0,
) -> GroupScan:
    """One forward pass over the group, pack by pack (``train.batch.pack_rows``: time linear in
    G x T, memory one pack's logits plus the kept rows), giving our log-probs at ``request``'s
    tokens and ``token_checks`` tokens drawn for keyed-sampling checks (``core.spotcheck``'s
    rule), without replacement: ``token_checks * TAIL_SHARE`` (rounded down) uniformly from the
    completions' last ``TAIL_TOKENS`` tokens, where the answers are; ``token_checks *
    UNIFORM_SHARE`` uniformly from every token of the group; the rest with weight ``1 - p_top +
    UNCERTAIN_FLOOR`` (``p_top``: the probability our policy gives its most likely token there,
    after temperature), by Efraimidis-Spirakis keys ``log(v) / w`` so the draw streams over the
    packs. The uniforms come from ``draw_seed`` (the spot checker's secret stream): the worker
    cannot predict the positions. Where we are sure every sampler agrees and a check tells
    nothing, so the weighted part goes where we are not; the uniform part keeps a cheater who
    puts its wrong tokens where we are sure from slipping past (helper-14: caught by 0.557 of
    weighted checks against 0.626 of uniform ones); the tail part catches one who overwrites only
    its answers."""
    _check_request(request, completions)
    model = _model(policy)
    rows = [list(c) for c in completions]
    prompt = list(prompt_ids)
    total = sum(len(r) for r in rows)
    token_checks = min(token_checks, total)
    n_tail = int(token_checks * TAIL_SHARE)
    tail = _Candidates(n_tail)
    uniform = _Candidates(n_tail + int(token_checks * UNIFORM_SHARE))  # enough after the tail's
    weighted = _Candidates(token_checks)  # enough left after the others are taken out
    wanted = {(token.completion, token.position) for token in request.tokens}
    rows_at: dict[tuple[int, int], torch.Tensor] = {}  # logits rows kept: requested or candidates
    generator = torch.Generator().manual_seed(draw_seed & 0x7FFF_FFFF_FFFF_FFFF)
    with torch.no_grad():
        for pack in pack_rows([prompt] * len(rows), rows):
            logits, mask = completion_logits(
                model, [prompt] * len(pack), [rows[r] for r in pack], pad_token_id
            )
            row_of = {r: j for j, r in enumerate(pack)}
            for c, t in wanted:
                if c in row_of:
                    rows_at[(c, t)] = logits[row_of[c], t].clone()
            if token_checks == 0:
                continue
            width = mask.shape[1]
            valid = mask.flatten() > 0
            scaled = logits / temperature if temperature != 1.0 else logits
            top = torch.softmax(scaled, dim=-1).max(dim=-1).values.flatten().double()
            u = torch.rand(mask.shape, generator=generator, dtype=torch.float64).flatten()
            v = torch.rand(mask.shape, generator=generator, dtype=torch.float64).flatten()
            z = torch.rand(mask.shape, generator=generator, dtype=torch.float64).flatten()
            lengths = torch.tensor([len(rows[r]) for r in pack]).unsqueeze(1)
            at_tail = (torch.arange(width).unsqueeze(0) >= lengths - TAIL_TOKENS).flatten() & valid
            weighted_keys = torch.log1p(-v) / (1.0 - top + UNCERTAIN_FLOOR)
            for candidates, keys, where in (
                (tail, z, at_tail),
                (uniform, u, valid),
                (weighted, weighted_keys, valid),
            ):
                keys = keys.masked_fill(~where, -math.inf)
                best = torch.topk(keys, min(candidates.keep, int(where.sum()))).indices.tolist()
                candidates.offer(keys[best], [(pack[i // width], i % width) for i in best])
            kept = set(tail.refs) | set(uniform.refs) | set(weighted.refs)
            for c, t in kept:
                if c in row_of and (c, t) not in rows_at:
                    rows_at[(c, t)] = logits[row_of[c], t].clone()
            for ref in [ref for ref in rows_at if ref not in kept and ref not in wanted]:
                del rows_at[ref]
    chosen = list(tail.refs)
    for part, upto in (
        (uniform.refs, n_tail + int(token_checks * UNIFORM_SHARE)),
        (weighted.refs, token_checks),
    ):
        for ref in part:
            if len(chosen) >= upto:
                break
            if ref not in chosen:
                chosen.append(ref)
    chosen.sort()
    tokens = SpotCheckRequest(request.peer, request.group, tuple(TokenRef(c, t) for c, t in chosen))
    vocab = next(iter(rows_at.values())).shape[-1] if rows_at else 0
    token_logits = torch.stack([rows_at[ref] for ref in chosen]) if chosen else torch.zeros(0, vocab)
    logprobs: list[float] = []
    if request.tokens:
        picked = torch.stack([rows_at[(t.completion, t.position)] for t in request.tokens])
        logprobs = logprobs_at(picked, request, completions, temperature)
    return GroupScan(logprobs, tokens, token_logits)


def pick(logits: torch.Tensor, request: SpotCheckRequest) -> torch.Tensor:
    """``group_logits`` rows at ``request``'s tokens, in its order: ``(len(request.tokens), vocab)``."""
    rows = torch.tensor([t.completion for t in request.tokens], dtype=torch.long)
    positions = torch.tensor([t.position for t in request.tokens], dtype=torch.long)
    return logits[rows, positions]


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
