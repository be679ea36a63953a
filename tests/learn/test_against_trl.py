"""Our losses and advantages against TRL's own code on identical inputs (TRL is a test-only extra).

How: a real ``trl.GRPOTrainer`` is built around a tiny random Llama (no download) and a char tokenizer made
in the test. TRL's ``_compute_loss(model, inputs)`` runs the model on our prompt/completion ids itself and
returns its loss; we compute the completion log-probs from the same model in plain torch and call our loss.
Both the loss values and the gradients w.r.t. every model parameter must agree. TRL's advantages come from
its real ``_generate_and_score_completions`` with a reward function that returns fixed rewards.

Variants TRL has: GRPO with ``loss_type`` "grpo" (seq-mean-token-mean), "dapo" and "bnpo" (token-mean),
"dr_grpo" (seq-mean-token-sum-norm, L = max_completion_length), with and without the k3 KL; and GSPO as
``importance_sampling_level="sequence"``. TRL has no HACPO, M2PO or SAPO.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from swarmnode.learn import dapo_loss, group_advantages, grpo_loss, gspo_loss

trl = pytest.importorskip("trl")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
datasets = pytest.importorskip("datasets")

# transformers 5 warns that GRPOConfig's gradient_checkpointing is renamed; not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

MAX_COMPLETION = 6
PROMPT_LEN = 4
BATCH = 4


def _tokenizer() -> Any:
    vocab = {
        "<pad>": 0,
        "<bos>": 1,
        "<eos>": 2,
        "<unk>": 3,
        **{c: i + 4 for i, c in enumerate("0123456789+=")},
    }
    core = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = tokenizers.pre_tokenizers.Split("", "isolated")
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )


@pytest.fixture(scope="module")
def model() -> Any:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=16,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=True,
    )
    return transformers.LlamaForCausalLM(config)


@pytest.fixture(scope="module")
def outdir() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as path:
        yield path


def _rewards_fn(rewards: list[float]) -> Callable[..., list[float]]:
    def reward(completions: list[Any], **_: Any) -> list[float]:
        return rewards[: len(completions)]

    return reward


@pytest.fixture(scope="module")
def make_trainer(model: Any, outdir: str) -> Callable[..., Any]:
    tokenizer = _tokenizer()
    dataset = datasets.Dataset.from_dict({"prompt": ["1+2=", "3+4="]})

    def make(*, beta: float = 0.0, rewards: list[float] | None = None, **config: Any) -> Any:
        config.setdefault("use_bias_correction_kl", False)
        args = trl.GRPOConfig(
            output_dir=outdir,
            per_device_train_batch_size=BATCH,
            num_generations=BATCH,
            max_completion_length=MAX_COMPLETION,
            use_cpu=True,
            report_to="none",
            save_strategy="no",
            beta=0.0,
            bf16=False,
            **config,  # TRL 1.16 defaults to bf16 autocast, even on CPU
        )
        trainer = trl.GRPOTrainer(
            model=model,
            reward_funcs=_rewards_fn(rewards or [0.0] * 8),
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
        )
        # Set after construction so TRL does not try to load a reference model by name; _compute_loss only
        # reads self.beta and inputs["ref_per_token_logps"].
        trainer.beta = beta
        trainer.current_gradient_accumulation_steps = 1  # set by TRL's training_step; one micro-batch here
        return trainer

    return make


def _inputs(lengths: list[int]) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    prompt_ids = torch.randint(4, 16, (BATCH, PROMPT_LEN), generator=gen)
    completion_ids = torch.randint(4, 16, (BATCH, MAX_COMPLETION), generator=gen)
    mask = torch.tensor([[1] * n + [0] * (MAX_COMPLETION - n) for n in lengths])
    completion_ids = torch.where(mask.bool(), completion_ids, 0)
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids,
        "completion_mask": mask,
    }


def _our_logp(model: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    logits = model(input_ids=input_ids, attention_mask=attention).logits[:, PROMPT_LEN - 1 : -1]
    return (
        torch.log_softmax(logits.float(), dim=-1)
        .gather(-1, inputs["completion_ids"].unsqueeze(-1))
        .squeeze(-1)
    )


def _grads(model: Any, loss: torch.Tensor) -> list[torch.Tensor]:
    params = [p for p in model.parameters() if p.requires_grad]
    return list(torch.autograd.grad(loss, params, allow_unused=True, materialize_grads=True))


def _compare(
    model: Any,
    trainer: Any,
    ours: Callable[
        [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor
    ],
    *,
    noise: list[float],
    beta: float = 0.0,
) -> None:
    inputs = _inputs([6, 3, 1, 5])
    mask = inputs["completion_mask"].float()
    with torch.no_grad():
        reference = _our_logp(model, inputs)
    gen = torch.Generator().manual_seed(2)
    scale = torch.tensor(noise).unsqueeze(1)
    old_logp = reference + torch.randn(reference.shape, generator=gen) * scale
    ref_logp = reference + torch.randn(reference.shape, generator=gen) * 0.3
    advantages = torch.tensor([1.3, -0.7, 0.4, -1.1])
    inputs = {
        **inputs,
        "advantages": advantages,
        "old_per_token_logps": old_logp,
        "num_items_in_batch": mask.sum(),
    }
    if beta:
        inputs["ref_per_token_logps"] = ref_logp

    trl_loss = trainer._compute_loss(model, inputs)
    our_loss = ours(_our_logp(model, inputs), old_logp, advantages, mask, ref_logp if beta else None)

    torch.testing.assert_close(our_loss, trl_loss, rtol=1e-5, atol=1e-6)
    for a, b in zip(_grads(model, our_loss), _grads(model, trl_loss), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


# Per-row noise on old log-probs: rows 0-1 near-on-policy, rows 2-3 far enough that clipping bites.
TOKEN_NOISE = [0.05, 0.1, 0.5, 0.5]


@pytest.mark.parametrize(("beta", "corrected"), [(0.0, False), (0.04, False), (0.04, True)])
def test_grpo_seq_mean_token_mean_matches_trl_grpo(
    model: Any, make_trainer: Callable[..., Any], beta: float, corrected: bool
) -> None:
    trainer = make_trainer(loss_type="grpo", epsilon=0.2, beta=beta, use_bias_correction_kl=corrected)
    _compare(
        model,
        trainer,
        lambda lp, old, a, m, ref: grpo_loss(
            lp, old, a, m, eps_low=0.2, eps_high=0.2, beta=beta, ref_logp=ref, kl_ratio_correction=corrected
        )[0],
        noise=TOKEN_NOISE,
        beta=beta,
    )


@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_dapo_matches_trl_dapo(model: Any, make_trainer: Callable[..., Any], beta: float) -> None:
    trainer = make_trainer(loss_type="dapo", epsilon=0.2, epsilon_high=0.28, beta=beta)
    _compare(
        model,
        trainer,
        lambda lp, old, a, m, ref: dapo_loss(lp, old, a, m, beta=beta, ref_logp=ref)[0],
        noise=TOKEN_NOISE,
        beta=beta,
    )


def test_token_mean_matches_trl_bnpo(model: Any, make_trainer: Callable[..., Any]) -> None:
    trainer = make_trainer(loss_type="bnpo", epsilon=0.2)
    _compare(
        model,
        trainer,
        lambda lp, old, a, m, ref: grpo_loss(lp, old, a, m, agg="token-mean")[0],
        noise=TOKEN_NOISE,
    )


def test_seq_mean_token_sum_norm_matches_trl_dr_grpo(model: Any, make_trainer: Callable[..., Any]) -> None:
    trainer = make_trainer(loss_type="dr_grpo", epsilon=0.2)
    _compare(
        model,
        trainer,
        lambda lp, old, a, m, ref: grpo_loss(
            lp, old, a, m, agg="seq-mean-token-sum-norm", norm_len=MAX_COMPLETION
        )[0],
        noise=TOKEN_NOISE,
    )


@pytest.mark.parametrize(
    ("eps", "noise"), [((3e-4, 4e-4), [1e-4, 2e-4, 0.01, 0.01]), ((0.2, 0.2), TOKEN_NOISE)]
)
@pytest.mark.parametrize(("beta", "corrected"), [(0.0, False), (0.04, False), (0.04, True)])
def test_gspo_matches_trl_sequence_level_importance_sampling(
    model: Any,
    make_trainer: Callable[..., Any],
    eps: tuple[float, float],
    noise: list[float],
    beta: float,
    corrected: bool,
) -> None:
    trainer = make_trainer(
        loss_type="grpo",
        importance_sampling_level="sequence",
        epsilon=eps[0],
        epsilon_high=eps[1],
        beta=beta,
        use_bias_correction_kl=corrected,
    )
    _compare(
        model,
        trainer,
        lambda lp, old, a, m, ref: gspo_loss(
            lp,
            old,
            a,
            m,
            eps_low=eps[0],
            eps_high=eps[1],
            beta=beta,
            ref_logp=ref,
            kl_ratio_correction=corrected,
        )[0],
        noise=noise,
        beta=beta,
    )


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_advantages_match_trl_generate_and_score(make_trainer: Callable[..., Any], scale: str) -> None:
    rewards = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.01, 1.0]  # two prompts x 4 completions
    trainer = make_trainer(loss_type="grpo", scale_rewards=scale, rewards=rewards)
    out = trainer._generate_and_score_completions([{"prompt": "1+2="}] * 4 + [{"prompt": "3+4="}] * 4)
    ours = group_advantages(torch.tensor(rewards).reshape(2, 4), eps=1e-4, scale=scale)  # type: ignore[arg-type]
    torch.testing.assert_close(ours.reshape(-1), out["advantages"])
