"""Score a completion against its regenerated task, with a scorer that is safe on hostile text.

Owns: answer extraction (protocol/SPEC.md §6), the choice of scorer per family
(the project's own from ``safe_scorers``, else upstream's when the audit finds
nothing unsafe in it, else a refusal), and the rule that a scorer's ordinary
failure is a wrong answer. Must not: trust a claimed reward, or call a scorer
the audit flagged.

This module runs third-party code on peer text. In a node it runs only inside
the verification boundary (``swarmnode.verify``: sandboxed worker processes with
CPU, memory and network limits); in-process use is for tests, the simulator
and tools over our own rollouts.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from swarmnode.errors import TaskError
from swarmnode.tasks.safe_scorers import SAFE_SCORERS
from swarmnode.tasks.source import Task
from swarmnode.tasks.upstream import Scorer, upstream_scorer

ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"

#: What a scorer may raise on a malformed answer; it means "wrong", reward 0. Anything else
#: (RecursionError, SystemExit, MemoryError, ...) is a verifier failure, handled by the caller.
ORDINARY_SCORER_ERRORS = (ValueError, TypeError, KeyError, IndexError, AttributeError, ArithmeticError)


class UnsafeScorerError(TaskError):
    """A family whose upstream scorer the audit flags and for which the project has no safe scorer."""


def extract_answer(completion: str) -> str:
    """The answer a completion gives (SPEC §6).

    Rule: if the completion contains ``<answer>`` followed later by ``</answer>``,
    the text between the first ``<answer>`` and the first ``</answer>`` after it;
    otherwise the whole completion. Either way surrounding whitespace is
    stripped. (The tiny model answers ``58+26=`` with ``84`` then EOS;
    instruction-tuned models are prompted to use the tag. Some answers are
    multi-line, e.g. binary_matrix, so we never cut at a newline.) Linear in
    the text's length: two ``str.find`` calls, no regular expression.
    """
    return answer_span(completion).strip()


def answer_span(completion: str) -> str:
    """``extract_answer``'s text before its whitespace is stripped."""
    start = completion.find(ANSWER_OPEN)
    if start >= 0:
        end = completion.find(ANSWER_CLOSE, start + len(ANSWER_OPEN))
        if end >= 0:
            return completion[start + len(ANSWER_OPEN) : end]
    return completion


@cache
def scorer_for(name: str) -> Scorer:
    """The scorer used for family ``name``; raises ``UnsafeScorerError`` naming what the audit found."""
    import reasoning_gym.factory

    if name not in reasoning_gym.factory.DATASETS:
        raise TaskError(f"unknown reasoning-gym dataset {name!r}")
    own = SAFE_SCORERS.get(name)
    if own is not None:
        return own
    from swarmnode.tasks.audit import audit_family

    finding = audit_family(name)
    if finding.unsafe:
        raise UnsafeScorerError(
            f"reasoning-gym family {name!r} is refused: its scorer reaches {', '.join(finding.unsafe)} "
            "on the answer text, and swarmnode ships no safe scorer for it "
            "(see `swarmnode tasks audit`; choose another family)"
        )
    return upstream_scorer(name)


def check_family(name: str) -> None:
    """Raise ``UnsafeScorerError`` (or ``TaskError``) now if family ``name`` cannot be scored safely."""
    scorer_for(name)


def reward_of(scorer: Scorer, answer: str, entry: dict[str, Any]) -> float:
    """``scorer``'s reward for an extracted answer, clamped to [0, 1]; ordinary scorer errors score 0.

    The one rule behind ``score_answer``; a caller scoring many answers of one family (the
    verifier worker) looks ``scorer_for`` up once and calls this per answer."""
    try:
        reward = float(scorer(answer, entry))
    except ORDINARY_SCORER_ERRORS:
        return 0.0
    if reward != reward:  # NaN
        return 0.0
    return min(max(reward, 0.0), 1.0)


def score_answer(task: Task, answer: str) -> float:
    """Reward in [0, 1] for an already extracted answer; ordinary scorer errors score 0."""
    return reward_of(scorer_for(task.id.dataset), answer, task.entry)


def score_completion(task: Task, completion: str) -> float:
    """Reward in [0, 1] from the family's safe scorer on the regenerated entry.

    A scorer choking on hostile text with an ordinary error scores it as wrong;
    any other exception propagates (the verification boundary turns it into a
    ``verifier_failed`` rejection)."""
    return score_answer(task, extract_answer(completion))


def solved(score: float) -> bool:
    """Whether a completion that scored ``score`` solves its task: only the scorer's full reward.
    Every family the built-in models learn gives partial credit to a wrong answer that contains
    the right one ("160" for 16 scores 0.67): a reward for training, never a success (held-out
    accuracy counted it as two thirds of one; red team rt33)."""
    return score >= 1.0


__all__ = [
    "ORDINARY_SCORER_ERRORS",
    "UnsafeScorerError",
    "check_family",
    "extract_answer",
    "reward_of",
    "score_answer",
    "score_completion",
    "scorer_for",
    "solved",
    "upstream_scorer",
]
