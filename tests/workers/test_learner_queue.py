"""A worker that fails a spot check loses its groups still waiting for a step (#20): none of them
was checked, and they came from a worker just caught sending what it did not sample."""

from __future__ import annotations

from pathlib import Path

from swarmnode.roles.learner import Arrival, LearnerNode
from swarmnode.tasks import default_mixture
from swarmnode.train import ScoredGroup

from .test_role_engine import built


def group(index: int) -> ScoredGroup:
    task = default_mixture(0).sample(index, 1)[0]
    return ScoredGroup(task, [1], [[2]], [[-0.5]], ["x"], [0.0], policy_version=0)


def test_a_worker_that_fails_a_check_loses_its_queued_groups_and_no_one_else_does(tmp_path: Path) -> None:
    node = built("learner", tmp_path)
    assert isinstance(node, LearnerNode)
    for i, sender in enumerate(["honest", "cheat", "honest", "cheat", "other"]):
        node.queue.append(Arrival(group(i), sender, float(i)))
    node._drop_queued("cheat")
    assert [a.worker for a in node.queue] == ["honest", "honest", "other"]  # in their order
    assert node.metrics.snapshot()["unverified_dropped"] == {"": 2.0}
    node._drop_queued("nobody")  # nothing queued: nothing counted
    assert node.metrics.snapshot()["unverified_dropped"] == {"": 2.0}
