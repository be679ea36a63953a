"""The shared-prefix update is the unshared one: same log-probs, losses and gradients (fp32).

A group's G completions are packed behind one copy of their prompt (``shared_prefix_logprobs``);
each completion token must see exactly what it sees in its own row. Checked for every loss the
trainer runs, for the built-in tiny Llama and for small Qwen2 / Qwen3 models built from configs,
with groups of different prompt lengths and completions of different lengths (empty ones too)
in one batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM

from swarmnode.admit.recompute import recompute_request
from swarmnode.admit.spotcheck import SpotCheckRequest, TokenRef
from swarmnode.config import load_config
from swarmnode.learn import dapo_loss, grpo_loss, gspo_loss
from swarmnode.learn.hacpo import hacpo_loss
from swarmnode.learn.m2po import m2po_loss
from swarmnode.policy import build_tiny_policy
from swarmnode.rollout import make_engine
from swarmnode.store import CheckpointStore, Ledger
from swarmnode.tasks import default_mixture
from swarmnode.train import Trainer
from swarmnode.train import batch as batch_module
from swarmnode.train import split_attention as split_attention_module
from swarmnode.train.batch import completion_logprobs, shared_prefix_logprobs, supports_packed_attention

VOCAB = 23


def small_model(kind: str) -> nn.Module:
    if kind == "tiny-llama":
        return build_tiny_policy(0).model
    settings = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention, as the real Qwen models
        max_position_embeddings=128,
        tie_word_embeddings=True,
    )
    if kind == "qwen3":
        settings["head_dim"] = 16
    config = AutoConfig.for_model(kind, **settings)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def batch(seed: int = 1) -> tuple[list[list[int]], list[list[int]], list[int]]:
    """Three groups: prompt lengths 1 (BOS only), 9 and 4; group sizes 3, 4, 2; completions 0-7 long."""
    g = torch.Generator().manual_seed(seed)
    prompts: list[list[int]] = []
    completions: list[list[int]] = []
    sizes = []
    for length, size in [(1, 3), (9, 4), (4, 2)]:
        prompt = [1, *torch.randint(3, VOCAB, (length - 1,), generator=g).tolist()]
        for j in range(size):
            n = 0 if j == 1 else int(torch.randint(1, 8, (1,), generator=g))
            prompts.append(prompt)
            completions.append(torch.randint(3, VOCAB, (n,), generator=g).tolist())
        sizes.append(size)
    return prompts, completions, sizes


def inputs(logp: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Behaviour log-probs a little off the policy's (ratios near 1, inside every clip band and
    below M2PO's threshold, so each loss has gradient), advantages and HACPO's extras."""
    g = torch.Generator().manual_seed(7)
    rows = logp.shape[0]
    old = (logp.detach() + 0.02 * torch.randn(logp.shape, generator=g)) * mask
    return {
        "old": old,
        "advantages": torch.randn(rows, generator=g),
        "ratio": torch.rand(rows, generator=g) + 0.5,
        "is_self": torch.tensor([i % 2 == 0 for i in range(rows)]),
        "old_mean": old.sum(-1) / mask.sum(-1).clamp(min=1),
    }


Loss = Callable[[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]], torch.Tensor]

LOSSES: dict[str, Loss] = {
    "grpo": lambda lp, m, x: grpo_loss(lp, x["old"], x["advantages"], m)[0],
    "grpo-token-mean": lambda lp, m, x: grpo_loss(lp, x["old"], x["advantages"], m, agg="token-mean")[0],
    "dapo": lambda lp, m, x: dapo_loss(lp, x["old"], x["advantages"], m)[0],
    "gspo": lambda lp, m, x: gspo_loss(lp, x["old"], x["advantages"], m, eps_low=0.5, eps_high=0.5)[0],
    "m2po": lambda lp, m, x: m2po_loss(lp, x["old"], x["advantages"], m)[0],
    "hacpo": lambda lp, m, x: hacpo_loss(
        lp,
        m,
        x["old_mean"],
        x["advantages"],
        x["ratio"],
        x["is_self"],
        update_index=0,
        eps_low=0.5,
        eps_high=0.5,
    )[0],
    "grpo-kl": lambda lp, m, x: grpo_loss(lp, x["old"], x["advantages"], m, beta=0.1, ref_logp=x["old"])[0],
}


