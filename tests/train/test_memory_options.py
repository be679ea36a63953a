"""The memory options of an update: LoRA (learn.lora_rank: only the adapters train, everything that
leaves the training loop sees the merged weights), gradient checkpointing, micro-batches
(learn.micro_batch_tokens) and the head's logits a chunk at a time. Each changes memory, not the
update."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from swarmnode.config import Config, load_config
from swarmnode.errors import ModelError
from swarmnode.policy import Policy, load_policy
from swarmnode.policy.lora import apply_lora, has_lora, merged_state_dict, plain_copy
from swarmnode.policy.model import save_policy
from swarmnode.roles.common import train_setup
from swarmnode.rollout import SamplingParams, make_engine
from swarmnode.store import CheckpointStore, Ledger
from swarmnode.tasks import default_mixture
from swarmnode.train import ScoredGroup, Trainer, batch, completion_logprobs


def config(**overrides: object) -> Config:
    base: dict[str, object] = {
        "rollout.prompts_per_round": 8,
        "rollout.group_size": 4,
        "tasks.heldout_size": 16,
        "learn.lr": 1e-3,
        "learn.lora_rank": 4,
    }
    base.update(overrides)
    return load_config(None, environ={}, overrides=base)


def lora_policy(model: Path, cfg: Config) -> Policy:
    policy = load_policy(model)
    train_setup(cfg, policy)
    return policy


def nudge_adapters(policy: Policy, seed: int = 0) -> None:
    """Give B a non-zero value (peft starts it at 0, where the adapter is the identity)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.05)


def sample(policy: Policy) -> tuple[list[list[int]], list[list[int]], list[list[float]]]:
    engine = make_engine("torch", policy)
    result = engine.generate(
        ["12+7=", "5-9=", "3*4="], 4, SamplingParams(max_new_tokens=6), torch.Generator().manual_seed(1)
    )
    prompts = [p for p, group in zip(result.prompt_ids, result.completions, strict=True) for _ in group]
    completions = [c.token_ids for group in result.completions for c in group]
    logprobs = [c.logprobs for group in result.completions for c in group]
    return prompts, completions, logprobs


def test_only_the_adapters_take_gradients(quick_model: Path) -> None:
    policy = lora_policy(quick_model, config())
    trainable = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    total = sum(p.numel() for p in policy.model.parameters())
    adapters = sum(p.numel() for p in policy.model.parameters() if p.requires_grad)
    assert 0 < adapters < total / 4


def test_the_engine_samples_from_the_adapted_model(quick_model: Path) -> None:
    policy = lora_policy(quick_model, config())
    nudge_adapters(policy)
    prompts, completions, engine_logprobs = sample(policy)
    with torch.no_grad():
        values, _ = completion_logprobs(policy.model, prompts, completions)
    for i, row in enumerate(engine_logprobs):
        assert values[i, : len(row)].tolist() == pytest.approx(row, abs=1e-4)
    # and not from the base alone: the adapters moved these log-probs
    base = load_policy(quick_model)
    with torch.no_grad():
        base_values, _ = completion_logprobs(base.model, prompts, completions)
    assert (base_values - values).abs().max() > 1e-3


def test_merged_weights_are_the_adapted_model_under_the_base_names(quick_model: Path) -> None:
    policy = lora_policy(quick_model, config())
    nudge_adapters(policy)
    base = load_policy(quick_model)
    merged = merged_state_dict(policy.model)
    assert set(merged) == set(base.model.state_dict())
    base.model.load_state_dict(merged, strict=True)  # what a worker does with a broadcast
    plain = plain_copy(policy.model)
    assert not has_lora(plain)
    prompts, completions, _ = sample(policy)
    with torch.no_grad():
        ours, _ = completion_logprobs(policy.model, prompts, completions)
        worker, _ = completion_logprobs(base.model, prompts, completions)
        copied, _ = completion_logprobs(plain, prompts, completions)
    assert torch.allclose(ours, worker, atol=1e-5)
    assert torch.allclose(ours, copied, atol=1e-5)


