"""Spot-check recomputation with a real (tiny) policy: honest reports pass, misreports fail."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch

from swarmnode.admit.recompute import recompute_logprobs, recompute_request
from swarmnode.admit.spotcheck import SpotCheckConfig, SpotChecker, Verdict
from swarmnode.policy.model import Policy, build_tiny_policy
from swarmnode.rollout import SamplingParams, make_engine
from swarmnode.rollout.types import GenerationResult

TEMPERATURE = 0.8


@pytest.fixture(scope="module")
def policy() -> Policy:
    torch.set_num_threads(1)
    p = build_tiny_policy(0)
    p.model.eval()
    return p


@pytest.fixture(scope="module")
def honest(policy: Policy) -> GenerationResult:
    """What an honest worker sends: completions and the engine's own log-probs."""
    engine = make_engine("torch", policy)
    params = SamplingParams(temperature=TEMPERATURE, max_new_tokens=12)
    return engine.generate(["12+7=", "5-9=", "46-37="], 4, params, torch.Generator().manual_seed(3))


def groups(result: GenerationResult) -> list[tuple[list[int], list[list[int]], list[list[float]]]]:
    return [
        (prompt, [c.token_ids for c in group], [c.logprobs for c in group])
        for prompt, group in zip(result.prompt_ids, result.completions, strict=True)
    ]


def run_checks(
    policy: Policy,
    result: GenerationResult,
    reported_of: Callable[[list[int], list[list[int]], list[list[float]]], list[list[float]]] | None = None,
    config: SpotCheckConfig | None = None,
) -> list[Verdict]:
    checker = SpotChecker(config or SpotCheckConfig(sample_rate=1.0, max_tokens=8, tolerance=1e-3))
    verdicts = []
    for key, (prompt, completions, reported) in enumerate(groups(result)):
        if reported_of is not None:
            reported = reported_of(prompt, completions, reported)
        request = checker.select("worker", key, [len(c) for c in completions])
        assert request is not None
        recomputed = recompute_request(policy, request, prompt, completions, TEMPERATURE)
        verdicts.append(checker.check("worker", request.pick(reported), recomputed).verdict)
    return verdicts


def test_recomputed_log_probs_match_what_the_engine_reported(
    policy: Policy, honest: GenerationResult
) -> None:
    prompt, completions, reported = groups(honest)[0]
    for tokens, logprobs in zip(completions, reported, strict=True):
        ours = recompute_logprobs(policy, prompt, tokens, TEMPERATURE)
        assert len(ours) == len(tokens)
        assert ours == pytest.approx(logprobs, abs=1e-4)
    assert recompute_logprobs(policy, prompt, [], TEMPERATURE) == []


def test_an_honest_worker_passes_every_check(policy: Policy, honest: GenerationResult) -> None:
    assert run_checks(policy, honest) == [Verdict.OK] * 3


def test_log_probs_from_other_weights_fail_and_get_the_worker_deactivated(
    policy: Policy, honest: GenerationResult
) -> None:
    """A worker that generated with stale weights but claims the current version."""
    stale = copy.deepcopy(policy)
    noise = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in stale.model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=noise, dtype=parameter.dtype) * 0.05)

    def from_stale(
        prompt: list[int], completions: list[list[int]], _: list[list[float]]
    ) -> list[list[float]]:
        return [recompute_logprobs(stale, prompt, c, TEMPERATURE) for c in completions]

    config = SpotCheckConfig(sample_rate=1.0, max_tokens=8, tolerance=1e-3, max_strikes=3)
    assert run_checks(policy, honest, from_stale, config) == [Verdict.OK, Verdict.OK, Verdict.DEACTIVATE]


def test_inflated_log_probs_fail(policy: Policy, honest: GenerationResult) -> None:
    """A worker that reports its tokens as near-certain (to shrink the importance ratio's denominator)."""

    def inflated(_: list[int], completions: list[list[int]], __: list[list[float]]) -> list[list[float]]:
        return [[-0.01] * len(c) for c in completions]

    config = SpotCheckConfig(sample_rate=1.0, max_tokens=8, tolerance=0.1, max_strikes=1)
    assert run_checks(policy, honest, inflated, config)[0] is Verdict.DEACTIVATE


def test_a_request_beyond_the_group_is_refused(policy: Policy) -> None:
    request = SpotChecker(SpotCheckConfig(max_tokens=4)).select("w", "g", [5, 5])
    assert request is not None
    with pytest.raises(ValueError, match="beyond the group"):
        recompute_request(policy, request, [1, 2], [[3, 4]], 1.0)


def test_one_forward_gives_the_spot_checks_logprobs_bit_for_bit_and_its_token_checks(
    policy: Policy, honest: GenerationResult
) -> None:
    """The learner takes a spot check's log-probs and its keyed token checks from one forward pass
    over the group (``group_logits``): the log-probs are exactly the trainer's rule on the same rows
    (``completion_logprobs``, packed), and each seed's token checks equal those of a forward pass
    of their own."""
    from swarmnode.admit.recompute import check_request_tokens, group_logits, logprobs_at, pick, tokens_at
    from swarmnode.train.batch import completion_logprobs

    checker = SpotChecker(SpotCheckConfig(sample_rate=1.0, max_tokens=8))
    params = SamplingParams(temperature=TEMPERATURE, max_new_tokens=12)
    for key, (prompt, completions, _) in enumerate(groups(honest)):
        request = checker.select("worker", key, [len(c) for c in completions])
        assert request is not None
        full, mask = group_logits(policy, prompt, completions)
        assert full.shape[:2] == mask.shape == (len(completions), max(len(c) for c in completions))
        logits = pick(full, request)
        assert logits.shape == (len(request.tokens), policy.model.config.vocab_size)
        with torch.no_grad():
            reference, _ = completion_logprobs(
                policy.model, [prompt] * len(completions), completions, TEMPERATURE, shared_prefix=True
            )
        expected = [float(reference[t.completion, t.position]) for t in request.tokens]
        assert logprobs_at(logits, request, completions, TEMPERATURE) == expected
        for seed in (b"\x01" * 32, b"\x02" * 32):
            own = check_request_tokens(policy, request, prompt, completions, params, seed, str(key))
            assert tokens_at(logits, request, completions, params, seed, str(key)) == own
