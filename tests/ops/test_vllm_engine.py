"""The vllm engine: a clear error where vllm/CUDA is missing, and its glue to vLLM's API.

The glue is tested against ``FakeLLM``, which stands in for ``vllm.LLM`` by sampling
from its own copy of the model and returning vLLM's output shapes with vLLM's
``processed_logprobs`` semantics (log-probs after temperature and top-p). The real
engine is exercised on a GPU by ``bench/vllm_smoke.py``.
"""

from __future__ import annotations

import copy
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from swarmnode.errors import EngineUnavailable
from swarmnode.policy.model import Policy, build_tiny_policy
from swarmnode.rollout import make_engine
from swarmnode.rollout.types import SamplingParams, sequence_logprobs, top_p_filter
from swarmnode.rollout.vllm_engine import VLLMEngine, rows_from_outputs

REPO = Path(__file__).resolve().parents[2]
HAS_VLLM_GPU = importlib.util.find_spec("vllm") is not None and torch.cuda.is_available()
PROMPTS = ["12+30=", "7+5=", "58+26="]


@dataclass
class FakeSamplingParams:
    """The vllm.SamplingParams fields the engine sets."""

    n: int
    temperature: float
    top_p: float
    max_tokens: int
    logprobs: int
    seed: int | None
    stop_token_ids: list[int] = field(default_factory=list)
    detokenize: bool = True


