"""The built-in chat model: a Qwen2 with a locally trained byte-level BPE tokenizer and ChatML,
run through the same code a Qwen2.5-Instruct checkpoint goes through."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from swarmnode.cli import EXIT_OK, main
from swarmnode.config import load_config, render_commented_config
from swarmnode.home import NodeHome
from swarmnode.policy import load_policy
from swarmnode.policy.chat import IM_END
from swarmnode.policy.chat_model import CHAT_MODEL_ID, PACKAGE_DIR, build_chat_policy, write_tokenizer
from swarmnode.policy.warmstart import INFO_FILE, WarmStartSettings, _batch, _shared_prefix_loss, warm_start
from swarmnode.roles.common import build_mixture, build_policy
from swarmnode.roles.solo import run_solo
from swarmnode.rollout import SamplingParams, TorchEngine
from swarmnode.tasks import default_mixture
from swarmnode.train.batch import completion_logprobs

PACKAGE = Path(__file__).resolve().parents[2] / "swarmnode" / "policy" / PACKAGE_DIR


def test_the_packaged_tokenizer_is_what_training_on_its_corpus_gives(tmp_path: Path) -> None:
    write_tokenizer(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (tmp_path / name).read_bytes() == (PACKAGE / name).read_bytes(), name


def test_the_chat_model_is_a_qwen2_asked_in_chatml_that_ends_at_im_end() -> None:
    policy = build_chat_policy(0)
    assert policy.model.config.model_type == "qwen2"
    assert policy.model_id == CHAT_MODEL_ID and policy.chat_prompts
    assert policy.tokenizer.convert_ids_to_tokens(policy.eos_token_id) == IM_END
    assert 0.9e6 < sum(p.numel() for p in policy.model.parameters()) < 1.2e6
    text = policy.tokenizer.decode(policy.encode_prompt("12 + 7 ="))
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    same = build_chat_policy(0).model.state_dict()
    assert all(torch.equal(v, same[k]) for k, v in policy.model.state_dict().items())  # seeded


def test_the_torch_engine_samples_the_chat_model_with_exact_logprobs() -> None:
    policy = build_chat_policy(1)
    prompts = ["12 + 7 =", "What is 3 * 4?"]
    result = TorchEngine(policy).generate(
        prompts, 3, SamplingParams(temperature=1.0, max_new_tokens=12), torch.Generator().manual_seed(0)
    )
    rows = [(p, c) for p, group in zip(result.prompt_ids, result.completions, strict=True) for c in group]
    with torch.no_grad():
        logp, _ = completion_logprobs(
            policy.model, [p for p, _ in rows], [c.token_ids for _, c in rows], 1.0, policy.pad_token_id
        )
    for i, (_, c) in enumerate(rows):
        assert c.logprobs == pytest.approx(logp[i, : len(c.token_ids)].tolist(), abs=1e-4)


def test_a_warm_start_of_the_chat_model_is_cached_and_loads_as_any_hf_checkpoint(tmp_path: Path) -> None:
    settings = WarmStartSettings(max_steps=4, eval_every=4, eval_tasks=4, heldout_tasks=4, batch_size=8)
    path = warm_start(tmp_path, default_mixture(0), 0, settings=settings, builtin="chat")
    assert path.name.startswith("chat-warm-")
    info = json.loads((path / INFO_FILE).read_text())
    assert info["settings"]["builtin"] == "chat" and info["steps"] == 4
    assert warm_start(tmp_path, default_mixture(0), 0, settings=settings, builtin="chat") == path  # cached
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    assert AutoTokenizer.from_pretrained(path, local_files_only=True).chat_template
    policy = load_policy(path)
    assert policy.model_id == CHAT_MODEL_ID and policy.chat_prompts
    assert model.config.model_type == "qwen2"


def test_the_node_runs_the_chat_model_with_its_own_completion_cap(tmp_path: Path) -> None:
    base = {"model.builtin": "chat", "model.warm_start": False, "tasks.heldout_size": 0}
    config = load_config(None, environ={}, overrides=base)
    policy = build_policy(config, NodeHome(tmp_path / "a"), build_mixture(config))
    assert policy.chat_prompts and config.rollout.max_new_tokens == 64  # unset: the model's default
    fixed = load_config(None, environ={}, overrides={**base, "rollout.max_new_tokens": 8})
    build_policy(fixed, NodeHome(tmp_path / "b"), build_mixture(fixed))
    assert fixed.rollout.max_new_tokens == 8  # set: kept
    tiny = load_config(None, environ={}, overrides={"model.warm_start": False, "tasks.heldout_size": 0})
    build_policy(tiny, NodeHome(tmp_path / "c"), build_mixture(tiny))
    assert tiny.rollout.max_new_tokens == 8
    solo = load_config(
        None,
        environ={},
        overrides={**base, "rollout.prompts_per_round": 2, "rollout.group_size": 2, "node.threads": 1},
    )
    home = NodeHome(tmp_path / "solo")
    result = run_solo(solo, home, max_rounds=2, out=io.StringIO(), install_signals=False)
    assert [m.round for m in result.rounds] == [1, 2]
    assert all(m.tokens_generated > 2 * 2 * 8 for m in result.rounds)  # past the tiny model's cap of 8


def test_the_chat_warm_start_runs_the_shared_system_turn_once_for_the_same_loss() -> None:
    """``_shared_prefix_loss`` is ``_batch``'s cross-entropy on the answer tokens, and so is its gradient."""
    policy = build_chat_policy(2)
    tasks = default_mixture(0).sample(0, 12, stream="test")
    losses, grads = [], []
    for shared in (False, True):
        policy.model.zero_grad(set_to_none=True)
        if shared:
            loss = _shared_prefix_loss(policy, tasks)
        else:
            input_ids, labels = _batch(policy, tasks)
            loss = policy.model(input_ids=input_ids, labels=labels).loss
        loss.backward()
        losses.append(float(loss.detach()))
        grads.append({n: p.grad.clone() for n, p in policy.model.named_parameters()})
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-4, atol=1e-6)


def test_a_config_file_that_init_wrote_leaves_the_completion_cap_to_the_model(tmp_path: Path) -> None:
    # `swarmnode init` wrote `max_new_tokens = 8` (the tiny model's) into every new home, so naming
    # the chat model later capped its answers at 8 tokens; it now writes the key commented out.
    home = NodeHome(tmp_path / "node")
    assert main(["init", "--home", str(home.root)]) == EXIT_OK
    assert "\n# max_new_tokens = 8\n" in home.config_file.read_text()
    config = load_config(
        home.config_file, environ={}, overrides={"model.builtin": "chat", "model.warm_start": False}
    )
    build_policy(config, home, build_mixture(config))
    assert config.rollout.max_new_tokens == 64
    chosen = load_config(None, environ={}, overrides={"rollout.max_new_tokens": 12})
    assert "\nmax_new_tokens = 12\n" in render_commented_config(chosen)  # set: written, and kept
