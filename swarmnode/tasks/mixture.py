"""Weighted mixtures of task generators.

A mixture draws task ids deterministically from (mixture seed, round, slot), so
any node can tell which tasks a round asks for and a restart draws the same ones.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import inspect
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from swarmnode.errors import ConfigError, TaskError
from swarmnode.tasks.ids import PROMPT_FORMATS, TaskId, canonical_config
from swarmnode.tasks.scoring import check_family
from swarmnode.tasks.source import MAX_TASK_INDEX, Task, regenerate


@dataclass(frozen=True)
class DatasetSpec:
    """One generator in a mixture."""

    name: str
    config: dict[str, Any] = field(default_factory=dict)
    weight: float = 1.0
    prompt_format: str = "question"
    label: str = ""  # the family's name in results and status (not part of any task id)

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
        if not all(spec.weight > 0 and math.isfinite(spec.weight) for spec in specs):
            raise TaskError("every dataset weight in a task mixture must be finite and > 0")
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

    def families(self) -> dict[str, DatasetSpec]:
        """Each dataset by its family name (``family_names``)."""
        return family_names(self.specs)

    def heldout_by_family(self, count: int) -> dict[str, list[Task]]:
        """Held-out sets of ``count`` tasks per family (one family: ``{name: self.heldout(count)}``,
        the same tasks). Each family's set is its own single-dataset mixture's ``heldout``, so it does
        not depend on the other families or the weights: peers on other mixtures measure a family on
        the same tasks when they share the task seed."""
        return {name: TaskMixture([spec], self.seed).heldout(count) for name, spec in self.families().items()}


def family_names(specs: Sequence[DatasetSpec]) -> dict[str, DatasetSpec]:
    """Each dataset by the name results and status give its family: its ``label``, else its
    generator's name (``name#i`` when two entries share a generator)."""
    names = [d.name for d in specs]
    out: dict[str, DatasetSpec] = {}
    for i, d in enumerate(specs):
        name = d.label or (d.name if names.count(d.name) == 1 else f"{d.name}#{i}")
        if name in out:
            raise TaskError(f"two datasets have the family name {name!r}; give them different labels")
        out[name] = d
    return out


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


def _one_digit(name: str, label: str, **config: Any) -> DatasetSpec:
    return DatasetSpec(
        name,
        {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, **config},
        1.0,
        "compact",
        label,
    )


#: Four families the tiny model's alphabet writes, each learnt alone in a few hundred supervised
#: steps (decimals: ~1,000): the specialists of ``swarmnode swarm`` and of the #14 testbed
#: (``simulations/scenarios/specialists.toml`` lists the same four).
SPECIALIST_FAMILIES: tuple[DatasetSpec, ...] = (
    _one_digit("basic_arithmetic", "add", operators=["+"], allow_parentheses=False, allow_negation=False),
    _one_digit("basic_arithmetic", "sub", operators=["-"], allow_parentheses=False, allow_negation=False),
    _one_digit("products", "mul"),
    _one_digit("decimal_chain_sum", "dec", min_decimal_places=1, max_decimal_places=1),
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


#: Config keys a dataset entry may not set: they are part of every task id (tasks.seed, the draw).
RESERVED_CONFIG_KEYS = ("seed", "size")


def generator_config_keys(name: str) -> tuple[str, ...]:
    """The config keys reasoning-gym generator ``name`` takes (its config dataclass's fields,
    less ``seed`` and ``size``); raises ``TaskError`` for an unknown generator."""
    import reasoning_gym.factory

    registered = reasoning_gym.factory.DATASETS
    if name not in registered:
        close = difflib.get_close_matches(name, list(registered), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise TaskError(
            f"unknown reasoning-gym generator {name!r}{hint} "
            "(`swarmnode tasks audit --all` lists every family)"
        )
    config_cls = registered[name][1]
    if dataclasses.is_dataclass(config_cls):
        keys = [f.name for f in dataclasses.fields(config_cls)]
    else:  # not seen in reasoning-gym today; its constructor's keywords are the keys
        keys = [p for p in inspect.signature(config_cls).parameters if p != "self"]
    return tuple(sorted(k for k in keys if k not in RESERVED_CONFIG_KEYS))


def _check_spec(spec: DatasetSpec, seed: int) -> None:
    """Raise ``TaskError`` if ``spec`` cannot be part of a mixture; the message omits the entry."""
    known = generator_config_keys(spec.name)
    for key in spec.config:
        if key in RESERVED_CONFIG_KEYS:
            raise TaskError(
                f"config key {key!r} cannot be set per dataset: a task's seed comes from tasks.seed and "
                "its index from the mixture's draw"
            )
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise TaskError(f"unknown config key {key!r}{hint}; known: {', '.join(known) or '(none)'}")
    if not (spec.weight > 0 and math.isfinite(spec.weight)):
        raise TaskError(f"weight must be finite and > 0, not {spec.weight!r}")
    if spec.prompt_format not in PROMPT_FORMATS:
        raise TaskError(f"unknown prompt_format {spec.prompt_format!r}; allowed: {', '.join(PROMPT_FORMATS)}")
    try:
        canonical_config(spec.config)
    except (TypeError, ValueError) as exc:
        raise TaskError(f"config values must be numbers, strings, booleans, lists or tables: {exc}") from exc
    check_family(spec.name)  # UnsafeScorerError names what the audit found
    regenerate(spec.task_id(seed, 0))  # the generator accepts this config (and the prompt format)


def mixture_from_specs(
    specs: Sequence[DatasetSpec], seed: int = 0, *, key: str = "tasks.datasets"
) -> TaskMixture:
    """A mixture from configured entries, each checked before any work: the generator exists, its
    config keys are the generator's own, the weight is finite and > 0, the prompt format is known,
    the family's scorer is safe on peer text (``check_family``) and a task regenerates.

    Raises ``ConfigError`` naming the entry as ``{key}[i] (name): ...``; two entries of the same
    family (generator, config and prompt format) are an error too."""
    if not specs:
        raise ConfigError(f"{key} is empty: a task mixture needs at least one dataset")
    seen: dict[tuple[str, str, str], int] = {}
    for i, spec in enumerate(specs):
        where = f"{key}[{i}] ({spec.name})"
        try:
            _check_spec(spec, seed)
        except TaskError as exc:
            raise ConfigError(f"{where}: {exc}") from exc
        family = (spec.name, canonical_config(spec.config), spec.prompt_format)
        if family in seen:
            raise ConfigError(
                f"{where}: the same generator, config and prompt_format as {key}[{seen[family]}]; "
                "keep one entry (add the weights together)"
            )
        seen[family] = i
    try:
        family_names(specs)
    except TaskError as exc:
        raise ConfigError(f"{key}: {exc}") from exc
    return TaskMixture(list(specs), seed=seed)
