"""`swarmnode export`: a node's checkpointed policy becomes a Hugging Face directory that
`AutoModelForCausalLM` / `AutoTokenizer` load with the node's own log-probs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from swarmnode.cli import EXIT_ERROR, EXIT_OK, EXIT_USAGE, main
from swarmnode.home import NodeHome
from swarmnode.policy.model import build_tiny_policy
from swarmnode.store.checkpoint import CheckpointState, CheckpointStore

from .conftest import checkpoint_of

NO_WARM_START = ["--set", "model.warm_start=false", "--set", "tasks.heldout_size=4"]


def trained_state(seed: int, round_: int, overrides: dict[str, int] | None = None) -> CheckpointState:
    """What a node checkpoints after some rounds: weights moved away from the start, AdamW state."""
    torch.manual_seed(1000 + round_)
    policy = build_tiny_policy(seed, overrides)
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-3)
    ids = torch.tensor([[*policy.encode_prompt("58+26="), policy.eos_token_id]])
    for _ in range(3):
        optimizer.zero_grad()
        policy.model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
    return checkpoint_of(policy.model, optimizer, round_)


def logprobs(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(model(input_ids=torch.tensor([ids])).logits.float(), dim=-1)


def test_export_round_trips_the_newest_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = NodeHome(tmp_path / "node").ensure()
    store = CheckpointStore(home.checkpoints)
    store.save(trained_state(0, 4))
    newest = trained_state(0, 8)
    store.save(newest)
    out = tmp_path / "hf"

    assert main(["export", "--home", str(home.root), "--out", str(out), *NO_WARM_START]) == EXIT_OK
    assert "exported round 8 (policy version 8" in capsys.readouterr().out

    model = AutoModelForCausalLM.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    node = build_tiny_policy(0)
    untrained = logprobs(node.model.eval(), node.encode_prompt("7*8=56"))
    node.model.load_state_dict(newest.model_state)
    ids = tokenizer("7*8=56", add_special_tokens=False)["input_ids"]
    assert ids == node.encode_prompt("7*8=56")[-len(ids) :]  # same text, same tokens
    ours = logprobs(node.model, node.encode_prompt("7*8=56"))
    theirs = logprobs(model, node.encode_prompt("7*8=56"))
    assert torch.allclose(ours, theirs, atol=1e-6), (ours - theirs).abs().max()
    assert not torch.allclose(untrained, theirs, atol=1e-3)  # the checkpoint's weights, not the start's
    provenance = json.loads((out / "swarmnode_export.json").read_text())
    assert provenance["round"] == 8 and provenance["checkpoint"].endswith("-round-8")


def test_a_damaged_newest_checkpoint_is_named_and_the_previous_one_exported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = NodeHome(tmp_path / "node").ensure()
    store = CheckpointStore(home.checkpoints)
    store.save(trained_state(0, 4))
    damaged = store.save(trained_state(0, 8))
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])  # truncated

    args = ["export", "--home", str(home.root), "--out", str(tmp_path / "hf"), *NO_WARM_START]
    assert main(args) == EXIT_OK
    captured = capsys.readouterr()
    assert f"skipping {damaged.name}" in captured.err
    assert "exported round 4" in captured.out


def test_export_refuses_what_it_cannot_do_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = NodeHome(tmp_path / "node").ensure()
    out = tmp_path / "hf"
    args = ["export", "--home", str(home.root), "--out", str(out), *NO_WARM_START]

    assert main(args) == EXIT_ERROR  # nothing checkpointed yet
    assert "no checkpoint in" in capsys.readouterr().err

    CheckpointStore(home.checkpoints).save(trained_state(0, 2, {"num_hidden_layers": 1}))
    assert main(args) == EXIT_ERROR  # another architecture than the configured model
    assert "does not fit the configured model" in capsys.readouterr().err
    assert not out.exists()

    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(args) == EXIT_USAGE
    assert "exists and is not empty" in capsys.readouterr().err
    assert (out / "keep.txt").read_text() == "mine"

    inside = ["export", "--home", str(home.root), "--out", str(home.root / "hf"), *NO_WARM_START]
    assert main(inside) == EXIT_USAGE
    assert "inside the node's home" in capsys.readouterr().err

    assert main([*args, "--set", "node.role=worker"]) == EXIT_USAGE
    assert "export its learner's home" in capsys.readouterr().err


def lora_state(round_: int) -> CheckpointState:
    """A checkpoint of a node training rank-4 adapters (learn.lora_rank = 4) on the tiny model: its
    adapters moved away from the start (B non-zero), the base untouched."""
    from swarmnode.config import load_config
    from swarmnode.roles.common import train_setup

    policy = build_tiny_policy(0)
    train_setup(load_config(None, environ={}, overrides={"learn.lora_rank": 4}), policy)
    generator = torch.Generator().manual_seed(round_)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.1)
    optimizer = torch.optim.AdamW([p for p in policy.model.parameters() if p.requires_grad], lr=1e-3)
    return checkpoint_of(policy.model, optimizer, round_)


def test_a_lora_node_exports_the_merged_model_or_the_adapter_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from peft import PeftModel

    from swarmnode.config import load_config
    from swarmnode.roles.common import train_setup

    home = NodeHome(tmp_path / "node").ensure()
    state = lora_state(6)
    CheckpointStore(home.checkpoints).save(state)
    lora = ["--set", "learn.lora_rank=4", *NO_WARM_START]
    node = build_tiny_policy(0)
    train_setup(load_config(None, environ={}, overrides={"learn.lora_rank": 4}), node)
    node.model.load_state_dict(state.model_state)
    ids = node.encode_prompt("7*8=56")
    ours = logprobs(node.model.eval(), ids)
    base = build_tiny_policy(0).model.eval()
    assert not torch.allclose(logprobs(base, ids), ours, atol=1e-3)  # the adapters change the model

    merged_dir, adapter_dir = tmp_path / "merged", tmp_path / "adapter"
    assert main(["export", "--home", str(home.root), "--out", str(merged_dir), *lora]) == EXIT_OK
    merged = AutoModelForCausalLM.from_pretrained(merged_dir).eval()
    assert not any("lora" in name for name in merged.state_dict())
    assert torch.allclose(logprobs(merged, ids), ours, atol=1e-5)

    assert (
        main(["export", "--home", str(home.root), "--out", str(adapter_dir), "--adapter", *lora]) == EXIT_OK
    )
    assert "exported the LoRA adapter of round 6" in capsys.readouterr().out
    assert (adapter_dir / "adapter_config.json").is_file() and (
        adapter_dir / "adapter_model.safetensors"
    ).is_file()
    adapted = PeftModel.from_pretrained(base, adapter_dir).eval()
    assert torch.allclose(logprobs(adapted, ids), ours, atol=1e-5)
    assert AutoTokenizer.from_pretrained(adapter_dir)("7*8=56", add_special_tokens=False)["input_ids"]


def test_adapter_export_of_a_node_without_adapters_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = NodeHome(tmp_path / "node").ensure()
    CheckpointStore(home.checkpoints).save(trained_state(0, 2))
    code = main(
        ["export", "--home", str(home.root), "--out", str(tmp_path / "a"), "--adapter", *NO_WARM_START]
    )
    assert code == EXIT_USAGE
    assert "learn.lora_rank is 0" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()
