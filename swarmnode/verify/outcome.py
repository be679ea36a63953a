"""What scoring a batch of groups returns: rewards, or a failure value naming what went wrong."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeAlias

from swarmnode.tasks import Task
from swarmnode.tasks.scoring import score_completion


class VerifierReason(StrEnum):
    TIMEOUT = "verifier_timeout"  # a completion or the batch ran past its CPU or wall limit
    FAILED = "verifier_failed"  # the scorer raised something that is not "wrong answer", or the worker died


@dataclass(frozen=True)
class Scored:
    """One reward per completion, per group, in the order asked; ``cpu_s`` what scoring cost."""

    rewards: tuple[tuple[float, ...], ...]
    cpu_s: float = 0.0


@dataclass(frozen=True)
class VerifierFailure:
    reason: VerifierReason
    detail: str
    cpu_s: float = 0.0


ScoreOutcome: TypeAlias = Scored | VerifierFailure
#: Scores ``[(task, completion texts), ...]``: the one scoring path of admission and of own rollouts.
GroupScorer: TypeAlias = Callable[[Sequence[tuple[Task, Sequence[str]]]], ScoreOutcome]


def score_in_process(groups: Sequence[tuple[Task, Sequence[str]]]) -> ScoreOutcome:
    """The boundary's contract in this process: no time or memory limit, exceptions become values."""
    rewards = []
    for task, texts in groups:
        try:
            rewards.append(tuple(score_completion(task, text) for text in texts))
        except (KeyboardInterrupt, GeneratorExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - the boundary: a scorer may raise SystemExit
            return VerifierFailure(
                VerifierReason.FAILED, f"{task.id.dataset} scorer raised {type(exc).__name__}"
            )
    return Scored(tuple(rewards))


__all__ = ["GroupScorer", "ScoreOutcome", "Scored", "VerifierFailure", "VerifierReason", "score_in_process"]
