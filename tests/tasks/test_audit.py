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
    for honest in (oracle, str(probability), f" {Fraction(probability).limit_denominator()} ", "0.9", "abc"):
        assert score_completion(task, honest) == upstream(honest, task.entry), honest
    assert score_completion(task, oracle) == 1.0
    for hostile in ("1e10000000", "0e10000000", "1e-10000000", "1" * 65, "1e1000", "1" * 300):
        started = time.process_time()
        assert score_completion(task, hostile) == 0.0
        assert time.process_time() - started < 0.5
