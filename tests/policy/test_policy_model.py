"""Policy load/save in real HF format, and the built-in tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from swarmnode.errors import ModelError
from swarmnode.policy.model import (
    TINY_MODEL_ID,
    build_tiny_policy,
    load_policy,
    save_policy,
    tiny_config_dict,
)
from swarmnode.policy.tokenizer import build_char_tokenizer


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_tiny_config_is_the_contract_llama() -> None:
    config = tiny_config_dict()
    assert config["model_type"] == "llama"
    assert (config["hidden_size"], config["intermediate_size"]) == (128, 512)
    assert (config["num_hidden_layers"], config["num_attention_heads"]) == (4, 4)
    assert config["tie_word_embeddings"] is True
    assert config["max_position_embeddings"] == 64
    assert config["vocab_size"] == len(build_char_tokenizer())


def test_tiny_model_has_about_one_million_parameters_with_tied_embeddings() -> None:
    policy = build_tiny_policy(0)
    count = sum(p.numel() for p in policy.model.parameters())
    assert 900_000 < count < 1_200_000
    assert policy.model.lm_head.weight is policy.model.model.embed_tokens.weight
    assert policy.model_id == TINY_MODEL_ID


def test_tiny_policy_is_deterministic_in_seed_and_leaves_global_rng_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a = build_tiny_policy(7)
    assert torch.equal(torch.rand(3), expected)
    assert _same_weights(a.model, build_tiny_policy(7).model)
    assert not _same_weights(a.model, build_tiny_policy(8).model)


def test_encode_prompt_prepends_bos_and_decode_stops_at_first_eos() -> None:
    policy = build_tiny_policy(0)
    assert policy.encode_prompt("7+8=") == [1, 11, 14, 12, 18]
    assert policy.decode_completion([5, 9, 2, 6, 2]) == "15"
    assert policy.decode_completion([5, 0, 9]) == "15"  # specials skipped
    assert (policy.eos_token_id, policy.pad_token_id) == (2, 0)


def test_save_then_load_round_trips_weights_tokenizer_and_model_id(tmp_path: Path) -> None:
    policy = build_tiny_policy(3)
    target = tmp_path / "policy"
    save_policy(policy, target)
    names = {p.name for p in target.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    assert not list(tmp_path.glob(".policy.*")), "no temporary directory may be left behind"

    loaded = load_policy(target, version=5)
    assert loaded.version == 5
    assert loaded.model_id == TINY_MODEL_ID
    assert _same_weights(policy.model, loaded.model)
    assert loaded.model.lm_head.weight is loaded.model.model.embed_tokens.weight
    assert loaded.encode_prompt("58+26=") == policy.encode_prompt("58+26=")
    # The directory is plain HF format: AutoTokenizer alone reads it.
    assert AutoTokenizer.from_pretrained(target, local_files_only=True).eos_token_id == 2
    ids = torch.tensor([policy.encode_prompt("12+30=")])
    with torch.no_grad():
        assert torch.allclose(policy.model(ids).logits, loaded.model(ids).logits)


def test_loaded_dtype_is_honoured(tmp_path: Path) -> None:
    save_policy(build_tiny_policy(0), tmp_path / "m")
    assert load_policy(tmp_path / "m", dtype=torch.bfloat16).model.dtype == torch.bfloat16


def test_save_over_an_existing_directory_replaces_it(tmp_path: Path) -> None:
    target = tmp_path / "policy"
    save_policy(build_tiny_policy(1), target, extra_files={"old.txt": "old"})
    newer = build_tiny_policy(2)
    save_policy(newer, target)
    assert not (target / "old.txt").exists()
    assert _same_weights(load_policy(target).model, newer.model)
    assert [p.name for p in tmp_path.iterdir()] == ["policy"]


def test_loading_a_missing_directory_names_it(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="nowhere"):
        load_policy(tmp_path / "nowhere")


def test_loading_a_broken_directory_is_a_model_error_naming_it(tmp_path: Path) -> None:
    target = tmp_path / "broken"
    save_policy(build_tiny_policy(0), target)
    (target / "config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ModelError, match="broken"):
        load_policy(target)


def test_loading_a_directory_without_weights_is_a_model_error(tmp_path: Path) -> None:
    target = tmp_path / "noweights"
    save_policy(build_tiny_policy(0), target)
    (target / "model.safetensors").unlink()
    with pytest.raises(ModelError, match="noweights"):
        load_policy(target)


def test_model_id_falls_back_to_the_directory_name(tmp_path: Path) -> None:
    target = tmp_path / "my-model"
    save_policy(build_tiny_policy(0), target)
    config = json.loads((target / "config.json").read_text())
    del config["swarmnode_model_id"]
    (target / "config.json").write_text(json.dumps(config))
    assert load_policy(target).model_id == "my-model"
