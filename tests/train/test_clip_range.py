"""learn.eps_low / learn.eps_high reach every loss that has a clip band (ALGORITHMS.md §1, §3).

GRPO and DAPO clip token ratios with the config's values. GSPO, and HACPO's own samples (GSPO), clip a
sequence ratio with a band about 1000x narrower: a key left at its token-level default means GSPO's
3e-4 / 4e-4, any other value is used as given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from swarmnode.config import Config, LearnConfig, load_config
from swarmnode.learn import gspo
from swarmnode.policy import load_policy
from swarmnode.rollout import make_engine
from swarmnode.store import CheckpointStore, Ledger
from swarmnode.tasks import default_mixture
from swarmnode.train import ScoredGroup, Trainer
from swarmnode.train import trainer as trainer_module
from swarmnode.train.trainer import clip_range


def learn(**values: float) -> LearnConfig:
    return load_config(None, environ={}, overrides={f"learn.{k}": v for k, v in values.items()}).learn


def test_token_losses_clip_with_the_configured_band() -> None:
    assert clip_range(learn(), sequence=False) == (0.2, 0.28)
    assert clip_range(learn(eps_low=0.1, eps_high=0.5), sequence=False) == (0.1, 0.5)


def test_sequence_losses_keep_gspos_band_when_the_keys_are_left_at_their_defaults() -> None:
    assert clip_range(learn(), sequence=True) == (gspo.EPS_LOW, gspo.EPS_HIGH) == (3e-4, 4e-4)


def test_sequence_losses_honour_keys_set_to_other_values() -> None:
    assert clip_range(learn(eps_low=1e-3, eps_high=2e-3), sequence=True) == (1e-3, 2e-3)
    assert clip_range(learn(eps_high=5e-4), sequence=True) == (3e-4, 5e-4)  # each key on its own


# ---------------------------------------------------------------- the trainer passes them on


def config(**overrides: object) -> Config:
    base: dict[str, object] = {
        "rollout.prompts_per_round": 4,
        "rollout.group_size": 4,
        "tasks.heldout_size": 0,
    }
    base.update(overrides)
    return load_config(None, environ={}, overrides=base)


def with_signal(group: ScoredGroup, **extra: Any) -> ScoredGroup:
    return ScoredGroup(
        task=group.task,
        prompt_ids=group.prompt_ids,
        completion_ids=group.completion_ids,
        behaviour_logprobs=extra.pop("behaviour_logprobs", group.behaviour_logprobs),
        texts=group.texts,
        rewards=[1.0, 0.0, 0.0, 0.0],
        policy_version=group.policy_version,
        **extra,
    )


def bands_used(
    monkeypatch: pytest.MonkeyPatch, quick_model: Path, tmp_path: Path, loss: str, cfg: Config, peers: bool
) -> list[tuple[float, float]]:
    """The (eps_low, eps_high) each call of ``loss`` in one update got."""
    seen: list[tuple[float, float]] = []
    real = getattr(trainer_module, loss)

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append((kwargs["eps_low"], kwargs["eps_high"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer_module, loss, spy)
    tmp_path.mkdir(exist_ok=True)
    policy = load_policy(quick_model)
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        trainer = Trainer(
            cfg,
            policy,
            make_engine("torch", policy),
            default_mixture(0),
            ledger,
            CheckpointStore(tmp_path / "c"),
        )
        own, _, _ = trainer.generate_groups(1)
        own = [with_signal(g) for g in own]
        external = (
            [
                with_signal(g, behaviour_logprobs=[], source="peer", source_mean_logprobs=[-0.5] * 4)
                for g in own
            ]
            if peers
            else []
        )
        torch.manual_seed(0)
        trainer.update(own, external)
    return seen


@pytest.mark.parametrize(
    ("algorithm", "loss", "band"),
    [("grpo", "grpo_loss", (0.1, 0.5)), ("dapo", "dapo_loss", (0.1, 0.5)), ("gspo", "gspo_loss", (0.1, 0.5))],
)
def test_the_trainer_hands_the_configured_band_to_the_loss(
    monkeypatch: pytest.MonkeyPatch, quick_model: Path, tmp_path: Path, algorithm: str, loss: str, band: Any
) -> None:
    cfg = config(**{"learn.algorithm": algorithm, "learn.eps_low": band[0], "learn.eps_high": band[1]})
    assert bands_used(monkeypatch, quick_model, tmp_path, loss, cfg, peers=False) == [band]


def test_gspo_in_a_default_config_keeps_its_own_band(
    monkeypatch: pytest.MonkeyPatch, quick_model: Path, tmp_path: Path
) -> None:
    cfg = config(**{"learn.algorithm": "gspo"})
    assert bands_used(monkeypatch, quick_model, tmp_path, "gspo_loss", cfg, peers=False) == [(3e-4, 4e-4)]


def test_hacpo_clips_own_samples_with_the_configured_band(
    monkeypatch: pytest.MonkeyPatch, quick_model: Path, tmp_path: Path
) -> None:
    default = config(**{"swarm.mixing": "hacpo"})
    assert bands_used(monkeypatch, quick_model, tmp_path / "a", "hacpo_loss", default, peers=True) == [
        (3e-4, 4e-4)
    ]
    chosen = config(**{"swarm.mixing": "hacpo", "learn.eps_low": 1e-3, "learn.eps_high": 2e-3})
    assert bands_used(monkeypatch, quick_model, tmp_path / "b", "hacpo_loss", chosen, peers=True) == [
        (1e-3, 2e-3)
    ]
