"""Verifiable tasks: ids that regenerate a task, mixtures, and the local verifier.

Owns: turning a ``TaskId`` back into the exact prompt and reasoning-gym entry,
and scoring a completion against that regenerated entry. Must not trust any
answer or reward carried with a rollout: scoring always re-derives the task.
"""

from swarmnode.tasks.ids import PROMPT_FORMATS, TaskId
from swarmnode.tasks.mixture import (
    SPECIALIST_FAMILIES,
    DatasetSpec,
    TaskMixture,
    default_mixture,
    family_names,
    generator_config_keys,
    mixture_from_specs,
    sapo_mixture,
)
from swarmnode.tasks.scoring import UnsafeScorerError, check_family, extract_answer, score_completion
from swarmnode.tasks.source import Task, regenerate

__all__ = [
    "PROMPT_FORMATS",
    "SPECIALIST_FAMILIES",
    "DatasetSpec",
    "Task",
    "TaskId",
    "TaskMixture",
    "UnsafeScorerError",
    "check_family",
    "default_mixture",
    "extract_answer",
    "family_names",
    "generator_config_keys",
    "mixture_from_specs",
    "regenerate",
    "sapo_mixture",
    "score_completion",
]
