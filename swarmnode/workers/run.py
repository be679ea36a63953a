"""``swarmnode run --role learner|worker``: build the role, run it until a signal, stop cleanly.

A first SIGINT/SIGTERM stops after the step (learner) or batch (worker) in progress; a
second aborts at once (the learner's last checkpoint stays its resume point).

Also what both roles take from the config and the model the same way: the rollout engine
(``model.engine``, through the factory the trainer node and ``swarmnode train`` use) and the
model family they advertise in their PeerRecord (the model's own ``model_type``).
"""

from __future__ import annotations

import asyncio
import signal

import torch

from swarmnode.config import Config
from swarmnode.errors import EngineUnavailable
from swarmnode.home import NodeHome
from swarmnode.net.hivemind_runtime import HivemindRuntime
from swarmnode.policy import Policy
from swarmnode.rollout import RolloutEngine, make_engine


def role_engine(config: Config, policy: Policy) -> RolloutEngine:
    """The rollout engine ``model.engine`` names, serving ``policy`` (``rollout.make_engine``).

    Every engine runs for both roles: a learner uses it for held-out evaluation and keeps it in step
    with each new version; a worker generates with it and loads each received version into it. One
    that cannot run here fails at start, naming the key and its value.
    """
    try:
        return make_engine(config.model.engine, policy)
    except EngineUnavailable as exc:
        raise EngineUnavailable(
            f"model.engine = {config.model.engine!r} cannot run the {config.node.role} here: {exc}"
        ) from exc


def model_family(policy: Policy) -> str:
    """The family a PeerRecord advertises: the model's HF ``model_type`` ("llama", "qwen2", ...)."""
    return str(getattr(getattr(policy.model, "config", None), "model_type", "") or "")


def run_role(
    config: Config, home: NodeHome, *, max_steps: int | None = None, max_seconds: float | None = None
) -> None:
    from swarmnode.node import net_config
    from swarmnode.workers.learner import LearnerNode
    from swarmnode.workers.worker import WorkerNode

    home = home.ensure()
    node: LearnerNode | WorkerNode
    if config.node.role == "learner":
        node = LearnerNode(config, home, max_steps=max_steps)
    else:
        node = WorkerNode(config, home, max_batches=max_steps)

    async def runtime() -> HivemindRuntime:
        return await HivemindRuntime.create(net_config(config, home))

    async def main() -> None:
        loop = asyncio.get_running_loop()
        current = asyncio.current_task()

        def on_signal() -> None:
            if node.stop.is_set() and current is not None:
                current.cancel()
            node.stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        if max_seconds is not None:
            loop.call_later(max_seconds, node.stop.set)
        await node.run(runtime)

    torch.set_grad_enabled(True)
    asyncio.run(main())
