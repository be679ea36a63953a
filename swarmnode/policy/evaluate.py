"""Accuracy of a policy on a list of tasks, scored by the local verifier.

Owns: running an engine over tasks in batches and averaging
``score_completion``. Must not: train or change the policy.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from swarmnode.errors import EngineUnavailable
from swarmnode.policy.model import Policy
from swarmnode.rollout.types import RolloutEngine, SamplingParams
from swarmnode.tasks import Task, score_completion
from swarmnode.tasks.scoring import solved

#: Prompts per generate() call during evaluation (bounds the KV cache).
EVAL_BATCH = 256


def default_engine(policy: Policy) -> RolloutEngine:
    """The torch engine, or the HF reference when the torch engine cannot run this model."""
    from swarmnode.rollout import make_engine  # rollout imports policy.model: import late

    try:
        return make_engine("torch", policy)
    except EngineUnavailable:
        return make_engine("hf", policy)


def task_scores(
    policy: Policy,
    tasks: Sequence[Task],
    engine: RolloutEngine | None = None,
    greedy: bool = True,
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_new_tokens: int = 16,
    generator: torch.Generator | None = None,
) -> list[float]:
    """One completion per task (greedy, or sampled at ``temperature`` and ``top_p``), scored in [0, 1].

    ``engine`` must be serving ``policy`` (built for it or given it with
    ``update_weights``); ``None`` builds one. A sampled evaluation without a
    ``generator`` uses a fixed seed (0), so it is reproducible by default.
    """
    if not tasks:
        return []
    engine = engine if engine is not None else default_engine(policy)
    params = SamplingParams(
        temperature=0.0 if greedy else temperature, top_p=top_p, max_new_tokens=max_new_tokens
    )
    if not greedy and generator is None:
        generator = torch.Generator().manual_seed(0)
    scores: list[float] = []
    for start in range(0, len(tasks), EVAL_BATCH):
        chunk = tasks[start : start + EVAL_BATCH]
        result = engine.generate([task.prompt for task in chunk], 1, params, generator)
        scores.extend(
            score_completion(task, group[0].text)
            for task, group in zip(chunk, result.completions, strict=True)
        )
    return scores


def evaluate_accuracy(
    policy: Policy,
    tasks: Sequence[Task],
    engine: RolloutEngine | None = None,
    greedy: bool = True,
    *,
    temperature: float = 1.0,
    max_new_tokens: int = 16,
    generator: torch.Generator | None = None,
) -> float:
    """Share of tasks whose one completion solves them (full reward, ``tasks.scoring.solved``;
    0.0 for no tasks); see ``task_scores``."""
    scores = task_scores(
        policy,
        tasks,
        engine,
        greedy,
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        generator=generator,
    )
    return sum(solved(score) for score in scores) / len(scores) if scores else 0.0
