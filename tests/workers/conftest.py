"""Fixtures for learner/worker tests: one warm-started tiny model per session, processes that always stop."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from swarmnode.policy import WarmStartSettings, warm_start
from swarmnode.tasks import default_mixture
from swarmnode.testing import LocalSwarm

QUICK = WarmStartSettings(max_steps=120, eval_every=60, eval_tasks=64, heldout_tasks=64, target_accuracy=1.0)


@pytest.fixture(scope="session")
def worker_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    return warm_start(tmp_path_factory.mktemp("worker-model"), default_mixture(0), 0, settings=QUICK)


@pytest.fixture
def processes(tmp_path: Path, worker_model: Path) -> Iterator[Callable[[str], LocalSwarm]]:
    """``processes(name)``: a ``LocalSwarm`` (bootstrap + role processes) stopped at teardown."""
    made: list[LocalSwarm] = []

    def make(name: str) -> LocalSwarm:
        swarm = LocalSwarm(tmp_path / name, worker_model, round_seconds=30.0)
        made.append(swarm)
        return swarm

    try:
        yield make
    finally:
        for swarm in made:
            swarm.close()
