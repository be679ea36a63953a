"""A worker that misreports its log-probs (adds a constant), run as its own process by the tests.

python tests/workers/liar.py HOME
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from swarmnode.config import load_config
from swarmnode.home import NodeHome
from swarmnode.roles import worker as worker_module
from swarmnode.roles.run import run_role
from swarmnode.train import ScoredGroup

LIE = 0.5  # nats added to every reported log-prob (clipped at 0): a worker claiming a sharper policy


class LyingWorker(worker_module.WorkerNode):
    def _generate(self, index: int) -> tuple[int, list[ScoredGroup], float]:
        version, groups, seconds = super()._generate(index)
        for g in groups:
            g.behaviour_logprobs = [[min(0.0, lp + LIE) for lp in row] for row in g.behaviour_logprobs]
        return version, groups, seconds


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    home = NodeHome(Path(sys.argv[1]))
    worker_module.WorkerNode = LyingWorker  # type: ignore[misc]
    run_role(load_config(home.config_file), home)
