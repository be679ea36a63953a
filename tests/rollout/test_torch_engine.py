"""The torch engine: exact log-probs, per-sequence EOS stop, sampling rules, determinism."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from swarmnode.errors import EngineUnavailable
from swarmnode.policy.model import Policy, build_tiny_policy
from swarmnode.policy.tokenizer import build_char_tokenizer
from swarmnode.rollout import make_engine, torch_engine
from swarmnode.rollout.torch_engine import TorchEngine
from swarmnode.rollout.types import GenerationResult, SamplingParams

from .conftest import LONG_PROMPTS, PROMPTS, peaked


def full_forward_logprobs(
    policy: Policy, prompt_ids: list[int], completion: list[int], temperature: float
) -> list[float]:
    """Reference: one unpadded forward over prompt + completion; log_softmax(logits / T) at each token."""
    ids = torch.tensor([prompt_ids + completion])
    with torch.no_grad():
        logits = policy.model(ids).logits[0].float()
    scale = temperature if temperature > 0 else 1.0
    logp = torch.log_softmax(logits / scale, dim=-1)
    start = len(prompt_ids) - 1
    return [float(logp[start + i, token]) for i, token in enumerate(completion)]


def assert_logprobs_exact(policy: Policy, result: GenerationResult, temperature: float) -> None:
    for prompt_ids, group in zip(result.prompt_ids, result.completions, strict=True):
        for completion in group:
            expected = full_forward_logprobs(policy, prompt_ids, completion.token_ids, temperature)
            assert completion.logprobs == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize(
    ("prompts", "params"),
    [
        (PROMPTS, SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=12)),
        (PROMPTS, SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=12)),
        (PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=12)),
        (LONG_PROMPTS, SamplingParams(temperature=1.3, top_p=0.95, max_new_tokens=10)),
    ],
    ids=["t1", "t0.7-top-p", "greedy", "long-prompts-grouped-cache"],
)
def test_logprobs_equal_a_full_forward_pass_on_the_same_tokens(
    tiny: Policy, prompts: list[str], params: SamplingParams
) -> None:
    result = TorchEngine(tiny).generate(prompts, 4, params, torch.Generator().manual_seed(0))
    assert_logprobs_exact(tiny, result, params.temperature)


def test_the_grouped_and_expanded_caches_give_the_same_samples(tiny: Policy) -> None:
    params = SamplingParams(temperature=1.0, max_new_tokens=10)
    expanded, grouped = TorchEngine(tiny), TorchEngine(tiny)
    expanded.grouped_min_prompt = 10_000
    grouped.grouped_min_prompt = 1
    a = expanded.generate(PROMPTS + LONG_PROMPTS, 3, params, torch.Generator().manual_seed(5))
    b = grouped.generate(PROMPTS + LONG_PROMPTS, 3, params, torch.Generator().manual_seed(5))
    for group_a, group_b in zip(a.completions, b.completions, strict=True):
        for x, y in zip(group_a, group_b, strict=True):
            assert x.token_ids == y.token_ids
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)


def test_each_sequence_stops_at_its_own_eos(tiny: Policy) -> None:
    params = SamplingParams(temperature=1.0, max_new_tokens=16)
    result = TorchEngine(tiny).generate(PROMPTS, 8, params, torch.Generator().manual_seed(1))
    eos = tiny.eos_token_id
    completions = [c for group in result.completions for c in group]
    finished = [c for c in completions if c.finished]
    open_ended = [c for c in completions if not c.finished]
    assert finished and open_ended, "this seed must produce both kinds of rows"
    for c in completions:
        assert len(c.token_ids) == len(c.logprobs)
        assert c.token_ids.count(eos) == (1 if c.finished else 0)
        if c.finished:
            assert c.token_ids[-1] == eos  # EOS included, nothing after it
        else:
            assert len(c.token_ids) == params.max_new_tokens
        assert c.text == tiny.decode_completion(c.token_ids)
    assert min(len(c.token_ids) for c in finished) < params.max_new_tokens
    assert result.tokens_generated == sum(len(c.token_ids) for c in completions)


def _eos_biased(seed: int, eos_logit: float) -> Policy:
    """A tiny model whose head adds ``eos_logit`` to EOS (an untied head with a bias)."""
    policy = build_tiny_policy(seed)
    old = policy.model.lm_head
    head = torch.nn.Linear(old.in_features, old.out_features, bias=True)
    with torch.no_grad():
        head.weight.copy_(old.weight)
        head.bias.zero_()
        head.bias[policy.eos_token_id] = eos_logit
    policy.model.lm_head = head
    return policy


def test_generation_ends_once_every_row_has_finished() -> None:
    policy = _eos_biased(0, 50.0)
    result = TorchEngine(policy).generate(PROMPTS, 3, SamplingParams(temperature=1.0, max_new_tokens=16))
    assert all(
        c.token_ids == [policy.eos_token_id] and c.finished and c.text == ""
        for g in result.completions
        for c in g
    )
    assert result.tokens_generated == len(PROMPTS) * 3


def test_rows_finishing_at_different_steps_keep_exact_logprobs() -> None:
    policy = _eos_biased(1, 2.5)  # EOS roughly one time in three: rows end at many different steps
    result = TorchEngine(policy).generate(
        PROMPTS, 8, SamplingParams(max_new_tokens=10), torch.Generator().manual_seed(3)
    )
    lengths = {len(c.token_ids) for g in result.completions for c in g}
    assert len(lengths) >= 4
    assert_logprobs_exact(policy, result, 1.0)


def test_same_generator_seed_gives_the_same_output_and_another_seed_differs(tiny: Policy) -> None:
    engine = TorchEngine(tiny)
    params = SamplingParams(temperature=1.0, top_p=0.9)
    a = engine.generate(PROMPTS, 4, params, torch.Generator().manual_seed(42))
    b = engine.generate(PROMPTS, 4, params, torch.Generator().manual_seed(42))
    c = engine.generate(PROMPTS, 4, params, torch.Generator().manual_seed(43))
    tokens = lambda r: [[x.token_ids for x in g] for g in r.completions]  # noqa: E731
    assert tokens(a) == tokens(b)
    assert tokens(a) != tokens(c)


def test_greedy_follows_the_argmax_of_a_full_forward_pass(sharp: Policy) -> None:
    result = TorchEngine(sharp).generate(PROMPTS, 2, SamplingParams(temperature=0.0, max_new_tokens=10))
    for prompt_ids, group in zip(result.prompt_ids, result.completions, strict=True):
        assert group[0].token_ids == group[1].token_ids
        ids = list(prompt_ids)
        for token in group[0].token_ids:
            with torch.no_grad():
                expected = int(sharp.model(torch.tensor([ids])).logits[0, -1].argmax())
            assert token == expected
            ids.append(token)


def _first_token_frequencies(policy: Policy, prompt: str, params: SamplingParams, n: int) -> torch.Tensor:
    one_token = SamplingParams(params.temperature, params.top_p, max_new_tokens=1)
    result = TorchEngine(policy).generate([prompt], n, one_token, torch.Generator().manual_seed(7))
    counts = Counter(c.token_ids[0] for c in result.completions[0])
    vocab = len(policy.tokenizer)
    return torch.tensor([counts.get(i, 0) for i in range(vocab)], dtype=torch.float64) / n


def _exact_first_token(policy: Policy, prompt: str, temperature: float, top_p: float) -> torch.Tensor:
    from swarmnode.rollout.types import top_p_filter

    with torch.no_grad():
        logits = policy.model(torch.tensor([policy.encode_prompt(prompt)])).logits[0, -1:].float()
    return top_p_filter(logits / temperature, top_p).softmax(-1)[0].double()


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.5, 1.0), (2.0, 1.0), (1.0, 0.6)])
def test_sampled_first_tokens_follow_the_tempered_nucleus_distribution(
    temperature: float, top_p: float
) -> None:
    policy = peaked(build_tiny_policy(2), scale=2.0)
    params = SamplingParams(temperature=temperature, top_p=top_p)
    freq = _first_token_frequencies(policy, "58+26=", params, 4000)
    exact = _exact_first_token(policy, "58+26=", temperature, top_p)
    assert float((freq - exact).abs().sum() / 2) < 0.05  # total variation distance
    assert float(freq[exact == 0].sum()) == 0.0  # nothing outside the nucleus, ever


def test_lower_temperature_concentrates_samples(sharp: Policy) -> None:
    cold = _first_token_frequencies(sharp, "7+8=", SamplingParams(temperature=0.3), 2000)
    hot = _first_token_frequencies(sharp, "7+8=", SamplingParams(temperature=3.0), 2000)
    assert float(cold.max()) > float(hot.max())


def test_result_shape_and_policy_version(tiny: Policy) -> None:
    tiny.version = 9
    try:
        result = TorchEngine(tiny).generate(PROMPTS[:3], 5, SamplingParams(max_new_tokens=4))
    finally:
        tiny.version = 0
    assert result.policy_version == 9
    assert result.prompt_ids == [tiny.encode_prompt(p) for p in PROMPTS[:3]]
    assert [len(g) for g in result.completions] == [5, 5, 5]
    assert result.seconds > 0
    assert TorchEngine(tiny).generate([], 3, SamplingParams()).completions == []


def test_in_place_weight_updates_are_seen_by_the_next_call() -> None:
    policy = build_tiny_policy(4)
    engine = TorchEngine(policy)
    params = SamplingParams(temperature=1.0, max_new_tokens=6)
    engine.generate(PROMPTS, 2, params, torch.Generator().manual_seed(0))  # caches the weight layout
    optimizer = torch.optim.SGD(policy.model.parameters(), lr=0.5)
    loss = policy.model(torch.tensor([policy.encode_prompt("1+1=2")])).logits.square().mean()
    loss.backward()
    optimizer.step()
    result = engine.generate(PROMPTS, 2, params, torch.Generator().manual_seed(0))
    assert_logprobs_exact(policy, result, 1.0)


def test_update_weights_switches_the_policy_served() -> None:
    first, second = build_tiny_policy(5), build_tiny_policy(6)
    second.version = 3
    engine = TorchEngine(first)
    engine.update_weights(second)
    result = engine.generate(PROMPTS, 2, SamplingParams(), torch.Generator().manual_seed(0))
    assert result.policy_version == 3
    assert_logprobs_exact(second, result, 1.0)


def _tiny_of(model_type: str, **extra: object) -> Policy:
    tokenizer = build_char_tokenizer()
    config = AutoConfig.for_model(
        model_type,
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=128,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        **extra,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.eval()
    return peaked(Policy(model=model, tokenizer=tokenizer, model_id=model_type), scale=3.0)


@pytest.mark.parametrize(
    ("model_type", "extra"),
    [
        ("llama", {"num_key_value_heads": 2, "tie_word_embeddings": False}),
        ("llama", {"num_key_value_heads": 1, "attention_bias": True, "mlp_bias": True}),
        ("qwen2", {"num_key_value_heads": 2}),
        ("qwen3", {"num_key_value_heads": 2, "head_dim": 16}),
        ("mistral", {"num_key_value_heads": 2, "sliding_window": 4096}),
    ],
    ids=["llama-gqa-untied", "llama-mqa-biases", "qwen2-qkv-bias", "qwen3-qk-norm", "mistral"],
)
def test_other_llama_family_models_get_exact_logprobs(model_type: str, extra: dict[str, object]) -> None:
    policy = _tiny_of(model_type, **extra)
    engine = TorchEngine(policy)
    for prompts in (PROMPTS, LONG_PROMPTS):
        result = engine.generate(
            prompts, 3, SamplingParams(temperature=0.8, max_new_tokens=6), torch.Generator().manual_seed(1)
        )
        assert_logprobs_exact(policy, result, 0.8)


def test_a_bfloat16_model_runs_and_stays_close_to_its_full_forward_pass() -> None:
    policy = build_tiny_policy(0)
    policy.model.to(torch.bfloat16)
    for prompts in (PROMPTS, LONG_PROMPTS):
        result = TorchEngine(policy).generate(
            prompts, 2, SamplingParams(max_new_tokens=6), torch.Generator().manual_seed(0)
        )
        for prompt_ids, group in zip(result.prompt_ids, result.completions, strict=True):
            for completion in group:
                expected = full_forward_logprobs(policy, prompt_ids, completion.token_ids, 1.0)
                # bf16 rounds differently in a different op order: close, not exact.
                assert completion.logprobs == pytest.approx(expected, abs=0.05)


def test_an_unsupported_architecture_is_refused_with_a_pointer_to_hf() -> None:
    tokenizer = build_char_tokenizer()
    config = AutoConfig.for_model("gpt2", vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2)
    policy = Policy(model=AutoModelForCausalLM.from_config(config), tokenizer=tokenizer, model_id="gpt2")
    with pytest.raises(EngineUnavailable, match="'hf'"):
        TorchEngine(policy)
    assert make_engine("hf", policy).name == "hf"


def test_make_engine_knows_torch_hf_and_refuses_vllm_here_and_unknown_names(tiny: Policy) -> None:
    assert make_engine("torch", tiny).name == "torch"
    assert make_engine("hf", tiny).name == "hf"
    if not torch.cuda.is_available():
        with pytest.raises(EngineUnavailable, match="vllm"):
            make_engine("vllm", tiny)
    with pytest.raises(EngineUnavailable, match="unknown"):
        make_engine("sglang", tiny)


@pytest.mark.parametrize(
    "bad", [{"temperature": -1.0}, {"top_p": 0.0}, {"top_p": 1.5}, {"max_new_tokens": 0}]
)
def test_invalid_sampling_params_are_rejected(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        SamplingParams(**bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("grouped", [False, True], ids=["expanded-cache", "grouped-cache"])
def test_finished_rows_leaving_the_decode_batch_changes_no_sample(
    grouped: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # EOS about one time in three: rows (and, for the grouped cache, whole groups) finish at many
    # different steps, so the batch is compacted several times. Each row's uniforms are drawn with
    # the whole batch's, so its samples do not depend on which rows still run.
    policy = _eos_biased(1, 2.5)
    params = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=12)
    engine = TorchEngine(policy)
    engine.grouped_min_prompt = 1 if grouped else 10_000

    def run() -> GenerationResult:
        return engine.generate(PROMPTS + LONG_PROMPTS, 3, params, torch.Generator().manual_seed(7))

    compacted = run()
    compactions: list[int] = []
    original_compact = torch_engine._Runner._compact

    def counting_compact(self: torch_engine._Runner, rows: torch.Tensor, groups: torch.Tensor | None) -> None:
        compactions.append(int(rows.numel()))
        original_compact(self, rows, groups)

    monkeypatch.setattr(torch_engine._Runner, "_compact", counting_compact)
    assert [[c.token_ids for c in g] for g in run().completions] == [
        [c.token_ids for c in g] for g in compacted.completions
    ]
    assert len(compactions) >= 2, "this seed must compact the batch more than once"
    monkeypatch.setattr(torch_engine, "COMPACT_AT", 0.0)  # never compact: the batch stays whole
    whole = run()
    for group_a, group_b in zip(compacted.completions, whole.completions, strict=True):
        for x, y in zip(group_a, group_b, strict=True):
            assert x.token_ids == y.token_ids
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)
    assert_logprobs_exact(policy, compacted, 1.0)


@pytest.mark.parametrize("grouped", [False, True], ids=["expanded-cache", "grouped-cache"])
def test_decodes_past_several_attention_widths_stay_exact_whatever_the_fresh_cache_held(
    tiny: Policy, grouped: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Decode attends over a width that grows in steps of ATTENTION_WIDTH_STEP, and the cache is
    # allocated uninitialised: NaN in every fresh slot shows that no unwritten slot is ever read
    # unzeroed (NaN * 0 is NaN, so one such read would poison the log-probs).
    def nan_empty(*shape: int, **kwargs: object) -> torch.Tensor:
        size = shape[0] if len(shape) == 1 and not isinstance(shape[0], int) else shape
        return torch.full(size, float("nan"), **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(torch_engine.torch, "empty", nan_empty)
    engine = TorchEngine(tiny)
    engine.grouped_min_prompt = 1 if grouped else 10_000
    params = SamplingParams(temperature=1.0, max_new_tokens=40)  # widths 16, 32, 48 (+ prompt)
    result = engine.generate(PROMPTS + LONG_PROMPTS, 2, params, torch.Generator().manual_seed(2))
    longest = max(len(c.token_ids) for g in result.completions for c in g)
    assert longest > 2 * torch_engine.ATTENTION_WIDTH_STEP
    assert_logprobs_exact(tiny, result, params.temperature)
    # The engine keeps its cache memory for the next call (_CacheArena): what an earlier call left
    # there is never read either.
    regions = engine._arena._regions
    assert regions, "this call's caches should fit the arena"
    with torch.inference_mode():  # made inside generate's inference mode
        for region in regions:
            region.fill_(float("nan"))
    again = engine.generate(PROMPTS + LONG_PROMPTS, 2, params, torch.Generator().manual_seed(3))
    assert engine._arena._regions[0].data_ptr() == regions[0].data_ptr()  # the same memory, reused
    assert_logprobs_exact(tiny, again, params.temperature)
