"""``swarmnode run --role learner|worker``: build the role, run it until a signal, stop cleanly.

A first SIGINT/SIGTERM stops after the step (learner) or batch (worker) in progress; a
second aborts at once (the learner's last checkpoint stays its resume point). What the roles
build the same way (engine, model family, network settings) is in ``roles.common``.
"""

from __future__ import annotations

import asyncio

import torch

from swarmnode.config import Config
from swarmnode.home import NodeHome
from swarmnode.net.hivemind_runtime import HivemindRuntime


def run_role(
    config: Config, home: NodeHome, *, max_steps: int | None = None, max_seconds: float | None = None
) -> None:
    from swarmnode.ops.supervise import stop_on_signals
    from swarmnode.roles.common import net_config
    from swarmnode.roles.learner import LearnerNode
    from swarmnode.roles.worker import WorkerNode

    home = home.ensure()
    node: LearnerNode | WorkerNode
    if config.node.role == "learner":
        node = LearnerNode(config, home, max_steps=max_steps)
    else:
        node = WorkerNode(config, home, max_batches=max_steps)

    async def runtime() -> HivemindRuntime:
        return await HivemindRuntime.create(net_config(config, home))

    async def main() -> None:
        stop_on_signals(node.stop, max_seconds=max_seconds)
        await node.run(runtime)

    torch.set_grad_enabled(True)
    asyncio.run(main())
