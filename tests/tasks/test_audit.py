"""The scorer audit: every family a mixture can name is safe, by the audit or by our own scorer."""

from __future__ import annotations

import time
from fractions import Fraction

import pytest

from swarmnode.tasks import TaskId, TaskMixture, UnsafeScorerError, regenerate, score_completion
from swarmnode.tasks.audit import all_families, audit_family
from swarmnode.tasks.mixture import SAPO_DATASETS, DatasetSpec, default_mixture
from swarmnode.tasks.safe_scorers import SAFE_SCORERS
from swarmnode.tasks.upstream import upstream_scorer

MIXTURE_FAMILIES = sorted({*SAPO_DATASETS, *(s.name for s in default_mixture().specs)})


@pytest.mark.parametrize("family", MIXTURE_FAMILIES)
def test_every_family_a_mixture_names_is_audited_safe_or_has_our_own_scorer(family: str) -> None:
    finding = audit_family(family)
    assert finding.safe or family in SAFE_SCORERS, f"{family}: {finding.unsafe}"


@pytest.mark.parametrize(
    ("family", "construct"),
    [
        ("binary_matrix", "eval"),
        ("spiral_matrix", "eval"),
        ("string_insertion", "eval"),
        ("propositional_logic", "recursion"),
        ("puzzle24", "sympy.parse_expr"),
    ],
)
def test_the_audit_finds_the_unsafe_constructs_upstream_has(family: str, construct: str) -> None:
    assert any(item.startswith(construct) for item in audit_family(family).unsafe), audit_family(family)


def test_a_family_with_an_unsafe_scorer_and_no_safe_one_is_refused_by_name() -> None:
    with pytest.raises(UnsafeScorerError, match=r"spiral_matrix.*eval"):
        TaskMixture([DatasetSpec("spiral_matrix")])


def test_the_whole_audit_covers_every_upstream_family() -> None:
    families = all_families()
    assert len(families) > 100
    flagged = {f for f in families if not audit_family(f).safe}
    assert {"binary_matrix", "spiral_matrix", "string_insertion", "n_queens"} <= flagged
    assert "chain_sum" not in flagged


def test_binary_matrix_keeps_upstreams_rewards_without_eval() -> None:
    task = regenerate(TaskId("binary_matrix", "{}", 0, 5, "question"))
    oracle = task.entry["answer"]
    as_list = str([[int(x) for x in row.split()] for row in oracle.split("\n")])
    assert score_completion(task, oracle) == 1.0
    assert score_completion(task, as_list) == 0.1  # upstream accepts the Python list for 0.1
    assert score_completion(task, "exit(3)") == 0.0
    assert score_completion(task, "[" * 5000) == 0.0
    assert score_completion(task, "9" * 100_000) == 0.0


def test_propositional_logic_is_bounded_and_keeps_upstreams_rewards() -> None:
    task = regenerate(TaskId("propositional_logic", "{}", 0, 5, "question"))
    variables = task.entry["metadata"]["variables"]
    assert score_completion(task, f"{variables[0]} ∨ ¬{variables[0]}") == 0.25  # a tautology, as upstream
    for hostile in (
        "(" * 3500 + "P" + ")" * 3500,
        "¬" * 3000 + "P",
        " ∧ ".join("abcdefghijklmnopqrstuvwxyz"),
    ):
        assert score_completion(task, hostile) == 0.0


def test_coin_flip_is_bounded_and_keeps_upstreams_rewards() -> None:
    # Red team rt24 F6: upstream's float(Fraction(answer)) spent 6.8 s of CPU on "1e10000000",
    # and the audit did not look for Fraction.
    assert any(item.startswith("fractions.Fraction") for item in audit_family("coin_flip").unsafe)
    task = regenerate(TaskId("coin_flip", "{}", 0, 3, "question"))
    oracle = task.entry["answer"]
    upstream = upstream_scorer("coin_flip")
    probability = float(Fraction(oracle.replace(",", "")))
    for honest in (oracle, str(probability), f" {Fraction(probability).limit_denominator()} ", "abc"):
        assert score_completion(task, honest) == upstream(honest, task.entry), honest
    assert score_completion(task, oracle) == 1.0
    for hostile in ("1e10000000", "0e10000000", "1e-10000000", "1" * 65, "1e1000", "1" * 300):
        started = time.process_time()
        assert score_completion(task, hostile) == 0.0
        assert time.process_time() - started < 0.5


@pytest.mark.parametrize("family", ["coin_flip", "game_of_life_halting"])
def test_no_constant_answer_is_paid_in_full_on_every_task(family: str) -> None:
    # Red team rt86 F1, F2: upstream paid coin_flip's "0" 1.0 on every task (its prefix credit over
    # the shorter string's length) and game_of_life_halting any non-empty text (bool("False") is
    # True). The right answer is still paid in full.
    tasks = [regenerate(TaskId(family, "{}", 0, i, "question")) for i in range(8)]
    assert len({t.entry["answer"] for t in tasks}) > 1 or family == "game_of_life_halting"
    for task in tasks:
        assert score_completion(task, task.entry["answer"]) == 1.0
    for constant in ("0", "-0", "0.0", "0/1", "1", "A", "[]", "True", "False", "yes"):
        paid = [score_completion(task, constant) for task in tasks]
        assert not all(reward == 1.0 for reward in paid), (constant, paid)
    if family == "coin_flip":  # "0" is right within upstream's 1e-4 of a probability like 3e-5
        far = [t for t in tasks if float(Fraction(t.entry["answer"])) > 1e-4]
        assert far and all(score_completion(t, "0") < 0.5 for t in far)


def test_game_of_life_halting_pays_the_oracles_word_alone() -> None:
    task = regenerate(TaskId("game_of_life_halting", "{}", 0, 0, "question"))
    oracle = task.entry["answer"]
    other = "True" if oracle == "False" else "False"
    assert score_completion(task, f"<answer> {oracle.lower()} </answer>") == 1.0
    assert score_completion(task, other) == 0.0
    assert score_completion(task, "0") == 0.0


@pytest.mark.parametrize("family", MIXTURE_FAMILIES)
def test_no_family_a_mixture_names_pays_a_constant_answer_on_every_task(family: str) -> None:
    # Red team rt86 F3: the audit looks for code and unbounded work, not for a scorer that cannot
    # tell right from wrong; a constant paid in full is a reward a peer earns without solving.
    tasks = [regenerate(TaskId(family, "{}", 0, i, "question")) for i in range(6)]
    for constant in ("0", "1", "-1", "0.5", "A", "[]", "True", "False", "yes", "x"):
        paid = [score_completion(task, constant) for task in tasks]
        assert not all(reward == 1.0 for reward in paid), (constant, paid)
