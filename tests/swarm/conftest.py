"""Fixtures for swarm tests: one warm-started tiny model per session, swarms that always stop."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from swarmnode.policy import WarmStartSettings, warm_start
from swarmnode.tasks import default_mixture

from .support import LocalSwarm

# A brief warm start (~10-40 s on 2 shared cores): enough for rewards that are not all zero.
QUICK = WarmStartSettings(max_steps=120, eval_every=60, eval_tasks=64, heldout_tasks=64, target_accuracy=1.0)


@pytest.fixture(scope="session")
def swarm_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    return warm_start(tmp_path_factory.mktemp("swarm-model"), default_mixture(0), 0, settings=QUICK)


@pytest.fixture
def local_swarm(tmp_path: Path, swarm_model: Path) -> Iterator[Callable[[float], LocalSwarm]]:
    """``local_swarm(round_seconds)``: a ``LocalSwarm`` under tmp_path; every process it started is
    stopped at teardown (SIGINT, then SIGKILL of its process group, then any leftover p2pd)."""
    made: list[LocalSwarm] = []

    def make(round_seconds: float) -> LocalSwarm:
        swarm = LocalSwarm(tmp_path / f"swarm-{len(made)}", swarm_model, round_seconds=round_seconds)
        made.append(swarm)
        return swarm

    try:
        yield make
    finally:
        for swarm in made:
            swarm.close()
