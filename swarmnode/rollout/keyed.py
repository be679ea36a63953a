"""Keyed sampling: every sampled token is a checkable function of the logits and a learner's seed.

The rule (protocol/SPEC.md §1.8; issue #20). A learner gives its workers a
32-byte seed. The token at position ``t`` (0-based, counted from the first generated token) of
completion ``j`` (0-based, within its group) of task ``key`` (``TaskId.key()``) is chosen by the
inverse-CDF rule the torch engine always used, with its one uniform per draw taken from the seed
instead of a random generator:

    u = (int(SHA-256(DOMAIN || seed || u32(len(k)) || k || u32(j) || u32(t))[:8]) >> 11) + 1) / 2^53
                                                     # in (0, 1]; k = key as UTF-8, u32 big-endian
    p = softmax(top_p(logits / temperature))          # float32, as ``rollout.types`` defines them
    c = cumsum(p)                                     # float32, in token-id order
    token = #{i : c_i < fl32(fl32(u) * c_last)}

A worker that samples anything else (a cheaper model, an older version, another temperature,
greedy decoding, an earlier answer) and reports honest log-probs for it still picks, wherever the
distribution is not near one-hot, tokens the rule does not select, and a learner that recomputes
the logits at a few positions sees it (``check_token``). Kernels differ in the last bits (fp32 vs
bf16, another batch shape), so a position where the threshold lies within ``margin`` of a CDF
boundary between the two candidates is skipped, not failed. Greedy decoding (temperature 0) has
no noise: the token must be an argmax, within ``margin`` of the largest logit.

Owns: the choice and the check (the uniforms: ``rollout.sampling_keys``). Must not: generate,
hold seeds, or decide penalties.
"""

from __future__ import annotations

from enum import StrEnum

import torch

from swarmnode.rollout.sampling_keys import DOMAIN, SEED_BYTES, SamplingKeys, keyed_uniform
from swarmnode.rollout.types import SamplingParams, scaled_logits, top_p_filter

__all__ = [
    "DEFAULT_MARGIN",
    "DOMAIN",
    "SEED_BYTES",
    "SamplingKeys",
    "TokenCheck",
    "check_token",
    "choose",
    "distribution",
    "keyed_uniform",
]

#: Default tolerance of ``check_token``, in CDF units (probability). It was 1e-3, which let a
#: worker send any token at the ~0.2% of positions, known from the seed alone, whose uniform lies
#: within it of 0 or 1 (red team #20); at 1e-4 those are ~0.02%. Honest drift: a worker's 18,666
#: tokens on this CPU at 1 and 2 threads matched with no skip even at 1e-6; with Gaussian noise of
#: sigma on the worker's logits (2,048-token vocabulary, 20,000 draws) 1e-5 failed honest tokens
#: from sigma = 1e-4 on (2.2e-3 of them), 1e-4 none up to sigma = 1e-4 and 1.5e-4 of them at
#: 3e-4. Workers on kernels that drift further (bf16 on a GPU) need a learner with a larger
#: ``learner.keyed_margin``.
DEFAULT_MARGIN = 1e-4


def distribution(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The sampled distribution (..., vocab), float32: top-p of the temperature-scaled logits."""
    scaled = scaled_logits(logits, params)
    if params.top_p < 1.0:
        return top_p_filter(scaled, params.top_p).softmax(dim=-1)
    return torch.log_softmax(scaled, dim=-1).exp()  # as the torch engine computes it


def choose(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """The rule's tokens (R,) for float32 ``probs`` (R, vocab) and uniforms (R,) in (0, 1]."""
    cdf = probs.cumsum(dim=-1)
    threshold = uniform.to(device=probs.device, dtype=torch.float32).unsqueeze(1) * cdf[:, -1:]
    return (cdf < threshold).sum(dim=-1)


class TokenCheck(StrEnum):
    MATCH = "match"
    MISMATCH = "mismatch"
    SKIPPED = "skipped"  # within the margin of a boundary: float drift could explain it


def check_token(
    logits: torch.Tensor, params: SamplingParams, uniform: float, token: int, margin: float = DEFAULT_MARGIN
) -> TokenCheck:
    """Is ``token`` the rule's choice under ``logits`` (vocab,) recomputed by the checker?"""
    vocab = logits.shape[-1]
    if not 0 <= token < vocab:
        return TokenCheck.MISMATCH
    if params.greedy:
        scores = logits.float()
        best = float(scores.max())
        if int(scores.argmax()) == token:
            return TokenCheck.MATCH
        return TokenCheck.SKIPPED if best - float(scores[token]) <= margin else TokenCheck.MISMATCH
    probs = distribution(logits.unsqueeze(0), params)
    mine = int(choose(probs, torch.tensor([uniform], dtype=torch.float64))[0])
    if mine == token:
        return TokenCheck.MATCH
    cdf = probs[0].cumsum(dim=-1)
    threshold = float(torch.tensor(uniform, dtype=torch.float32) * cdf[-1])
    low, high = min(mine, token), max(mine, token)
    # The two choices differ only if every boundary between them (c_low .. c_{high-1}) moved across
    # the threshold: a drift of at most ``margin`` can do that only if each is that close to it.
    between = cdf[low:high]
    return TokenCheck.SKIPPED if float((between - threshold).abs().max()) <= margin else TokenCheck.MISMATCH
