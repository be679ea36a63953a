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


def test_one_scan_gives_the_spot_checks_logprobs_bit_for_bit_and_the_logits_of_its_token_checks(
    policy: Policy, honest: GenerationResult
) -> None:
    """The learner takes a spot check's log-probs and its keyed token checks from one scan of the
    group (``scan_group``): the log-probs are exactly the trainer's rule on the same rows
    (``completion_logprobs``, packed), the logits of the drawn tokens are the forward's rows, and
    checking tokens on them equals checking on a forward pass of their own."""
    from swarmnode.admit.recompute import check_request_tokens, group_logits, pick, scan_group, tokens_at
    from swarmnode.train.batch import completion_logprobs

    checker = SpotChecker(SpotCheckConfig(sample_rate=1.0, max_tokens=8))
    params = SamplingParams(temperature=TEMPERATURE, max_new_tokens=12)
    for key, (prompt, completions, _) in enumerate(groups(honest)):
        request = checker.select("worker", key, [len(c) for c in completions])
        assert request is not None
        scan = scan_group(policy, request, prompt, completions, TEMPERATURE, token_checks=8, draw_seed=key)
        with torch.no_grad():
            reference, _ = completion_logprobs(
                policy.model, [prompt] * len(completions), completions, TEMPERATURE, shared_prefix=True
            )
        assert scan.logprobs == [float(reference[t.completion, t.position]) for t in request.tokens]
        assert len(scan.tokens.tokens) == 8
        full, _ = group_logits(policy, prompt, completions)
        torch.testing.assert_close(scan.token_logits, pick(full, scan.tokens), rtol=0, atol=0)
        for seed in (b"\x01" * 32, b"\x02" * 32):
            own = check_request_tokens(policy, scan.tokens, prompt, completions, params, seed, str(key))
            assert tokens_at(scan.token_logits, scan.tokens, completions, params, seed, str(key)) == own


def test_keyed_checks_go_mostly_where_the_policy_is_unsure_yet_every_token_keeps_a_chance(
    policy: Policy, honest: GenerationResult
) -> None:
    """Half the token checks uniform, half drawn with weight ``1 - p_top + 1/16``: without
    replacement, reproducible from the draw seed, every token reachable, and the drawn tokens less
    certain on average than the group's."""
    from swarmnode.admit.recompute import group_logits, scan_group

    prompt, completions, _ = groups(honest)[0]
    sharp = 0.1  # the untrained tiny model is unsure everywhere; sharpened, its certainty varies
    full, _ = group_logits(policy, prompt, completions)
    top = torch.softmax(full / sharp, dim=-1).max(dim=-1).values
    everywhere = {(c, t) for c in range(len(completions)) for t in range(len(completions[c]))}
    request = SpotChecker(SpotCheckConfig(max_tokens=4)).select("w", "g", [len(c) for c in completions])
    assert request is not None
    seen: dict[tuple[int, int], int] = {}
    draws = 300
    for seed in range(draws):
        tokens = scan_group(
            policy, request, prompt, completions, sharp, token_checks=6, draw_seed=seed
        ).tokens
        refs = [(t.completion, t.position) for t in tokens.tokens]
        assert len(set(refs)) == 6 and refs == sorted(refs) and set(refs) <= everywhere
        for ref in refs:
            seen[ref] = seen.get(ref, 0) + 1
    again = scan_group(policy, request, prompt, completions, sharp, token_checks=6, draw_seed=7)
    assert (
        again.tokens
        == scan_group(policy, request, prompt, completions, sharp, token_checks=6, draw_seed=7).tokens
    )
    doubt = {ref: 1.0 - float(top[ref]) for ref in everywhere}
    drawn_doubt = sum(doubt[ref] * n for ref, n in seen.items()) / (6 * draws)
    assert drawn_doubt > 1.2 * sum(doubt.values()) / len(doubt)  # drawn where we are less sure
    assert set(seen) == everywhere  # and every token keeps a chance
    whole = scan_group(policy, request, prompt, completions, sharp, token_checks=10_000, draw_seed=1)
    assert len(whole.tokens.tokens) == len(everywhere)  # a group smaller than the ask: all of it


def test_a_quarter_of_the_token_checks_go_to_the_completions_last_tokens_where_answers_are(
    policy: Policy,
) -> None:
    """Red team (#20): a worker that overwrote only the last token of each of 8 completions of 256
    tokens was caught by 6% of checks drawn over the whole group."""
    from swarmnode.admit.recompute import scan_group
    from swarmnode.admit.spotcheck import TAIL_TOKENS

    vocab = policy.model.config.vocab_size
    g = torch.Generator().manual_seed(9)
    prompt = [1, *torch.randint(3, vocab, (5,), generator=g).tolist()]
    completions = [torch.randint(3, vocab, (256,), generator=g).tolist() for _ in range(8)]
    request = SpotChecker(SpotCheckConfig(max_tokens=4)).select("w", "g", [256] * 8)
    assert request is not None
    in_tail = []
    for seed in range(20):
        scan = scan_group(policy, request, prompt, completions, 1.0, token_checks=16, draw_seed=seed)
        assert len(set(scan.tokens.tokens)) == 16
        in_tail.append(sum(t.position >= 256 - TAIL_TOKENS for t in scan.tokens.tokens))
    assert min(in_tail) >= 4  # 16 x 0.25, where a uniform draw would put 0.5 on average


def test_a_group_scanned_in_several_packs_gives_the_same_values(policy: Policy) -> None:
    """A group longer than ``MAX_PACK_TOKENS`` is scanned pack by pack: the same log-probs and token
    logits as scoring each completion in a row of its own."""
    from swarmnode.admit.recompute import scan_group
    from swarmnode.train.batch import pack_rows

    vocab = policy.model.config.vocab_size
    g = torch.Generator().manual_seed(5)
    prompt = [1, *torch.randint(3, vocab, (9,), generator=g).tolist()]
    completions = [torch.randint(3, vocab, (800,), generator=g).tolist() for _ in range(4)]
    assert len(pack_rows([prompt] * 4, completions)) == 2
    request = SpotChecker(SpotCheckConfig(max_tokens=16)).select("w", "g", [800] * 4)
    assert request is not None
    scan = scan_group(policy, request, prompt, completions, 1.0, token_checks=16, draw_seed=2)
    with torch.no_grad():  # each completion in a row of its own: logits at len(prompt) - 1 + t
        rows = torch.stack(
            [
                policy.model(input_ids=torch.tensor([prompt + c])).logits[0, len(prompt) - 1 : -1]
                for c in completions
            ]
        )
    picked = rows[[t.completion for t in request.tokens], [t.position for t in request.tokens]]
    expected = torch.log_softmax(picked, dim=-1)
    tokens = torch.tensor([completions[t.completion][t.position] for t in request.tokens])
    torch.testing.assert_close(
        torch.tensor(scan.logprobs),
        expected.gather(-1, tokens.unsqueeze(-1)).squeeze(-1),
        rtol=1e-4,
        atol=1e-4,
    )
    at = rows[[t.completion for t in scan.tokens.tokens], [t.position for t in scan.tokens.tokens]]
    torch.testing.assert_close(scan.token_logits, at, rtol=1e-4, atol=1e-4)
