"""Dynamic probes: every family a mixture names scores hostile 8 KiB answers quickly and without error.

The static audit cannot see super-linear work that is not recursion (a quadratic
parser, a regular expression that backtracks); these probes can. Each runs in the
sandbox with a tight per-completion CPU limit, so a slow scorer shows up as a
``verifier_timeout`` and a crashing one as ``verifier_failed``.
"""

from __future__ import annotations

import pytest

from swarmnode.tasks import TaskId, regenerate
from swarmnode.tasks.mixture import SAPO_DATASETS
from swarmnode.verify import Scored, VerifierLimits, VerifierPool

MAX = 8192  # the wire's completion text limit
PROBES = [
    "(" * (MAX // 2) + "P" + ")" * (MAX // 2 - 1),
    "¬" * (MAX // 2) + "P",
    "[" * MAX,
    "9" * MAX,
    "1e999999999",
    "-" * MAX,
    "<answer>" * (MAX // 8),
    "0 " * (MAX // 2),
    "a∧" * (MAX // 4),
    "1/" * (MAX // 2),
    "\\n".join(["0 1"] * (MAX // 4)),
    "9**9**9",
    "{" * MAX,
]
FAMILIES = sorted({*SAPO_DATASETS, "chain_sum"})


@pytest.fixture(scope="module")
def pool() -> VerifierPool:
    families = [(f, "{}", "question") for f in FAMILIES]
    limits = VerifierLimits(completion_cpu_s=0.25, batch_cpu_s=4.0, wall_slack_s=5.0)
    with VerifierPool(limits, workers=1, families=families) as p:
        yield p


@pytest.mark.parametrize("family", FAMILIES)
def test_hostile_answers_score_within_a_quarter_second_each(pool: VerifierPool, family: str) -> None:
    task = regenerate(TaskId(family, "{}", 0, 3, "question"))
    outcome = pool.score([(task, PROBES)])
    assert isinstance(outcome, Scored), (family, outcome)
    assert all(0.0 <= r < 1.0 for r in outcome.rewards[0])