def test_a_training_round_changes_the_adapters_and_not_the_base(quick_model: Path, tmp_path: Path) -> None:
    cfg = config()
    policy = lora_policy(quick_model, cfg)
    trainer = Trainer(
        cfg,
        policy,
        make_engine("torch", policy),
        default_mixture(0),
        Ledger(tmp_path / "ledger.sqlite"),
        CheckpointStore(tmp_path / "ckpt"),
        eval_every=1000,
    )
    before = {k: v.detach().clone() for k, v in policy.model.state_dict().items()}
    learned = False
    for _ in range(6):  # until a round has a group with unequal rewards
        trainer.run_round()
        after = policy.model.state_dict()
        if any(not torch.equal(before[k], after[k]) for k in before if "lora_" in k):
            learned = True
            break
    assert learned, "six rounds without a single update: the test model cannot learn"
    for key, value in policy.model.state_dict().items():
        if "lora_" not in key:
            assert torch.equal(before[key], value), key
    assert len(trainer.optimizer.param_groups[0]["params"]) == sum(
        1 for p in policy.model.parameters() if p.requires_grad
    )


@pytest.mark.parametrize("lora_rank", [0, 4], ids=["full", "lora"])
def test_gradient_checkpointing_changes_memory_not_gradients(quick_model: Path, lora_rank: int) -> None:
    grads = []
    for checkpointing in (False, True):
        policy = lora_policy(
            quick_model,
            config(**{"learn.lora_rank": lora_rank, "learn.gradient_checkpointing": checkpointing}),
        )
        model: Any = policy.model
        assert model.is_activation_checkpointing == checkpointing
        if lora_rank:
            nudge_adapters(policy)
        prompts, completions, _ = sample(policy)
        policy.model.train()
        values, mask = completion_logprobs(policy.model, prompts, completions, shared_prefix=True)
        (values.sum() / mask.sum()).backward()
        grads.append({n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None})
    plain, checkpointed = grads
    assert plain and set(plain) == set(checkpointed)
    for name in plain:
        assert torch.allclose(plain[name], checkpointed[name], atol=1e-6), name


def test_an_unknown_target_module_names_the_ones_the_model_has(quick_model: Path) -> None:
    policy = load_policy(quick_model)
    with pytest.raises(ModelError, match=r"\['c_attn'\].*q_proj"):
        apply_lora(policy.model, 4, 8.0, ["q_proj", "c_attn"])


def test_a_saved_lora_policy_is_the_plain_merged_model(quick_model: Path, tmp_path: Path) -> None:
    policy = lora_policy(quick_model, config())
    nudge_adapters(policy)
    save_policy(policy, tmp_path / "out")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert not has_lora(loaded)
    prompts, completions, _ = sample(policy)
    with torch.no_grad():
        ours, _ = completion_logprobs(policy.model, prompts, completions)
        theirs, _ = completion_logprobs(loaded, prompts, completions)
    assert torch.allclose(ours, theirs, atol=1e-5)


@pytest.mark.parametrize("shared_prefix", [False, True], ids=["rows", "packed"])
def test_logprobs_a_chunk_of_rows_at_a_time_equal_one_pass(
    quick_model: Path, monkeypatch: pytest.MonkeyPatch, shared_prefix: bool
) -> None:
    """The head runs on LOGIT_CHUNK_ELEMENTS of logits at a time (checkpointed): same values and
    gradients as all rows at once."""
    policy = load_policy(quick_model)
    prompts, completions, _ = sample(policy)
    results = []
    for chunk_elements in (batch.LOGIT_CHUNK_ELEMENTS, 7 * policy.model.config.vocab_size):
        monkeypatch.setattr(batch, "LOGIT_CHUNK_ELEMENTS", chunk_elements)
        policy.model.zero_grad(set_to_none=True)
        values, mask = completion_logprobs(
            policy.model, prompts, completions, 0.7, shared_prefix=shared_prefix
        )
        (values.sum() / mask.sum()).backward()
        grads = {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}
        results.append((values.detach(), grads))
    (whole, whole_grads), (chunked, chunked_grads) = results
    assert whole.shape == chunked.shape and whole.shape[0] * whole.shape[1] > 7  # several chunks
    assert torch.allclose(whole, chunked, atol=1e-6)
    assert set(whole_grads) == set(chunked_grads)
    for name, grad in whole_grads.items():
        assert torch.allclose(grad, chunked_grads[name], atol=1e-6), name


