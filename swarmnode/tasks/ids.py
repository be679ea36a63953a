"""Task identifiers.

A task is named by (dataset, config, seed, index, prompt format). The config is
canonical JSON (sorted keys, no spaces), so two peers that build the same
dataset produce byte-identical ids, and the id alone regenerates the task.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from swarmnode.errors import TaskError

#: How a reasoning-gym entry becomes the model's prompt.
#: ``question``: the generator's question text verbatim (what SAPO's agents saw).
#: ``compact``: for arithmetic generators, the bare expression with spaces
#: removed and a trailing ``=``, e.g. ``58+26=``. The built-in tiny model uses
#: it: a 1 M-parameter model cannot afford 60 characters of fixed instruction.
PROMPT_FORMATS = ("question", "compact")

MAX_DATASET_NAME = 64
MAX_CONFIG_JSON = 1024


def canonical_config(config: dict[str, Any]) -> str:
    """The one JSON spelling of a dataset config used inside task ids."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class TaskId:
    """Everything needed to regenerate one task, and nothing else."""

    dataset: str
    config: str  # canonical JSON, see canonical_config
    seed: int
    index: int
    prompt_format: str = "question"

    def __post_init__(self) -> None:
        if not self.dataset or len(self.dataset) > MAX_DATASET_NAME:
            raise TaskError(f"task dataset name {self.dataset!r} must be 1-{MAX_DATASET_NAME} chars")
        if len(self.config) > MAX_CONFIG_JSON:
            raise TaskError(f"task config is {len(self.config)} bytes; the limit is {MAX_CONFIG_JSON}")
        if self.index < 0 or self.seed < 0:
            raise TaskError(f"task seed and index must be >= 0 (got seed={self.seed}, index={self.index})")
        if self.prompt_format not in PROMPT_FORMATS:
            raise TaskError(
                f"task prompt_format {self.prompt_format!r} is unknown; allowed: {', '.join(PROMPT_FORMATS)}"
            )

    def config_dict(self) -> dict[str, Any]:
        try:
            value = json.loads(self.config)
        except json.JSONDecodeError as exc:
            raise TaskError(f"task config is not valid JSON: {exc}") from exc
        if not isinstance(value, dict):
            raise TaskError("task config must be a JSON object")
        return value

    def key(self) -> str:
        """A short, stable string form (for logs, ledger rows and dict keys)."""
        return f"{self.dataset}:{self.config}:{self.seed}:{self.index}:{self.prompt_format}"
