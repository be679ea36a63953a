"""Weighted mixtures of task generators.

A mixture draws task ids deterministically from (mixture seed, round, slot), so
any node can tell which tasks a round asks for and a restart draws the same ones.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Any

from swarmnode.errors import TaskError
from swarmnode.tasks.ids import TaskId, canonical_config
from swarmnode.tasks.scoring import check_family
from swarmnode.tasks.source import MAX_TASK_INDEX, Task, regenerate


@dataclass(frozen=True)
class DatasetSpec:
    """One generator in a mixture."""

    name: str
    config: dict[str, Any] = field(default_factory=dict)
    weight: float = 1.0
    prompt_format: str = "question"

    def task_id(self, seed: int, index: int) -> TaskId:
        return TaskId(self.name, canonical_config(self.config), seed, index, self.prompt_format)


class TaskMixture:
    """Draws tasks from weighted generators.

    ``seed`` selects the training stream; ``heldout_seed`` is a different
    reasoning-gym seed, so held-out tasks come from a separate stream (for small
    generators such as 2-term chain_sum, some problems still coincide by value).
    """

    def __init__(self, specs: list[DatasetSpec], seed: int = 0) -> None:
        if not specs:
            raise TaskError("a task mixture needs at least one dataset")
        if any(spec.weight <= 0 for spec in specs):
            raise TaskError("every dataset weight in a task mixture must be > 0")
        self.specs = list(specs)
        self.seed = seed
        total = sum(spec.weight for spec in specs)
        self._cumulative: list[float] = []
        acc = 0.0
        for spec in specs:
            acc += spec.weight / total
            self._cumulative.append(acc)
        for spec in specs:  # fail at start-up, not mid-run, on a bad generator or an unsafe scorer
            check_family(spec.name)
            regenerate(spec.task_id(seed, 0))

    def _rng(self, *parts: int | str) -> random.Random:
        digest = hashlib.sha256(":".join(str(p) for p in (self.seed, *parts)).encode()).digest()
        return random.Random(int.from_bytes(digest[:8], "big"))

    def _pick(self, rng: random.Random) -> DatasetSpec:
        u = rng.random()
        for spec, edge in zip(self.specs, self._cumulative, strict=True):
            if u <= edge:
                return spec
        return self.specs[-1]

    def sample(self, round_index: int, count: int, stream: str = "train") -> list[Task]:
        """``count`` tasks for ``round_index`` (deterministic in seed, stream and round)."""
        rng = self._rng(stream, round_index)
        tasks = []
        for _ in range(count):
            spec = self._pick(rng)
            tasks.append(regenerate(spec.task_id(self.seed, rng.randrange(MAX_TASK_INDEX))))
        return tasks

    def heldout(self, count: int) -> list[Task]:
        """A fixed held-out set drawn from a separate reasoning-gym seed."""
        rng = self._rng("heldout")
        heldout_seed = self.seed + 1_000_003
        tasks = []
        for _ in range(count):
            spec = self._pick(rng)
            tasks.append(regenerate(spec.task_id(heldout_seed, rng.randrange(MAX_TASK_INDEX))))
        return tasks


def default_mixture(seed: int = 0) -> TaskMixture:
    """What the built-in tiny model learns: 2-term chain_sum, 1-2 digit terms, compact prompts."""
    return TaskMixture(
        [
            DatasetSpec(
                "chain_sum",
                {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2},
                1.0,
                "compact",
            )
        ],
        seed=seed,
    )


#: The nine ReasoningGym tasks of SAPO's experiments (ALGORITHMS.md §2), equal weights.
SAPO_DATASETS = (
    "arc_1d",
    "basic_arithmetic",
    "base_conversion",
    "bf",
    "binary_matrix",
    "calendar_arithmetic",
    "decimal_arithmetic",
    "fraction_simplification",
    "propositional_logic",
)


def sapo_mixture(seed: int = 0) -> TaskMixture:
    return TaskMixture([DatasetSpec(name) for name in SAPO_DATASETS], seed=seed)
