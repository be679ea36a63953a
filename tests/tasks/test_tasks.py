"""The task adapter: ids regenerate tasks exactly; scoring uses the regenerated entry only."""

from __future__ import annotations

import pytest

from swarmnode.errors import TaskError
from swarmnode.tasks import (
    DatasetSpec,
    TaskId,
    TaskMixture,
    default_mixture,
    extract_answer,
    regenerate,
    sapo_mixture,
    score_completion,
)
from swarmnode.tasks.ids import canonical_config
from swarmnode.tasks.mixture import SAPO_DATASETS

CHAIN = canonical_config({"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2})


def test_a_task_id_alone_regenerates_the_same_task() -> None:
    task_id = TaskId("chain_sum", CHAIN, 7, 12345, "compact")
    first = regenerate(task_id)
    regenerate.cache_clear()
    second = regenerate(task_id)
    assert first.prompt == second.prompt
    assert first.entry["answer"] == second.entry["answer"]


def test_compact_prompt_is_the_bare_expression() -> None:
    task = regenerate(TaskId("chain_sum", CHAIN, 1, 3, "compact"))
    assert task.prompt == "23-60="  # reasoning-gym chain_sum, seed 1, index 3: "23 - 60 ="
    assert task.entry["answer"] == "-37"


def test_question_prompt_is_the_generator_question_verbatim() -> None:
    task = regenerate(TaskId("chain_sum", CHAIN, 1, 3, "question"))
    assert task.prompt == "State the final answer to the following arithmetic problem: 23 - 60 ="


def test_different_seeds_give_different_streams() -> None:
    a = [regenerate(TaskId("chain_sum", CHAIN, 1, i, "compact")).prompt for i in range(20)]
    b = [regenerate(TaskId("chain_sum", CHAIN, 2, i, "compact")).prompt for i in range(20)]
    assert a != b


def test_score_uses_reasoning_gym_verifier_on_the_regenerated_entry() -> None:
    task = regenerate(TaskId("chain_sum", CHAIN, 1, 3, "compact"))
    assert score_completion(task, "-37") == 1.0
    assert score_completion(task, "-36") == 0.0
    assert score_completion(task, "") == 0.0


def test_answer_extraction_rule() -> None:
    assert extract_answer("84") == "84"
    assert extract_answer("  84  \n") == "84"
    assert extract_answer("0 1\n1 0") == "0 1\n1 0"  # multi-line answers (binary_matrix) stay whole
    assert extract_answer("I think <answer> 12 </answer> and <answer>13</answer>") == "12"
    assert extract_answer("") == ""


def test_hostile_completion_text_scores_zero_without_raising() -> None:
    task = regenerate(TaskId("chain_sum", CHAIN, 1, 3, "compact"))
    for text in ["\x00" * 1000, "<answer>" * 50, "9" * 5000, "-37" * 3, "\ud800"]:
        assert 0.0 <= score_completion(task, text) < 1.0


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"dataset": "", "config": "{}", "seed": 0, "index": 0}, "dataset name"),
        ({"dataset": "chain_sum", "config": "{}", "seed": 0, "index": -1}, ">= 0"),
        (
            {"dataset": "chain_sum", "config": "{}", "seed": 0, "index": 0, "prompt_format": "x"},
            "prompt_format",
        ),
        ({"dataset": "chain_sum", "config": "x" * 5000, "seed": 0, "index": 0}, "limit"),
    ],
)
def test_invalid_task_ids_are_refused_with_a_named_reason(kwargs: dict, fragment: str) -> None:
    with pytest.raises(TaskError, match=fragment):
        TaskId(**kwargs)


@pytest.mark.parametrize(
    "task_id, fragment",
    [
        (TaskId("no_such_generator", "{}", 0, 0), "no_such_generator"),
        (TaskId("chain_sum", "[1,2]", 0, 0), "JSON object"),
        (TaskId("chain_sum", '{"seed": 3}', 0, 0), "seed"),
        (TaskId("chain_sum", '{"min_terms": "many"}', 0, 0), "chain_sum"),
        (TaskId("bf", "{}", 0, 0, "compact"), "compact"),
    ],
)
def test_tasks_that_cannot_exist_raise_task_error(task_id: TaskId, fragment: str) -> None:
    with pytest.raises(TaskError, match=fragment):
        regenerate(task_id)


def test_mixture_sampling_is_deterministic_in_seed_and_round() -> None:
    m1, m2 = default_mixture(3), default_mixture(3)
    assert [t.id for t in m1.sample(5, 16)] == [t.id for t in m2.sample(5, 16)]
    assert [t.id for t in m1.sample(5, 16)] != [t.id for t in m1.sample(6, 16)]


def test_heldout_set_uses_a_different_seed_from_training() -> None:
    mixture = default_mixture(0)
    heldout_seeds = {t.id.seed for t in mixture.heldout(50)}
    train_seeds = {t.id.seed for t in mixture.sample(0, 50)}
    assert heldout_seeds.isdisjoint(train_seeds)


def test_weighted_mixture_follows_its_weights() -> None:
    specs = [
        DatasetSpec("chain_sum", {"min_terms": 2, "max_terms": 2}, 3.0, "compact"),
        DatasetSpec("basic_arithmetic", {}, 1.0),
    ]
    tasks = TaskMixture(specs, seed=0).sample(0, 2000)
    share = sum(t.id.dataset == "chain_sum" for t in tasks) / len(tasks)
    assert 0.70 < share < 0.80


def test_sapo_mixture_covers_its_nine_generators_and_each_verifies_its_own_answer() -> None:
    tasks = sapo_mixture(0).sample(0, 300)
    assert {t.id.dataset for t in tasks} == set(SAPO_DATASETS)
    for task in tasks:
        if isinstance(task.entry.get("answer"), str):
            assert score_completion(task, task.entry["answer"]) > 0.0, task.id


def test_mixture_refuses_empty_or_nonpositive_weights() -> None:
    with pytest.raises(TaskError):
        TaskMixture([])
    with pytest.raises(TaskError):
        TaskMixture([DatasetSpec("chain_sum", {}, 0.0)])


def test_regenerating_tasks_writes_nothing_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    """reasoning-gym's bf optimizer printed "." for every task: to the node's stdout, and before the
    verdict of `swarmnode protocol check`."""
    from swarmnode.tasks import TaskId, regenerate

    for index in range(3):
        regenerate(TaskId("bf", "{}", 11, index))
    assert capsys.readouterr().out == ""
