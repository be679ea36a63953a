"""A briefly warm-started tiny model shared by the trainer tests (so rewards are not all zero)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from swarmnode.policy import WarmStartSettings, warm_start
from swarmnode.tasks import default_mixture

QUICK = WarmStartSettings(max_steps=120, eval_every=60, eval_tasks=64, heldout_tasks=64, target_accuracy=1.0)


@pytest.fixture(scope="session")
def quick_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    home = tmp_path_factory.mktemp("warm")
    return warm_start(home, default_mixture(0), 0, settings=QUICK)
