"""A worker that decodes greedily, ignoring the learner's sampling seed, and reports the honest
log-probs of its tokens under the version it claims (temperature 1: greedy log-probs are
``log_softmax(logits)``), run as its own process by the tests. Every log-prob spot check passes;
only a check of the tokens themselves (keyed sampling, protocol/SPEC.md 1.8) can catch it.

python tests/workers/greedy.py HOME
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from pathlib import Path
from typing import Any

from swarmnode.config import load_config
from swarmnode.home import NodeHome
from swarmnode.roles import worker as worker_module
from swarmnode.roles.run import run_role
from swarmnode.rollout.types import GenerationResult, SamplingParams


class GreedyWorker(worker_module.WorkerNode):
    def _build(self) -> None:
        super()._build()
        generate = self.engine.generate

        def greedy(
            prompts: list[str], n: int, params: SamplingParams, generator: Any = None, **_: Any
        ) -> GenerationResult:
            return generate(prompts, n, dataclasses.replace(params, temperature=0.0), generator)

        self.engine.generate = greedy  # type: ignore[method-assign]


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    home = NodeHome(Path(sys.argv[1]))
    worker_module.WorkerNode = GreedyWorker  # type: ignore[misc]
    run_role(load_config(home.config_file), home)
