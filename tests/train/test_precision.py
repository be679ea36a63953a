"""``learn.precision``: a bf16 update is the fp32 update up to bfloat16 rounding, on float32 weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from swarmnode.errors import ConfigError
from swarmnode.store import Ledger
from swarmnode.train import completion_logprobs
from swarmnode.train import precision as precision_module
from swarmnode.train.precision import bf16_supported, update_precision
from tests.train.test_trainer import config, make_trainer, weights

needs_bf16 = pytest.mark.skipif(
    not bf16_supported(torch.device("cpu")), reason="this CPU has no bfloat16 arithmetic"
)


@needs_bf16
def test_a_bf16_update_moves_float32_weights_as_the_fp32_update_does(
    quick_model: Path, tmp_path: Path
) -> None:
    deltas: dict[str, torch.Tensor] = {}
    logprobs: dict[str, torch.Tensor] = {}
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        groups = None
        for precision in ("fp32", "bf16"):
            trainer = make_trainer(
                quick_model, tmp_path / precision, config(**{"learn.precision": precision}), ledger
            )
            if groups is None:  # both update on the same groups
                groups, _, _ = trainer.generate_groups(1)
            prompts = [g.prompt_ids for g in groups for _ in range(g.size)]
            completions = [c for g in groups for c in g.completion_ids]
            with torch.no_grad(), update_precision(precision, torch.device("cpu")):
                logprobs[precision], mask = completion_logprobs(
                    trainer.policy.model, prompts, completions, shared_prefix=True
                )
            before = weights(trainer)
            loss, used, _ = trainer.update(groups)
            assert used > 0 and loss == loss  # groups with signal, a finite loss
            after = trainer.policy.model.state_dict()
            assert all(v.dtype == torch.float32 for v in after.values())  # weights stay float32
            deltas[precision] = torch.cat([(after[k] - before[k]).flatten() for k in before])
    assert logprobs["bf16"].dtype == torch.float32
    difference = (logprobs["bf16"] - logprobs["fp32"]).abs() * mask
    assert 0 < float(difference.max()) < 0.05  # bf16 arithmetic ran, and rounded only
    assert float(difference.sum() / mask.sum()) < 0.01
    cosine = torch.nn.functional.cosine_similarity(deltas["bf16"], deltas["fp32"], dim=0)
    assert not torch.equal(deltas["bf16"], deltas["fp32"]) and float(cosine) > 0.9


def test_bf16_on_hardware_without_it_is_a_config_error_naming_the_key(
    quick_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(precision_module.torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    assert not bf16_supported(torch.device("cpu"))
    with Ledger(tmp_path / "ledger.sqlite") as ledger, pytest.raises(ConfigError, match=r"learn\.precision"):
        make_trainer(quick_model, tmp_path, config(**{"learn.precision": "bf16"}), ledger)
    with pytest.raises(ConfigError, match=r"learn\.precision"):
        config(**{"learn.precision": "fp16"})


@needs_bf16
@pytest.mark.parametrize("length", [40, 600], ids=["masked-pack", "split-pack"])
def test_a_bf16_update_on_cpu_runs_attention_in_float32_and_matmuls_in_bf16(
    quick_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, length: int
) -> None:
    # torch's bf16 attention backward on CPU is several times slower than float32's (a tiny-model
    # step: 419 of 1,023 ms): attention runs in float32 there, the projections stay bf16. Both
    # paths are covered: a short pack's masked attention and a long pack's split attention.
    # (dtype, autocast on) per attention call: autocast would cast a float32 query to bf16 inside
    # the call (q leaves RoPE in float32), so float32 attention means autocast off there.
    seen: list[tuple[torch.dtype, bool]] = []
    real_sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(query: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        seen.append((query.dtype, torch.is_autocast_enabled("cpu")))
        return real_sdpa(query, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)  # split_attention's F too
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        trainer = make_trainer(quick_model, tmp_path / "bf16", config(**{"learn.precision": "bf16"}), ledger)
        model = trainer.policy.model
        prompt = [1] + [5] * 7
        completions = [[6 + (i % 9)] * (length // 8) for i in range(8)]
        with update_precision("bf16", torch.device("cpu")):
            logits = model(input_ids=torch.tensor([prompt + completions[0]])).logits
            logprobs, _ = completion_logprobs(model, [prompt] * 8, completions, shared_prefix=True)
        logprobs.sum().backward()
    assert logits.dtype == torch.bfloat16  # the projections ran in bf16
    assert seen and set(seen) == {(torch.float32, False)}  # every attention call in float32
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
