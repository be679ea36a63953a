"""reasoning-gym's own scorers, looked up by family name.

Owns: the one lookup of upstream's ``score_answer`` functions. Must not: decide whether a
family is safe to score (``tasks.audit``, ``tasks.scoring.scorer_for``): everything here is
third-party code that may ``eval`` a stranger's text.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from swarmnode.errors import TaskError

#: A family's scorer: (extracted answer or None, regenerated entry) -> reward.
Scorer = Callable[[str | None, dict[str, Any]], float]


@cache
def upstream_scorer(name: str) -> Scorer:
    """reasoning-gym's ``score_answer`` for ``name``, built once (upstream builds a dataset per call)."""
    import reasoning_gym

    try:
        scorer: Scorer = reasoning_gym.get_score_answer_fn(name)
    except ValueError as exc:
        raise TaskError(f"unknown reasoning-gym dataset {name!r}") from exc
    return scorer


__all__ = ["Scorer", "upstream_scorer"]
