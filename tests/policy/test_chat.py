"""Chat-format prompts: a model whose tokenizer has a chat template is asked in its own format.

Built here as a user's Qwen2-Instruct checkpoint would be (no download): a byte-level BPE tokenizer
trained with ``tokenizers`` on reasoning-gym text, a ChatML template, ``<|im_end|>`` as EOS, a
Qwen2-architecture model from its config, saved with ``save_pretrained`` and loaded back.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import reasoning_gym
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from swarmnode.config import DEFAULT_SYSTEM_PROMPT, load_config
from swarmnode.errors import ConfigError, ModelError
from swarmnode.home import NodeHome
from swarmnode.policy import (
    Policy,
    PromptFormat,
    build_chat_tokenizer,
    build_tiny_policy,
    load_policy,
    save_policy,
)
from swarmnode.policy.chat import IM_END, IM_START
from swarmnode.roles.common import build_mixture, build_policy
from swarmnode.rollout import SamplingParams, TorchEngine
from swarmnode.tasks.scoring import ANSWER_CLOSE, ANSWER_OPEN, extract_answer
from swarmnode.wire import system_prompt_id

QUESTION = "What is 3 + 4? Give the answer as a number."


@pytest.fixture(scope="module")
def chat_tokenizer() -> PreTrainedTokenizerFast:
    questions = [e["question"] for e in reasoning_gym.create_dataset("chain_sum", size=200, seed=0)]
    return build_chat_tokenizer([*questions, DEFAULT_SYSTEM_PROMPT, f"{ANSWER_OPEN}12{ANSWER_CLOSE}"], 400)


def chat_policy(tokenizer: PreTrainedTokenizerFast, **format_: object) -> Policy:
    config = AutoConfig.for_model(
        "qwen2",
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.eval()
    return Policy(model, tokenizer, "chat-test", prompt_format=PromptFormat(**format_))  # type: ignore[arg-type]


def test_the_chat_tokenizer_round_trips_any_text_and_survives_save_and_load(
    chat_tokenizer: PreTrainedTokenizerFast, tmp_path: Path
) -> None:
    chat_tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.chat_template == chat_tokenizer.chat_template
    assert (loaded.eos_token, loaded.eos_token_id) == (IM_END, 2)
    assert loaded.bos_token is None  # ChatML has no BOS: the template starts with <|im_start|>
    text = "Ünïcode ✓ 42\n\tnot in the corpus {}"
    ids = loaded(text, add_special_tokens=False)["input_ids"]
    assert loaded.decode(ids) == text  # byte-level: every byte has a token
    assert loaded(IM_START + IM_END, add_special_tokens=False)["input_ids"] == [1, 2]


def test_a_chat_prompt_is_the_system_turn_the_question_and_the_opened_assistant_turn(
    chat_tokenizer: PreTrainedTokenizerFast,
) -> None:
    policy = chat_policy(chat_tokenizer)
    assert policy.chat_prompts
    ids = policy.encode_prompt(QUESTION)
    assert chat_tokenizer.decode(ids) == (
        f"<|im_start|>system\n{DEFAULT_SYSTEM_PROMPT}<|im_end|>\n"
        f"<|im_start|>user\n{QUESTION}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert ids[0] == chat_tokenizer.convert_tokens_to_ids(IM_START)  # no BOS of ours in front
    assert extract_answer(f"It is 7. {ANSWER_OPEN}7{ANSWER_CLOSE}") == "7"  # what the default asks for
    assert ANSWER_OPEN in DEFAULT_SYSTEM_PROMPT and ANSWER_CLOSE in DEFAULT_SYSTEM_PROMPT


def test_no_system_prompt_means_no_system_turn_and_chat_off_means_the_bare_question(
    chat_tokenizer: PreTrainedTokenizerFast,
) -> None:
    bare = chat_policy(chat_tokenizer, system_prompt="")
    assert chat_tokenizer.decode(bare.encode_prompt(QUESTION)) == (
        f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n"
    )
    off = chat_policy(chat_tokenizer, chat_template=False)
    assert not off.chat_prompts
    assert off.encode_prompt(QUESTION) == chat_tokenizer(QUESTION, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{% for message in messages %}", "chat template of model 'chat-test' failed"),
        ("{{ raise_exception('System role not supported') }}", 'rollout.system_prompt = ""'),
    ],
    ids=["syntax-error", "refuses-a-system-turn"],
)
def test_a_template_that_fails_is_a_model_error_naming_the_model(
    chat_tokenizer: PreTrainedTokenizerFast, template: str, message: str
) -> None:
    policy = chat_policy(chat_tokenizer)
    saved = chat_tokenizer.chat_template
    chat_tokenizer.chat_template = template
    try:
        with pytest.raises(ModelError, match=re.escape(message)):
            policy.encode_prompt(QUESTION)
    finally:
        chat_tokenizer.chat_template = saved


def test_the_engine_samples_after_the_chat_prompt_and_im_end_ends_a_completion(
    chat_tokenizer: PreTrainedTokenizerFast,
) -> None:
    policy = chat_policy(chat_tokenizer)
    eos = policy.eos_token_id
    assert eos == chat_tokenizer.convert_tokens_to_ids(IM_END)
    result = TorchEngine(policy).generate(
        [QUESTION], 16, SamplingParams(temperature=1.0, max_new_tokens=6), torch.Generator().manual_seed(0)
    )
    assert result.prompt_ids == [policy.encode_prompt(QUESTION)]
    for completion in result.completions[0]:
        ids = completion.token_ids
        assert eos not in ids[:-1]  # sampling stops at the first <|im_end|>
        assert completion.finished == (ids[-1] == eos)
    answer = chat_tokenizer(f"{ANSWER_OPEN}7{ANSWER_CLOSE}", add_special_tokens=False)["input_ids"]
    tail = chat_tokenizer(" and more", add_special_tokens=False)["input_ids"]
    assert policy.decode_completion([*answer, eos, *tail]) == f"{ANSWER_OPEN}7{ANSWER_CLOSE}"


def test_the_node_renders_prompts_with_the_configured_system_prompt(
    chat_tokenizer: PreTrainedTokenizerFast, tmp_path: Path
) -> None:
    model_dir = tmp_path / "model"
    save_policy(chat_policy(chat_tokenizer), model_dir)
    config = load_config(
        None,
        environ={},
        overrides={
            "model.path": str(model_dir),
            "rollout.system_prompt": "Answer in <answer></answer>.",
            "tasks.heldout_size": 0,
        },
    )
    policy = build_policy(config, NodeHome(tmp_path / "home"), build_mixture(config))
    assert load_policy(model_dir).chat_prompts
    assert "<|im_start|>system\nAnswer in <answer></answer>.<|im_end|>" in chat_tokenizer.decode(
        policy.encode_prompt(QUESTION)
    )
    off = load_config(
        None, environ={}, overrides={"model.path": str(model_dir), "rollout.chat_template": False}
    )
    assert not build_policy(off, NodeHome(tmp_path / "home2"), build_mixture(off)).chat_prompts


def test_a_broken_template_fails_the_node_at_start_and_a_long_system_prompt_is_refused(
    chat_tokenizer: PreTrainedTokenizerFast, tmp_path: Path
) -> None:
    policy = chat_policy(chat_tokenizer)
    policy.tokenizer = build_chat_tokenizer(["1 + 2"], 300)
    policy.tokenizer.chat_template = "{% if %}"
    model_dir = tmp_path / "model"
    save_policy(policy, model_dir)
    config = load_config(None, environ={}, overrides={"model.path": str(model_dir)})
    with pytest.raises(ModelError, match="chat template of model"):
        build_policy(config, NodeHome(tmp_path / "home"), build_mixture(config))
    with pytest.raises(ConfigError, match=r"rollout\.system_prompt"):
        load_config(None, environ={}, overrides={"rollout.system_prompt": "x" * 4097})


def test_a_policys_groups_name_its_system_turn_and_a_bare_policys_name_none(
    chat_tokenizer: PreTrainedTokenizerFast,
) -> None:
    assert chat_policy(chat_tokenizer).system_prompt_sha256 == system_prompt_id(DEFAULT_SYSTEM_PROMPT)
    assert chat_policy(chat_tokenizer, system_prompt="").system_prompt_sha256 == system_prompt_id("")
    assert system_prompt_id("") != b""  # no system turn is still a chat prompt
    assert chat_policy(chat_tokenizer, chat_template=False).system_prompt_sha256 == b""
    assert build_tiny_policy(0).system_prompt_sha256 == b""  # the tiny model has no template


def test_rendered_prompts_are_kept_within_a_bound(
    chat_tokenizer: PreTrainedTokenizerFast, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("swarmnode.policy.model.PROMPT_CACHE", 3)
    policy = chat_policy(chat_tokenizer)
    first = policy.encode_prompt("q0")
    for i in range(1, 6):
        policy.encode_prompt(f"q{i}")
    assert len(policy._prompt_ids) == 3
    assert policy.encode_prompt("q0") == first  # evicted, rendered again: the same ids
    first.append(0)  # a caller's list is its own
    assert policy.encode_prompt("q0") != first


#: The date logic of Llama 3.2's template (strftime_now unless date_string is given), in ChatML.
CLOCK_TEMPLATE = (
    "{%- if not date_string is defined %}{%- set date_string = strftime_now('%d %b %Y') %}{%- endif %}"
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['role'] == 'system' %}{{- 'Today Date: ' + date_string + '\\n' }}{%- endif %}"
    "{{- message['content'] + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_a_template_that_reads_the_date_renders_the_pinned_date_and_one_that_reads_the_time_is_refused(
    chat_tokenizer: PreTrainedTokenizerFast,
) -> None:
    from swarmnode.policy.chat import PINNED_DATE_STRING, _clock_at, check_chat_template

    saved = chat_tokenizer.chat_template
    try:
        chat_tokenizer.chat_template = CLOCK_TEMPLATE
        check_chat_template(chat_tokenizer, DEFAULT_SYSTEM_PROMPT, model_id="llama-like")
        import datetime

        with _clock_at(datetime.datetime(2026, 12, 4, 23, 59)):
            a = chat_policy(chat_tokenizer).encode_prompt(QUESTION)
        with _clock_at(datetime.datetime(2026, 12, 5, 0, 1)):
            b = chat_policy(chat_tokenizer).encode_prompt(QUESTION)
        assert a == b and PINNED_DATE_STRING in chat_tokenizer.decode(a)
        chat_tokenizer.chat_template = "{{ strftime_now('%H:%M:%S') }}" + saved
        with pytest.raises(ModelError, match="renders the clock"):
            check_chat_template(chat_tokenizer, DEFAULT_SYSTEM_PROMPT, model_id="clock")
    finally:
        chat_tokenizer.chat_template = saved


@pytest.mark.parametrize(
    "template",
    [
        "{{ 1 / 0 }}",
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        "{% for i in range(10**9) %}{% endfor %}",
    ],
    ids=["zero-division", "recursion", "range-too-big"],
)
def test_any_template_failure_is_a_model_error_naming_the_model(
    chat_tokenizer: PreTrainedTokenizerFast, template: str
) -> None:
    policy = chat_policy(chat_tokenizer)
    saved = chat_tokenizer.chat_template
    chat_tokenizer.chat_template = template
    try:
        with pytest.raises(ModelError, match="chat template of model 'chat-test' failed"):
            policy.encode_prompt(QUESTION)
    finally:
        chat_tokenizer.chat_template = saved


def test_the_render_cache_evicts_the_least_recently_used_prompt(
    chat_tokenizer: PreTrainedTokenizerFast, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("swarmnode.policy.model.PROMPT_CACHE", 3)
    policy = chat_policy(chat_tokenizer)
    policy.encode_prompt("hot")
    for i in range(10):
        policy.encode_prompt(f"cold {i}")
        policy.encode_prompt("hot")
    assert any(key[2] == "hot" for key in policy._prompt_ids)