class FakeModel:
    """vLLM's model as seen by a worker: ``load_weights`` takes HF-named tensors."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> set[str]:
        self.module.load_state_dict(dict(weights))
        return {name for name, _ in weights}


class FakeLLM:
    """Samples token by token from its own copy of the model, as vLLM does with these params."""

    def __init__(self, policy: Policy) -> None:
        self.module = copy.deepcopy(policy.model)
        self.worker = SimpleNamespace(model_runner=SimpleNamespace(model=FakeModel(self.module)))
        self.prefix_resets = 0
        self.rpc_calls = 0

    def collective_rpc(self, method: Any, args: tuple[Any, ...] = ()) -> list[Any]:
        self.rpc_calls += 1
        return [method(self.worker, *args)]

    def reset_prefix_cache(self) -> bool:
        self.prefix_resets += 1
        return True

    def generate(self, requests: list[dict[str, list[int]]], params: list[Any], use_tqdm: bool) -> list[Any]:
        assert not use_tqdm
        outputs = []
        for request, p in zip(requests, params, strict=True):
            assert p.logprobs == 0 and not p.detokenize
            generator = torch.Generator().manual_seed(p.seed if p.seed is not None else 0)
            samples = [self._sample(list(request["prompt_token_ids"]), p, generator, i) for i in range(p.n)]
            outputs.append(SimpleNamespace(outputs=samples[::-1]))  # vLLM does not promise the order
        return outputs

    def _sample(self, ids: list[int], p: Any, generator: torch.Generator, index: int) -> Any:
        tokens: list[int] = []
        logprobs: list[dict[int, Any]] = []
        with torch.inference_mode():
            for _ in range(p.max_tokens):
                logits = self.module(input_ids=torch.tensor([ids + tokens])).logits[0, -1].float()
                if p.temperature == 0:
                    token = int(logits.argmax())
                    processed = torch.log_softmax(logits, -1)
                else:
                    processed = torch.log_softmax(
                        top_p_filter((logits / p.temperature)[None], p.top_p)[0], -1
                    )
                    token = int(torch.multinomial(processed.exp(), 1, generator=generator))
                tokens.append(token)
                logprobs.append({token: SimpleNamespace(logprob=float(processed[token]))})
                if token in p.stop_token_ids:
                    break
        return SimpleNamespace(index=index, token_ids=tokens, logprobs=logprobs)


@pytest.fixture(scope="module")
def base_policy() -> Policy:
    torch.set_num_threads(1)
    return build_tiny_policy(0)


@pytest.fixture
def policy(base_policy: Policy) -> Policy:
    return Policy(copy.deepcopy(base_policy.model), base_policy.tokenizer, base_policy.model_id)


def fake_engine(policy: Policy) -> tuple[VLLMEngine, FakeLLM]:
    llm = FakeLLM(policy)
    return VLLMEngine(policy, llm=llm, sampling_params_cls=FakeSamplingParams), llm


def teacher_forced(
    policy: Policy, prompt: list[int], tokens: list[int], params: SamplingParams
) -> torch.Tensor:
    with torch.inference_mode():
        logits = policy.model(input_ids=torch.tensor([prompt + tokens])).logits[0]
    scores = logits[len(prompt) - 1 : len(prompt) - 1 + len(tokens)]
    return sequence_logprobs(scores, torch.tensor(tokens), params)


@pytest.mark.skipif(HAS_VLLM_GPU, reason="vllm and a GPU are present here")
def test_choosing_vllm_without_vllm_or_a_gpu_raises_engine_unavailable_naming_the_way_out(
    policy: Policy,
) -> None:
    with pytest.raises(EngineUnavailable, match="vllm") as from_factory:
        make_engine("vllm", policy)
    with pytest.raises(EngineUnavailable, match="choose engine 'torch'"):
        VLLMEngine(policy)
    assert "torch" in str(from_factory.value)


def test_with_vllm_installed_but_no_cuda_gpu_the_error_says_the_gpu_is_missing(
    policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real_find_spec(name, *a)
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(EngineUnavailable, match="needs a CUDA GPU and torch sees none"):
        VLLMEngine(policy)


@pytest.mark.skipif(HAS_VLLM_GPU, reason="vllm and a GPU are present here")
def test_the_smoke_script_says_it_did_not_run_and_exits_2_without_vllm(
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = importlib.util.spec_from_file_location("vllm_smoke", REPO / "bench" / "vllm_smoke.py")
    assert spec is not None and spec.loader is not None
    smoke = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(smoke)
    assert smoke.main([]) == 2
    assert "vllm smoke test not run" in capsys.readouterr().err


def test_sampled_logprobs_follow_the_rollout_convention_and_keep_n_samples_per_prompt(
    policy: Policy,
) -> None:
    engine, _ = fake_engine(policy)
    params = SamplingParams(temperature=0.7, max_new_tokens=6)
    result = engine.generate(PROMPTS, 4, params, torch.Generator().manual_seed(0))

    assert [len(group) for group in result.completions] == [4, 4, 4]
    assert result.prompt_ids == [policy.encode_prompt(p) for p in PROMPTS]
    for prompt, group in zip(result.prompt_ids, result.completions, strict=True):
        for completion in group:
            expected = teacher_forced(policy, prompt, completion.token_ids, params)
            assert torch.allclose(torch.tensor(completion.logprobs), expected, atol=1e-5)
            assert completion.finished == (policy.eos_token_id in completion.token_ids)
    assert result.tokens_generated == sum(len(c.token_ids) for g in result.completions for c in g)


def test_with_top_p_below_1_logprobs_are_rescored_to_their_pre_truncation_values(policy: Policy) -> None:
    engine, _ = fake_engine(policy)
    params = SamplingParams(temperature=1.0, top_p=0.3, max_new_tokens=5)
    result = engine.generate(PROMPTS, 2, params, torch.Generator().manual_seed(1))
    for prompt, group in zip(result.prompt_ids, result.completions, strict=True):
        for completion in group:
            expected = teacher_forced(policy, prompt, completion.token_ids, params)
            assert torch.allclose(torch.tensor(completion.logprobs), expected, atol=1e-5)


def test_update_weights_loads_the_new_weights_into_the_running_engine_and_drops_the_prefix_cache(
    policy: Policy,
) -> None:
    engine, llm = fake_engine(policy)
    other = build_tiny_policy(1)
    replacement = Policy(other.model, policy.tokenizer, policy.model_id, version=policy.version + 1)

    engine.update_weights(replacement)

    assert engine._llm is llm  # the same engine: no restart
    assert llm.prefix_resets == 1
    for name, tensor in replacement.model.state_dict().items():
        assert torch.equal(llm.module.state_dict()[name], tensor), name
    params = SamplingParams(temperature=1.0, max_new_tokens=4)
    result = engine.generate(PROMPTS[:1], 2, params, torch.Generator().manual_seed(2))
    assert result.policy_version == replacement.version
    completion = result.completions[0][0]
    expected = teacher_forced(replacement, result.prompt_ids[0], completion.token_ids, params)
    assert torch.allclose(torch.tensor(completion.logprobs), expected, atol=1e-5)


def test_an_in_place_optimizer_step_reaches_the_engine_before_the_next_generate(policy: Policy) -> None:
    engine, llm = fake_engine(policy)
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(0.01)
    engine.generate(PROMPTS[:1], 1, SamplingParams(max_new_tokens=2), torch.Generator().manual_seed(0))
    assert llm.rpc_calls == 1
    weight = next(iter(policy.model.state_dict()))
    assert torch.equal(llm.module.state_dict()[weight], policy.model.state_dict()[weight])
    engine.generate(PROMPTS[:1], 1, SamplingParams(max_new_tokens=2), torch.Generator().manual_seed(0))
    assert llm.rpc_calls == 1  # unchanged weights are not pushed again


def test_the_same_generator_seed_gives_the_same_samples(policy: Policy) -> None:
    engine, _ = fake_engine(policy)
    params = SamplingParams(temperature=1.0, max_new_tokens=6)
    first = engine.generate(PROMPTS, 3, params, torch.Generator().manual_seed(5))
    again = engine.generate(PROMPTS, 3, params, torch.Generator().manual_seed(5))
    assert [[c.token_ids for c in g] for g in first.completions] == [
        [c.token_ids for c in g] for g in again.completions
    ]


def test_an_output_without_logprobs_is_an_engine_error() -> None:
    output = SimpleNamespace(outputs=[SimpleNamespace(index=0, token_ids=[5, 2], logprobs=None)])
    with pytest.raises(EngineUnavailable, match="log-probs"):
        rows_from_outputs([output], 1)
