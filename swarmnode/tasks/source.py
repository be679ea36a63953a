"""Regenerate tasks from their ids (scoring is ``swarmnode.tasks.scoring``).

A task is a pure function of its id: the answer or reward a peer claims is never
consulted (ALGORITHMS.md §8: the genrl bug where re-scoring used the sender's
claimed answer).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from swarmnode.errors import TaskError
from swarmnode.tasks.ids import TaskId

# A reasoning-gym dataset object is built for `size` entries; entries are a pure
# function of (seed, index), so we build it once per (dataset, config, seed)
# with a size large enough for any index we accept.
MAX_TASK_INDEX = 1_000_000_000


@dataclass(frozen=True)
class Task:
    """A regenerated task: its id, the prompt the model sees, and the entry to score against."""

    id: TaskId
    prompt: str
    entry: dict[str, Any]


#: Upstream modules that print to stdout while generating a task: bf's optimizer prints "." for
#: every task, so each regenerated bf task wrote a byte to the node's (and `protocol check`'s)
#: stdout. Their module-level ``print`` is shadowed with a no-op: thread-safe, unlike swapping
#: ``sys.stdout`` while other threads write.
_PRINTING_MODULES = ("reasoning_gym.code.contrib.bfit.Compiler.Optimizer",)


def _no_print(*args: object, **kwargs: object) -> None:
    return None


def _silence_upstream_prints() -> None:
    for name in _PRINTING_MODULES:
        module = sys.modules.get(name)
        if module is not None:
            module.print = _no_print  # type: ignore[attr-defined]


@lru_cache(maxsize=256)
def _dataset(name: str, config: str, seed: int) -> Any:
    import reasoning_gym  # imported lazily: it pulls in many generators

    kwargs = TaskId(name, config, seed, 0).config_dict()
    if "seed" in kwargs or "size" in kwargs:
        raise TaskError("task config must not set 'seed' or 'size': they are part of the task id")
    try:
        dataset = reasoning_gym.create_dataset(name, seed=seed, size=MAX_TASK_INDEX, **kwargs)
    except Exception as exc:  # third-party code on a config a stranger may have chosen: any error = no task
        raise TaskError(f"cannot build reasoning-gym dataset {name!r} with config {config}: {exc}") from exc
    _silence_upstream_prints()  # after the import that loaded them
    return dataset


def render_prompt(entry: dict[str, Any], prompt_format: str) -> str:
    """Turn an entry into the model's prompt (see ``PROMPT_FORMATS``)."""
    if prompt_format == "question":
        return str(entry["question"])
    expression = entry.get("metadata", {}).get("expression")
    if not isinstance(expression, str):
        raise TaskError("prompt_format 'compact' needs an arithmetic entry with metadata.expression")
    return expression.replace(" ", "") + "="


# 4,096 entries of ~1.5 KB each (~6 MB): a node re-derives the tasks of recent rounds only, and an
# uncached regeneration costs ~50 us. The cap was 65,536 (~100 MB per node): the 60-minute soak
# showed each node's memory climbing ~2 MiB/min while this cache filled.
@lru_cache(maxsize=4096)
def regenerate(task_id: TaskId) -> Task:
    """Rebuild the task named by ``task_id``; raises ``TaskError`` if it cannot exist."""
    if task_id.index >= MAX_TASK_INDEX:
        raise TaskError(f"task index {task_id.index} is above the limit {MAX_TASK_INDEX - 1}")
    dataset = _dataset(task_id.dataset, task_id.config, task_id.seed)
    try:
        entry = dataset[task_id.index]
    except Exception as exc:  # a generator that fails on this (seed, index, config) makes no task
        raise TaskError(f"cannot generate {task_id.key()}: {exc}") from exc
    return Task(id=task_id, prompt=render_prompt(entry, task_id.prompt_format), entry=entry)
