"""The learner and the worker honour ``model.engine`` and advertise their model's own family."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from swarmnode.config import Config, load_config
from swarmnode.errors import EngineUnavailable
from swarmnode.home import NodeHome
from swarmnode.policy import build_tiny_policy, save_policy
from swarmnode.roles.common import model_family
from swarmnode.roles.learner import LearnerNode
from swarmnode.roles.worker import WorkerNode
from swarmnode.rollout import HFEngine, TorchEngine

LEARNER_ID = "12D3KooWLearnerPeerIdForTests"


def config(role: str, **overrides: object) -> Config:
    base: dict[str, object] = {
        "node.role": role,
        "node.threads": 1,
        "model.warm_start": False,  # the tiny model with random weights: no warm start to wait for
        "rollout.prompts_per_round": 2,
        "rollout.group_size": 2,
        "rollout.max_new_tokens": 4,
        "tasks.heldout_size": 0,
        "worker.learner": LEARNER_ID if role == "worker" else "",
    }
    base.update(overrides)
    return load_config(None, environ={}, overrides=base)


def built(role: str, home: Path, **overrides: object) -> LearnerNode | WorkerNode:
    cfg = config(role, **overrides)
    node: LearnerNode | WorkerNode = (
        LearnerNode(cfg, NodeHome(home)) if role == "learner" else WorkerNode(cfg, NodeHome(home))
    )
    node._build()
    # What own_record reads from the network side, which these tests do not start.
    node.runtime = SimpleNamespace(peer_id="")  # type: ignore[assignment]
    node.dataplane = SimpleNamespace(address="127.0.0.1:9")  # type: ignore[assignment]
    return node


def engine_of(node: LearnerNode | WorkerNode) -> object:
    return node.trainer.engine if isinstance(node, LearnerNode) else node.engine


@pytest.mark.parametrize("role", ["learner", "worker"])
@pytest.mark.parametrize(("engine", "kind"), [("torch", TorchEngine), ("hf", HFEngine)])
def test_each_role_runs_the_engine_the_config_names(
    tmp_path: Path, role: str, engine: str, kind: type
) -> None:
    torch.manual_seed(0)
    node = built(role, tmp_path, **{"model.engine": engine})
    assert isinstance(engine_of(node), kind)


@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is not None and torch.cuda.is_available(), reason="vllm can run here"
)
@pytest.mark.parametrize("role", ["learner", "worker"])
def test_an_engine_that_cannot_run_fails_at_start_naming_the_key(tmp_path: Path, role: str) -> None:
    with pytest.raises(EngineUnavailable, match=rf"model\.engine = 'vllm' cannot run the {role} here"):
        built(role, tmp_path, **{"model.engine": "vllm"})


def test_the_family_is_the_models_own_type() -> None:
    assert model_family(build_tiny_policy(0)) == "llama"
    assert model_family(build_tiny_policy(0, {"model_type": "qwen2"})) == "qwen2"


@pytest.mark.parametrize("role", ["learner", "worker"])
def test_each_role_advertises_its_models_family(tmp_path: Path, role: str) -> None:
    model = tmp_path / "qwen2-tiny"
    save_policy(build_tiny_policy(0, {"model_type": "qwen2"}), model)
    node = built(role, tmp_path / "home", **{"model.path": str(model)})
    assert node.own_record().model_family == "qwen2"
