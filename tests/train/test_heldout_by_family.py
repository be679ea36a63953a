"""Held-out accuracy per task family: each family counts the same, and every evaluation is recorded."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from swarmnode.config import load_config
from swarmnode.errors import ConfigError
from swarmnode.policy import load_policy
from swarmnode.policy.evaluate import task_scores
from swarmnode.rollout import make_engine
from swarmnode.store import CheckpointStore, Ledger
from swarmnode.tasks import SPECIALIST_FAMILIES, DatasetSpec, TaskMixture, default_mixture, family_names
from swarmnode.train import Trainer
from swarmnode.train.trainer import heldout_sets

ADD, SUB, MUL, DEC = SPECIALIST_FAMILIES


def test_one_family_keeps_the_mixture_heldout_set_exactly() -> None:
    mixture = default_mixture(7)
    sets = heldout_sets(mixture, 40)
    assert list(sets) == ["chain_sum"]
    assert [t.id for t in sets["chain_sum"]] == [t.id for t in mixture.heldout(40)]


def test_several_families_split_the_size_evenly_rounded_up() -> None:
    mixture = TaskMixture([ADD, MUL, DEC], 3)
    sets = heldout_sets(mixture, 20)
    assert list(sets) == ["add", "mul", "dec"]
    assert [len(tasks) for tasks in sets.values()] == [math.ceil(20 / 3)] * 3
    for family, spec in mixture.families().items():
        assert {t.id.dataset for t in sets[family]} == {spec.name}
        assert {t.id.config for t in sets[family]} == {spec.task_id(0, 0).config}


def test_a_family_set_does_not_depend_on_the_other_families_or_weights() -> None:
    alone = TaskMixture([MUL], 5).heldout_by_family(10)["mul"]
    mixed = TaskMixture([ADD, DatasetSpec(MUL.name, MUL.config, 7.0, MUL.prompt_format, "mul")], 5)
    assert [t.id for t in mixed.heldout_by_family(10)["mul"]] == [t.id for t in alone]


def test_no_heldout_size_means_no_evaluation() -> None:
    assert heldout_sets(TaskMixture([ADD, MUL], 0), 0) == {}


def test_family_names_are_labels_else_generator_names() -> None:
    unlabelled_add = DatasetSpec(ADD.name, ADD.config, 1.0, "compact")
    unlabelled_sub = DatasetSpec(SUB.name, SUB.config, 1.0, "compact")
    assert list(family_names([ADD, MUL])) == ["add", "mul"]
    assert list(family_names([unlabelled_add, DatasetSpec("products", MUL.config)])) == [
        "basic_arithmetic",
        "products",
    ]
    assert list(family_names([unlabelled_add, unlabelled_sub])) == [
        "basic_arithmetic#0",
        "basic_arithmetic#1",
    ]


def _datasets(*entries: str) -> str:
    return "".join(f"[[tasks.datasets]]\n{e}\n" for e in entries)


def test_two_entries_with_one_family_name_are_a_config_error(tmp_path: Path) -> None:
    from swarmnode.roles.common import build_mixture

    path = tmp_path / "swarmnode.toml"
    path.write_text(
        _datasets(
            'name = "chain_sum"\nlabel = "x"',
            'name = "products"\nlabel = "x"',
        ),
        encoding="utf-8",
    )
    with pytest.raises(ConfigError, match=r"tasks.datasets: two datasets have the family name 'x'"):
        build_mixture(load_config(path, environ={}))


@pytest.mark.parametrize("label", ["has space", "a/b", "x" * 33, "é"])
def test_a_label_outside_its_alphabet_is_a_config_error(tmp_path: Path, label: str) -> None:
    path = tmp_path / "swarmnode.toml"
    path.write_text(_datasets(f'name = "chain_sum"\nlabel = "{label}"'), encoding="utf-8")
    with pytest.raises(ConfigError, match="label"):
        load_config(path, environ={})


def test_specialists_scenario_lists_the_specialist_families() -> None:
    import tomllib

    root = Path(__file__).resolve().parents[2]
    scenario = tomllib.loads((root / "simulations/scenarios/specialists.toml").read_text(encoding="utf-8"))
    entries = scenario["learning"]["datasets"]
    assert [(e["label"], e["name"], e["config"], e["prompt_format"]) for e in entries] == [
        (d.label, d.name, d.config, d.prompt_format) for d in SPECIALIST_FAMILIES
    ]


def test_trainer_reports_the_mean_of_family_accuracies_and_records_each(
    quick_model: Path, tmp_path: Path
) -> None:
    config = load_config(
        None,
        environ={},
        overrides={"rollout.prompts_per_round": 2, "rollout.group_size": 2, "tasks.heldout_size": 24},
    )
    policy = load_policy(quick_model)
    mixture = TaskMixture([ADD, MUL], 0)
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        trainer = Trainer(
            config,
            policy,
            make_engine("torch", policy),
            mixture,
            ledger,
            CheckpointStore(tmp_path / "ckpt"),
            eval_every=1,
        )
        by_hand = {
            family: sum(task_scores(policy, tasks, trainer.engine)) / len(tasks)
            for family, tasks in mixture.heldout_by_family(12).items()
        }
        assert trainer.evaluate() == pytest.approx((by_hand["add"] + by_hand["mul"]) / 2)
        assert trainer.heldout_by_family == pytest.approx(by_hand)
        metrics = trainer.run_round()
        assert set(metrics.heldout_by_family) == {"add", "mul"}
        assert metrics.heldout_accuracy == pytest.approx(sum(metrics.heldout_by_family.values()) / 2)
        (record,) = ledger.rounds()
    assert record.extra["heldout/add"] == pytest.approx(metrics.heldout_by_family["add"])
    assert record.extra["heldout/mul"] == pytest.approx(metrics.heldout_by_family["mul"])
    assert record.extra["heldout_accuracy"] == pytest.approx(metrics.heldout_accuracy)


def test_one_family_trainer_keeps_no_per_family_breakdown(quick_model: Path, tmp_path: Path) -> None:
    config = load_config(None, environ={}, overrides={"tasks.heldout_size": 16})
    policy = load_policy(quick_model)
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        trainer = Trainer(
            config,
            policy,
            make_engine("torch", policy),
            default_mixture(0),
            ledger,
            CheckpointStore(tmp_path / "c"),
        )
        value = trainer.evaluate()
    assert trainer.heldout_by_family == {}
    assert value == pytest.approx(
        sum(task_scores(policy, default_mixture(0).heldout(16), trainer.engine)) / 16
    )