def relabelled(group: ScoredGroup, rewards: list[float]) -> ScoredGroup:
    """``group``'s text as if a peer had sent it."""
    return dataclasses.replace(group, behaviour_logprobs=[], rewards=rewards, source="peer", policy_version=0)


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"learn.updates_per_round": 2, "learn.aggregation": "token-mean"},
        {"swarm.mixing": "hacpo"},
        {"swarm.mixing": "anchored", "learn.lora_rank": 4},
        {"learn.algorithm": "gspo", "learn.shared_prefix": False},
    ],
    ids=["grpo", "two-steps-token-mean", "hacpo", "anchored-lora", "gspo-unshared"],
)
def test_micro_batches_give_the_update_of_the_whole_batch(
    quick_model: Path, tmp_path: Path, settings: dict[str, object]
) -> None:
    """Same loss and same gradients at every optimizer step (Adam's first step divides each gradient
    by its own magnitude, so the weights after it would magnify float rounding)."""
    results = []
    for micro in (0, 40):  # 40 tokens: a pack or two of the tiny model's groups per micro-batch
        cfg = config(
            **{
                "learn.lora_rank": 0,
                "swarm.local_groups": 4,
                "swarm.external_groups": 4,
                **settings,
                "learn.micro_batch_tokens": micro,
            }
        )
        policy = lora_policy(quick_model, cfg)
        with Ledger(tmp_path / f"ledger-{micro}.sqlite") as ledger:
            trainer = Trainer(
                cfg,
                policy,
                make_engine("torch", policy),
                default_mixture(0),
                ledger,
                CheckpointStore(tmp_path / f"ckpt-{micro}"),
                eval_every=1000,
            )
            trainer.generator.manual_seed(5)
            own, _, _ = trainer.generate_groups(1)
            if micro:
                prompts = [g.prompt_ids for g in own for _ in range(g.size)]
                completions = [c for g in own for c in g.completion_ids]
                assert len(batch.micro_batches(prompts, completions, micro)) > 2
            external = [relabelled(g, [1.0, 0.0, 1.0, 0.0]) for g in own[:4]]
            grads: list[dict[str, torch.Tensor]] = []
            step = trainer.optimizer.step

            def recording_step(
                *args: Any, _step: Any = step, _grads: Any = grads, _model: Any = policy.model, **kwargs: Any
            ) -> Any:
                named = _model.named_parameters()
                _grads.append({n: p.grad.clone() for n, p in named if p.grad is not None})
                return _step(*args, **kwargs)

            trainer.optimizer.step = recording_step  # type: ignore[method-assign]
            metrics = trainer.train_round(own, external)
            assert metrics.groups_used > 0
            results.append((metrics.loss, grads))
    (whole_loss, whole), (micro_loss, micro_grads) = results
    assert micro_loss == pytest.approx(whole_loss, rel=1e-4, abs=1e-7)
    assert len(whole) == len(micro_grads) == int(settings.get("learn.updates_per_round", 1))  # type: ignore[call-overload]
    # The first step's gradients: later steps start from weights that Adam's first step (a gradient
    # divided by its own magnitude) has already set apart by more than float rounding.
    for whole_step, micro_step in zip(whole[:1], micro_grads[:1], strict=True):
        assert set(whole_step) == set(micro_step)
        assert any(float(g.abs().max()) > 0 for g in whole_step.values()), "no gradient: nothing compared"
        for name, grad in whole_step.items():  # float32 sums in another order: relative to the tensor's scale
            scale = float(grad.abs().max())
            assert float((grad - micro_step[name]).abs().max()) <= 1e-4 * scale + 1e-12, name
