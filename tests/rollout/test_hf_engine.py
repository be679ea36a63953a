"""The HF reference engine, and agreement between it and the torch engine."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from swarmnode.policy.model import Policy
from swarmnode.rollout.hf_engine import HFEngine
from swarmnode.rollout.torch_engine import TorchEngine
from swarmnode.rollout.types import SamplingParams

from .conftest import LONG_PROMPTS, PROMPTS
from .test_torch_engine import assert_logprobs_exact


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0, max_new_tokens=10),
        SamplingParams(temperature=0.6, top_p=0.8, max_new_tokens=10),
    ],
    ids=["t1", "t0.6-top-p"],
)
def test_hf_logprobs_equal_a_full_forward_pass(tiny: Policy, params: SamplingParams) -> None:
    result = HFEngine(tiny).generate(PROMPTS, 3, params, torch.Generator().manual_seed(0))
    assert_logprobs_exact(tiny, result, params.temperature)


def test_hf_rows_stop_at_their_own_eos(tiny: Policy) -> None:
    result = HFEngine(tiny).generate(
        PROMPTS, 8, SamplingParams(max_new_tokens=16), torch.Generator().manual_seed(1)
    )
    eos = tiny.eos_token_id
    completions = [c for g in result.completions for c in g]
    assert any(c.finished for c in completions)
    for c in completions:
        assert c.token_ids.count(eos) == int(c.finished)
        assert (c.token_ids[-1] == eos) if c.finished else (len(c.token_ids) == 16)


def test_hf_same_generator_seed_gives_the_same_output_without_moving_global_rng(tiny: Policy) -> None:
    engine = HFEngine(tiny)
    torch.manual_seed(11)
    expected_next = torch.rand(2)
    torch.manual_seed(11)
    a = engine.generate(PROMPTS, 2, SamplingParams(), torch.Generator().manual_seed(9))
    assert torch.equal(torch.rand(2), expected_next)
    b = engine.generate(PROMPTS, 2, SamplingParams(), torch.Generator().manual_seed(9))
    assert [[c.token_ids for c in g] for g in a.completions] == [
        [c.token_ids for c in g] for g in b.completions
    ]


@pytest.mark.parametrize("prompts", [PROMPTS, LONG_PROMPTS], ids=["compact", "long"])
def test_torch_and_hf_engines_agree_on_greedy_output(sharp: Policy, prompts: list[str]) -> None:
    params = SamplingParams(temperature=0.0, max_new_tokens=12)
    ours = TorchEngine(sharp).generate(prompts, 2, params)
    reference = HFEngine(sharp).generate(prompts, 2, params)
    assert ours.prompt_ids == reference.prompt_ids
    for group_a, group_b in zip(ours.completions, reference.completions, strict=True):
        for a, b in zip(group_a, group_b, strict=True):
            assert a.token_ids == b.token_ids
            assert a.finished == b.finished
            assert a.text == b.text
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_torch_and_hf_engines_sample_the_same_first_token_distribution(sharp: Policy) -> None:
    params = SamplingParams(temperature=1.5, top_p=0.9, max_new_tokens=1)
    counts = []
    for engine in (TorchEngine(sharp), HFEngine(sharp)):
        result = engine.generate(["7+8="], 4000, params, torch.Generator().manual_seed(3))
        counts.append(Counter(c.token_ids[0] for c in result.completions[0]))
    ours, reference = counts
    distance = sum(abs(ours[k] - reference[k]) for k in set(ours) | set(reference)) / (2 * 4000)
    assert distance < 0.06  # total variation between two 4000-sample estimates (noise ~0.03)


def test_torch_and_hf_engines_sample_sequences_of_the_same_likelihood(sharp: Policy) -> None:
    """Whole sequences: the mean log-likelihood of samples (minus the entropy) agrees within noise."""
    params = SamplingParams(temperature=1.2, top_p=0.95, max_new_tokens=6)
    stats = []
    for engine in (TorchEngine(sharp), HFEngine(sharp)):
        result = engine.generate(["58+26=", "3-9="], 1000, params, torch.Generator().manual_seed(4))
        totals = torch.tensor([sum(c.logprobs) for g in result.completions for c in g], dtype=torch.float64)
        stats.append((float(totals.mean()), float(totals.std()) / len(totals) ** 0.5))
    (mean_a, se_a), (mean_b, se_b) = stats
    assert abs(mean_a - mean_b) < 4 * (se_a**2 + se_b**2) ** 0.5


def test_hf_engine_ignores_sampling_defaults_in_the_models_generation_config() -> None:
    from swarmnode.policy.model import build_tiny_policy

    policy = build_tiny_policy(0)
    policy.model.generation_config.top_k = 1  # would make every sample the argmax
    policy.model.generation_config.repetition_penalty = 5.0
    policy.model.generation_config.temperature = 0.1
    result = HFEngine(policy).generate(
        ["7+8="], 400, SamplingParams(max_new_tokens=1), torch.Generator().manual_seed(0)
    )
    first_tokens = Counter(c.token_ids[0] for c in result.completions[0])
    assert len(first_tokens) > 10  # near-uniform at random init, T=1: many distinct tokens