def gradients(model: nn.Module, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("kind", ["tiny-llama", "qwen2", "qwen3"])
def test_packed_log_probs_equal_one_row_per_completion(kind: str) -> None:
    model = small_model(kind)
    assert supports_packed_attention(model)
    prompts, completions, _ = batch()
    with torch.no_grad():
        for temperature in (1.0, 0.7):
            plain, plain_mask = completion_logprobs(model, prompts, completions, temperature)
            packed, packed_mask = shared_prefix_logprobs(model, prompts, completions, temperature)
            assert torch.equal(plain_mask, packed_mask)
            assert plain.shape == packed.shape
            torch.testing.assert_close(packed, plain, rtol=1e-5, atol=1e-5)
    assert float(plain_mask[1].sum()) == 0.0  # the empty completion scores nothing on either path


@pytest.mark.parametrize("kind", ["tiny-llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("loss_name", list(LOSSES))
def test_every_loss_and_every_gradient_is_the_same_on_the_packed_path(kind: str, loss_name: str) -> None:
    model = small_model(kind)
    model.train()
    prompts, completions, _ = batch()
    loss_of = LOSSES[loss_name]
    plain_lp, mask = completion_logprobs(model, prompts, completions)
    x = inputs(plain_lp, mask)
    plain_loss = loss_of(plain_lp, mask, x)
    plain_grads = gradients(model, plain_loss)
    packed_lp, packed_mask = completion_logprobs(model, prompts, completions, shared_prefix=True)
    packed_loss = loss_of(packed_lp, packed_mask, x)
    packed_grads = gradients(model, packed_loss)
    assert float(plain_loss.detach()) != 0.0  # something to compare
    torch.testing.assert_close(packed_loss, plain_loss, rtol=1e-5, atol=1e-6)
    assert plain_grads.keys() == packed_grads.keys() and plain_grads
    scale = max(float(g.abs().max()) for g in plain_grads.values())
    for name, grad in plain_grads.items():
        torch.testing.assert_close(packed_grads[name], grad, rtol=1e-4, atol=1e-5 * scale, msg=name)


def test_rows_are_packed_only_with_neighbours_that_share_their_prompt() -> None:
    # Equal prompts that are not adjacent are scored separately; order and values are kept.
    model = small_model("tiny-llama")
    prompts, completions, _ = batch()
    order = [0, 3, 1, 7, 4, 2, 8, 5, 6]  # groups interleaved
    shuffled_prompts = [prompts[i] for i in order]
    shuffled_completions = [completions[i] for i in order]
    with torch.no_grad():
        plain, _ = completion_logprobs(model, shuffled_prompts, shuffled_completions)
        packed, _ = shared_prefix_logprobs(model, shuffled_prompts, shuffled_completions)
    torch.testing.assert_close(packed, plain, rtol=1e-5, atol=1e-5)


def test_short_groups_share_one_forward_sequence_and_never_see_each_other() -> None:
    # The batch's three groups (7 to 23 tokens) are binned into one sequence, so every
    # exactness test above runs packs side by side in one sequence; a group's log-probs do not
    # move when its neighbour's tokens change.
    prompts, completions, _ = batch()
    packs = batch_module._packs(prompts, completions)
    assert len(packs) == 3 and batch_module._sequences(packs) == [[1, 2, 0]]  # longest first
    model = small_model("tiny-llama")
    changed = [c if i >= 3 else [(t % 20) + 3 for t in reversed(c)] for i, c in enumerate(completions)]
    with torch.no_grad():
        before, _ = shared_prefix_logprobs(model, prompts, completions)
        after, _ = shared_prefix_logprobs(model, prompts, changed)
    assert not torch.equal(before[:3], after[:3])
    torch.testing.assert_close(after[3:], before[3:], rtol=1e-6, atol=1e-6)


def test_packs_are_binned_first_fit_decreasing_within_the_sequence_length() -> None:
    cap = batch_module.SEQUENCE_TOKENS
    group = batch_module._Pack
    half = cap // 2
    packs = [
        group([1], [0], half - 4),
        group([2], [1], half + 6),
        group([3], [2], half - 4),
        group([4], [3], 10),
    ]
    # the longest (half + 6) takes the last one (10), not a half - 4 (its sum passes cap by 2)
    assert batch_module._sequences(packs) == [[1, 3], [0, 2]]
    # a pack longer than SEQUENCE_TOKENS is a sequence of its own: no shorter one joins it
    packs = [group([1], [0], 3 * cap), group([2], [1], 2 * cap), group([3], [2], cap), group([4], [3], 5)]
    assert batch_module._sequences(packs) == [[0], [1], [2], [3]]


def test_a_long_group_runs_in_a_forward_of_its_own_length_class_and_never_pads_the_short_ones() -> None:
    # Red team rt23 F3: one admitted 2,048-token group set every sequence's length, and 64 honest
    # short groups' update cost 2.8x. Now each length class runs in a forward of its own.
    cap = batch_module.SEQUENCE_TOKENS
    group = batch_module._Pack
    packs = [group([i], [i], 20 + i % 30) for i in range(64)]
    packs.insert(30, group([99], [64], 2048))
    packs.insert(10, group([98], [65], 3 * cap))
    packs.append(group([97], [66], 2 * cap + 1))
    forwards = batch_module._forwards(packs, [[5] * 8] * 67)  # one 8-token completion each
    lengths = [[sum(packs[k].length for k in seq) for seq in forward] for forward in forwards]
    assert len(forwards) == 3
    assert all(length <= cap for length in lengths[0]) and len(forwards[0]) < 64  # still binned
    assert lengths[1:] == [[3 * cap, 2 * cap + 1], [2048]]  # one class: the power of two above 3 * cap
    assert sorted(k for f in forwards for seq in f for k in seq) == list(range(len(packs)))


def test_a_long_completion_never_shares_a_forward_with_packs_of_short_ones() -> None:
    # Red team rt26: split attention pads every completion of a forward to the longest there, so
    # one admitted completion at the receiver's cap, in a pack of the honest packs' length, made
    # 64 honest groups' update 4-6x dearer. Packs are also classed by their longest completion.
    prompts: list[list[int]] = []
    completions: list[list[int]] = []
    for i in range(4):  # honest: 60-token prompt, 8 completions of 32 tokens (316-token packs)
        prompts += [[1, 2 + i, *([3] * 58)]] * 8
        completions += [[4] * 32] * 8
    prompts += [[1, 9, *([3] * 58)]] * 3  # hostile: 60 + 256 + 2 x 8 = 332 tokens, the same class
    completions += [[4] * 256, [4] * 8, [4] * 8]
    packs = batch_module._packs(prompts, completions)
    forwards = batch_module._forwards(packs, completions)
    assert [sorted(k for seq in forward for k in seq) for forward in forwards] == [[0, 1, 2, 3], [4]]


def test_a_long_prompt_never_shares_a_split_forward_with_packs_of_short_prompts() -> None:
    # Red team rt68 F1: split attention pads every prompt of a forward to the longest there, so
    # one admitted group with a 441-token prompt, its completions sized to the honest packs' class
    # (one of 64 tokens, seven empty), made 3 honest groups' update 1.9x dearer. Under split
    # attention, packs are classed by their longest prompt too.
    prompts: list[list[int]] = []
    completions: list[list[int]] = []
    for i in range(3):  # honest: 67-token prompts, 8 completions of 54 tokens (499-token packs)
        prompts += [[1, 2 + i, *([3] * 65)]] * 8
        completions += [[4] * 54] * 8
    prompts += [[1, 9, *([3] * 439)]] * 8  # hostile: 441 + 64 + 7 x 1 = 512 tokens, width 512
    completions += [[4] * 64, *[[2]] * 7]
    packs = batch_module._packs(prompts, completions)
    forwards = batch_module._forwards(packs, completions)
    assert [sorted(k for seq in forward for k in seq) for forward in forwards] == [[0, 1, 2], [3]]


def test_a_forward_gathers_outputs_at_real_tokens_only_never_at_the_longest_completions_width(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Red team rt24 F7: outputs were gathered as (rows, longest completion, hidden), so one admitted
    # group at the receiver's cap padded every honest row of the batch to its length.
    policy = build_tiny_policy(0)
    prompts = [[1, 2, 3]] * 4 + [[1, 5]] * 2
    completions = [[4] * 3, [4] * 2, [4] * 3, [], [6] * 40, [6]]
    seen: list[tuple[int, ...]] = []
    real = batch_module._packed_forward

    def spying(*args: Any, **kwargs: Any) -> tuple[list[int], torch.Tensor]:
        rows, values = real(*args, **kwargs)
        seen.append(tuple(values.shape[:-1]))
        return rows, values

    monkeypatch.setattr(batch_module, "_packed_forward", spying)
    logprobs, mask = batch_module.shared_prefix_logprobs(policy.model, prompts, completions)
    assert sum(shape[0] for shape in seen) == 49 and all(len(shape) == 1 for shape in seen)
    unshared, unshared_mask = batch_module.completion_logprobs(policy.model, prompts, completions)
    assert torch.equal(mask, unshared_mask)
    assert torch.allclose(logprobs, unshared, atol=1e-5)


def test_a_group_past_the_pack_limit_is_split_into_packs_that_each_repeat_the_prompt() -> None:
    prompt = list(range(10))
    group = [prompt] * 4
    assert batch_module.pack_rows(group, [[7] * 5] * 4, limit=20) == [[0, 1], [2, 3]]
    assert batch_module.pack_rows(group, [[7] * 30, [7], [7] * 9, [7]], limit=20) == [[0], [1, 2], [3]]
    # other prompts never share a pack, whatever room is left
    assert batch_module.pack_rows([prompt, [1, 2], [1, 2]], [[7]] * 3, limit=100) == [[0], [1, 2]]


def test_a_long_group_scores_the_same_split_as_in_one_row_each() -> None:
    # 16 + 3 x 700 tokens > MAX_PACK_TOKENS: two packs ([0, 1], [2]), the same log-probs.
    model = build_tiny_policy(0).model
    g = torch.Generator().manual_seed(3)
    prompt = [1, *torch.randint(3, VOCAB, (15,), generator=g).tolist()]
    completions = [torch.randint(3, VOCAB, (700,), generator=g).tolist() for _ in range(3)]
    prompts = [prompt] * 3
    assert batch_module.pack_rows(prompts, completions) == [[0, 1], [2]]
    with torch.no_grad():
        plain, _ = completion_logprobs(model, prompts, completions)
        packed, _ = shared_prefix_logprobs(model, prompts, completions)
    torch.testing.assert_close(packed, plain, rtol=1e-4, atol=1e-4)


def test_groups_scored_in_several_forwards_keep_their_rows_and_values() -> None:
    # A long group between short ones: two forwards, rows gathered back into batch order.
    model = build_tiny_policy(0).model
    g = torch.Generator().manual_seed(5)
    prompts, completions, _ = batch()
    long_prompt = [1, *torch.randint(3, VOCAB, (11,), generator=g).tolist()]
    long_rows = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (150, 0, 90)]
    prompts = prompts[:3] + [long_prompt] * 3 + prompts[3:]
    completions = completions[:3] + long_rows + completions[3:]
    packs = batch_module._packs(prompts, completions)
    assert len(batch_module._forwards(packs, completions)) == 2
    with torch.no_grad():
        plain, plain_mask = completion_logprobs(model, prompts, completions)
        packed, packed_mask = shared_prefix_logprobs(model, prompts, completions)
    assert torch.equal(plain_mask, packed_mask)
    torch.testing.assert_close(packed, plain, rtol=1e-5, atol=1e-5)


def long_groups(vocab: int) -> tuple[list[list[int]], list[list[int]]]:
    """Groups whose packs pass SPLIT_ATTENTION_TOKENS (an empty completion among them) beside short ones."""
    g = torch.Generator().manual_seed(11)
    prompts: list[list[int]] = []
    completions: list[list[int]] = []
    for length, sizes in ((30, [100, 0, 90, 80]), (7, [300, 3]), (50, [10, 20, 40, 50, 60, 90]), (5, [3, 5])):
        prompt = [1, *torch.randint(3, vocab, (length - 1,), generator=g).tolist()]
        for n in sizes:
            prompts.append(prompt)
            completions.append(torch.randint(3, vocab, (n,), generator=g).tolist())
    return prompts, completions


@pytest.mark.parametrize("kind", ["tiny-llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_long_packs_split_their_attention_and_keep_every_log_prob_and_gradient(
    kind: str, checkpointing: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A long pack's attention runs split (the prompt once; each completion over the prompt and
    # itself: split_attention), not over the whole pack. Exact on every architecture; with
    # gradient checkpointing the masked path stays (and stays exact).
    model = small_model(kind)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    prompts, completions = long_groups(int(model.config.vocab_size))
    calls: list[int] = []
    real = split_attention_module.split_attention

    def counting(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(split_attention_module, "split_attention", counting)
    weights = torch.randn(len(prompts), 300, generator=torch.Generator().manual_seed(2))
    plain, mask = completion_logprobs(model, prompts, completions)
    plain_grads = gradients(model, (plain * weights[:, : plain.shape[1]] * mask).sum())
    packed, packed_mask = shared_prefix_logprobs(model, prompts, completions)
    # checkpointed layers are recomputed after the forward, on the masked path: they keep it
    assert bool(calls) == (not checkpointing)
    packed_grads = gradients(model, (packed * weights[:, : packed.shape[1]] * packed_mask).sum())
    assert torch.equal(mask, packed_mask)
    torch.testing.assert_close(packed.detach(), plain.detach(), rtol=1e-5, atol=1e-5)
    scale = max(float(g.abs().max()) for g in plain_grads.values())
    for name, grad in plain_grads.items():
        torch.testing.assert_close(packed_grads[name], grad, rtol=1e-4, atol=1e-5 * scale, msg=name)


class _NoConfig(nn.Module):
    """A causal LM seen without its config: nothing says its attention takes a custom mask."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, **kwargs: torch.Tensor) -> object:
        return self.inner(**kwargs)


def count_packed_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the calls ``completion_logprobs`` makes to the packed path."""
    calls: list[int] = []
    packed = batch_module.shared_prefix_logprobs

    def counting(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        calls.append(1)
        return packed(*args, **kwargs)

    monkeypatch.setattr(batch_module, "shared_prefix_logprobs", counting)
    return calls


def test_a_model_without_custom_masks_takes_the_unshared_path(monkeypatch: pytest.MonkeyPatch) -> None:
    model = small_model("tiny-llama")
    model.config._attn_implementation = "flash_attention_2"  # takes no custom 4D mask
    assert not supports_packed_attention(model)
    model.config._attn_implementation = "sdpa"
    assert supports_packed_attention(model)
    calls = count_packed_calls(monkeypatch)
    prompts, completions, _ = batch()
    with torch.no_grad():
        fallback, _ = completion_logprobs(_NoConfig(model), prompts, completions, shared_prefix=True)
        plain, _ = completion_logprobs(model, prompts, completions)
    assert calls == [] and torch.equal(fallback, plain)


@pytest.mark.parametrize("shared", [True, False])
def test_the_trainer_scores_on_the_path_its_switch_names(
    shared: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = load_config(
        None,
        environ={},
        overrides={
            "learn.shared_prefix": shared,
            "rollout.prompts_per_round": 2,
            "rollout.group_size": 4,
            "tasks.heldout_size": 0,
            "learn.drop_zero_advantage": False,
        },
    )
    policy = build_tiny_policy(0)
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        engine = make_engine("torch", policy)
        trainer = Trainer(config, policy, engine, default_mixture(0), ledger, CheckpointStore(tmp_path / "c"))
        groups, _, _ = trainer.generate_groups(1)
        calls = count_packed_calls(monkeypatch)
        # Rewards with signal: rows whose advantage is 0 are never run through the model.
        trainer.update([dataclasses.replace(g, rewards=[1.0, 0.0, 0.0, 0.0]) for g in groups])
        assert trainer.last_scored_rows == 8
    assert (len(calls) > 0) is shared


def test_the_spot_check_recomputation_is_unchanged_by_packing() -> None:
    model = small_model("qwen2")
    prompts, completions, _ = batch()
    prompt, rows = prompts[3], completions[3:7]
    tokens = tuple(TokenRef(completion=i, position=t) for i, row in enumerate(rows) for t in range(len(row)))
    request = SpotCheckRequest(peer="w", group="g", tokens=tokens)
    got = recompute_request(model, request, prompt, rows)
    with torch.no_grad():
        plain, _ = completion_logprobs(model, [prompt] * len(rows), [list(r) for r in rows])
    want = [float(plain[t.completion, t.position]) for t in tokens]
    assert got == pytest.approx(want, abs=1e-5)


def test_the_switch_defaults_to_the_shared_prefix() -> None:
    assert load_config(None, environ={}).learn.shared_prefix is True
    assert (
        load_config(None, environ={}, overrides={"learn.shared_prefix": False}).learn.shared_prefix is False
    )
