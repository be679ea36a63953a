"""Warm start: cached by settings, reproducible in seed, stops by evaluation; accuracy helper."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

import swarmnode.policy.warmstart as warmstart_module
from swarmnode.policy.evaluate import evaluate_accuracy, task_scores
from swarmnode.policy.model import Policy, build_tiny_policy, load_policy
from swarmnode.policy.warmstart import (
    WarmStartSettings,
    is_hard,
    read_warm_start_info,
    warm_start,
    warm_start_dir,
)
from swarmnode.rollout.types import Completion, GenerationResult, SamplingParams
from swarmnode.tasks import Task, default_mixture

#: A few steps on tiny batches: exercises the whole procedure in seconds.
QUICK = WarmStartSettings(
    batch_size=16, max_steps=4, eval_every=2, eval_tasks=16, heldout_tasks=16, target_accuracy=1.0
)


@pytest.fixture(scope="module")
def quick_home(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """One quick warm start shared by the tests below (home, progress messages)."""
    home = tmp_path_factory.mktemp("home")
    messages: list[str] = []
    warm_start(home, default_mixture(0), 0, messages.append, settings=QUICK)
    return home, messages


def test_warm_start_saves_a_loadable_model_with_its_record(quick_home: tuple[Path, list[str]]) -> None:
    home, messages = quick_home
    path = warm_start_dir(home, default_mixture(0), 0, QUICK)
    assert path.parent == home / "models"
    assert path.name.startswith("tiny-warm-")
    info = read_warm_start_info(path)
    assert info["steps"] == 4 and info["stopped_by"] == "max_steps"
    assert info["heldout"]["count"] == 16
    assert 0.0 <= info["heldout"]["greedy_accuracy"] <= 1.0
    assert any("step 2" in m for m in messages) and "saved to" in messages[-1]
    assert load_policy(path).model_id == "swarmnode-tiny"


def test_a_second_call_returns_the_cached_model_without_training(
    quick_home: tuple[Path, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    home, _ = quick_home

    def no_training(seed: int) -> Policy:
        raise AssertionError("a cached warm start must not train again")

    monkeypatch.setattr(warmstart_module, "build_tiny_policy", no_training)
    started = time.perf_counter()
    path = warm_start(home, default_mixture(0), 0, settings=QUICK)
    assert path == warm_start_dir(home, default_mixture(0), 0, QUICK)
    assert time.perf_counter() - started < 5.0  # generous: it only checks for a file


def test_same_seed_gives_identical_weights_and_other_settings_other_directories(
    quick_home: tuple[Path, list[str]], tmp_path: Path
) -> None:
    home, _ = quick_home
    a = warm_start_dir(home, default_mixture(0), 0, QUICK)
    b = warm_start(tmp_path, default_mixture(0), 0, settings=QUICK)
    state_a, state_b = load_policy(a).model.state_dict(), load_policy(b).model.state_dict()
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)
    assert a.name == b.name
    assert warm_start_dir(tmp_path, default_mixture(0), 1, QUICK).name != a.name
    assert warm_start_dir(tmp_path, default_mixture(1), 0, QUICK).name != a.name
    other = WarmStartSettings(**{**QUICK.__dict__, "lr": 3e-4})
    assert warm_start_dir(tmp_path, default_mixture(0), 0, other).name != a.name


def test_training_stops_at_the_first_evaluation_that_reaches_the_target(tmp_path: Path) -> None:
    reached = WarmStartSettings(**{**QUICK.__dict__, "target_accuracy": 0.0, "max_steps": 50})
    info = read_warm_start_info(warm_start(tmp_path, default_mixture(0), 0, settings=reached))
    assert (info["steps"], info["stopped_by"]) == (2, "target")


def test_an_unfinished_directory_is_not_taken_for_a_cached_result(tmp_path: Path) -> None:
    target = warm_start_dir(tmp_path, default_mixture(0), 0, QUICK)
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")
    path = warm_start(tmp_path, default_mixture(0), 0, settings=QUICK)
    assert json.loads((path / "warmstart.json").read_text())["steps"] == 4


def test_hard_tasks_are_those_with_a_multi_digit_operand() -> None:
    tasks = default_mixture(0).sample(0, 200)
    hard = [t for t in tasks if is_hard(t)]
    assert 0 < len(hard) < len(tasks)
    assert all(any(len(part) >= 2 for part in t.prompt[:-1].replace("-", "+").split("+")) for t in hard)


class _AnsweringEngine:
    """A stub engine that answers every task right (or wrong), to test the accuracy plumbing."""

    name = "stub"

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = answers
        self.calls: list[tuple[int, SamplingParams]] = []

    def generate(
        self, prompts: list[str], n: int, params: SamplingParams, generator: torch.Generator | None = None
    ) -> GenerationResult:
        self.calls.append((len(prompts), params))
        completions = [[Completion([], [], self.answers[p], True)] * n for p in prompts]
        return GenerationResult([[1]] * len(prompts), completions, 0, 0, 0.0)

    def update_weights(self, policy: Policy) -> None:
        pass


def _answers(tasks: list[Task], right: int) -> dict[str, str]:
    return {t.prompt: (str(t.entry["answer"]) if i < right else "x") for i, t in enumerate(tasks)}


def test_evaluate_accuracy_is_the_share_of_tasks_solved_and_partial_credit_is_no_solution() -> None:
    tasks = list({t.prompt: t for t in default_mixture(0).heldout(40)}.values())[:20]
    answers = _answers(tasks, 5)
    for t in tasks[5:10]:  # wrong answers that contain the right one: the scorer's partial credit
        answers[t.prompt] = f"{t.entry['answer']}0"
    engine = _AnsweringEngine(answers)
    scores = task_scores(build_tiny_policy(0), tasks, engine)
    assert all(0 < s < 1 for s in scores[5:10])  # rewards for training...
    assert evaluate_accuracy(build_tiny_policy(0), tasks, engine) == pytest.approx(
        5 / len(tasks)
    )  # ...not solutions
    assert engine.calls[0][1].temperature == 0.0  # greedy by default
    assert task_scores(build_tiny_policy(0), [], engine) == []


def test_sampled_evaluation_is_reproducible_by_default() -> None:
    policy = build_tiny_policy(0)
    tasks = default_mixture(0).heldout(30)
    a = task_scores(policy, tasks, greedy=False)
    b = task_scores(policy, tasks, greedy=False)
    assert a == b


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_full_warm_start_lands_well_above_zero_and_below_the_ceiling(tmp_path: Path) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # ~2 min alone on one core; other work may share the machine
    started = time.perf_counter()
    try:
        path = warm_start(tmp_path, default_mixture(0), 0, print)
    finally:
        torch.set_num_threads(threads)
    info = read_warm_start_info(path)
    print(f"warm start: {time.perf_counter() - started:.1f} s, {json.dumps(info['heldout'])}")
    assert info["stopped_by"] == "target"
    assert 0.2 < info["heldout"]["greedy_accuracy"] < 0.9
    assert 0.2 < info["heldout"]["sampled_t1_accuracy"] < 0.9
