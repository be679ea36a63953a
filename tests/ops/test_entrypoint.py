"""The compose services' commands, run outside Docker on 127.0.0.1.

Each service's role and environment are read from docker/compose.yaml (plus the
image's ENV from docker/Dockerfile), then localized: container paths become
temporary directories, 0.0.0.0 and the private-network addresses become
127.0.0.1, fixed ports become free ones. The same docker/entrypoint.sh then runs
each role, and the services' own health checks (docker/healthcheck.py) judge them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from swarmnode.net.config import read_peers_file
from swarmnode.policy.model import build_tiny_policy, save_policy
from swarmnode.policy.warmstart import INFO_FILE, warm_start_dir
from swarmnode.tasks import default_mixture

from .support import (
    Service,
    base_env,
    compose,
    dockerfile_env,
    free_port,
    healthcheck,
    http_json,
    shim_bin,
    wait_until,
)

pytestmark = pytest.mark.network


class Localizer:
    """Maps the containers' addresses, ports and paths onto this machine."""

    def __init__(self, root: Path) -> None:
        services = compose()["services"]
        self.addresses = {
            str(s["networks"]["swarm"]["ipv4_address"]) for s in services.values() if "networks" in s
        }
        self.paths: dict[str, str] = {}
        self.root = root

    def mount(self, container_path: str, local: Path) -> None:
        local.mkdir(parents=True, exist_ok=True)
        self.paths[container_path] = str(local)

    def __call__(self, value: str, libp2p_port: int) -> str:
        for address in (*self.addresses, "0.0.0.0"):
            value = value.replace(f"/ip4/{address}/", "/ip4/127.0.0.1/")
        value = value.replace("/tcp/31337", f"/tcp/{libp2p_port}")
        for container_path, local in sorted(self.paths.items(), key=lambda kv: -len(kv[0])):
            if value == container_path or value.startswith(container_path + "/"):
                value = local + value[len(container_path) :]
        return value


def service_env(
    name: str, localize: Localizer, libp2p_port: int, home: str, base: dict[str, str]
) -> dict[str, str]:
    environ = {**dockerfile_env("Dockerfile"), **compose()["services"][name].get("environment", {})}
    out = {
        key: localize(str(value), libp2p_port)
        for key, value in environ.items()
        if key.startswith(("SWARMNODE_", "HF_"))
    }
    out["SWARMNODE_HOME"] = home
    if out.get("SWARMNODE_API__HOST") == "0.0.0.0":
        out["SWARMNODE_API__HOST"] = "127.0.0.1"  # loopback only in tests
    if "SWARMNODE_API__PORT" in out:
        out["SWARMNODE_API__PORT"] = str(free_port())
    return {**base, **out}


@dataclass
class Deployment:
    """The localized compose set-up: shared environment, mapped volumes, started services."""

    root: Path
    base: dict[str, str]
    localize: Localizer
    boot_home: Path
    models: Path
    started: list[Service]

    def start(self, name: str, env: dict[str, str]) -> Service:
        service = Service(compose()["services"][name]["command"], env, self.root / f"{name}.log")
        self.started.append(service)
        return service

    def start_bootstrap(self) -> tuple[Service, dict[str, str], int]:
        port = free_port()
        env = service_env("bootstrap", self.localize, port, str(self.boot_home), self.base)
        env["SWARMNODE_BOOTSTRAP_HTTP_PORT"] = str(free_port())
        return self.start("bootstrap", env), env, port


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    localize = Localizer(tmp_path)
    boot_home, models = tmp_path / "bootstrap-home", tmp_path / "models"
    localize.mount("/bootstrap", boot_home)  # nodes see the bootstrap's home here (read-only in compose)
    localize.mount(dockerfile_env("Dockerfile")["SWARMNODE_MODELS"], models)
    deployment = Deployment(tmp_path, base_env(shim_bin(tmp_path / "bin")), localize, boot_home, models, [])
    yield deployment
    for service in reversed(deployment.started):
        service.kill()


def seed_warm_start_cache(models: Path) -> Path:
    """Stand in for the minutes-long warm start: a cached result where warm_start looks first."""
    target = warm_start_dir(models, default_mixture(0), 0)
    save_policy(build_tiny_policy(0), target, extra_files={INFO_FILE: json.dumps({"seeded_by": "test"})})
    return target


def bootstrap_healthy(deployment: Deployment) -> tuple[Service, dict[str, str], int]:
    boot, env, port = deployment.start_bootstrap()
    check = compose()["services"]["bootstrap"]["healthcheck"]["test"]
    assert check[:2] == ["CMD", "swarmnode-healthcheck"]
    wait_until(lambda: healthcheck(check[2], env) == 0, 90, boot, "bootstrap health check")
    return boot, env, port


def test_the_bootstrap_service_passes_its_health_check_and_publishes_a_peers_file_nodes_read(
    deployment: Deployment,
) -> None:
    boot, env, port = bootstrap_healthy(deployment)

    peers = read_peers_file(deployment.boot_home / "peers.txt")
    assert len(peers) == 1 and peers[0].startswith(f"/ip4/127.0.0.1/tcp/{port}/p2p/")
    status = http_json(f"http://127.0.0.1:{env['SWARMNODE_BOOTSTRAP_HTTP_PORT']}/status")
    assert status["maddrs"] == peers
    assert boot.stop() == 0, boot.tail()  # `docker stop`: SIGTERM through tini, clean exit
    assert healthcheck("bootstrap", env) == 1


@pytest.mark.slow  # three interpreters importing torch: ~30 s on 2 busy cores
def test_prepare_model_bootstrap_and_a_node_run_as_compose_starts_them(deployment: Deployment) -> None:
    # prepare-model (the shared base model, linked as MODELS/current) and bootstrap start
    # together, as compose starts them; the nodes wait for both.
    target = seed_warm_start_cache(deployment.models)
    env = service_env(
        "prepare-model", deployment.localize, 0, str(deployment.root / "prepare"), deployment.base
    )
    prepare = deployment.start("prepare-model", env)
    boot, _, _ = bootstrap_healthy(deployment)
    assert prepare.proc.wait(120) == 0, prepare.tail()
    assert (deployment.models / "current").resolve() == target.resolve()

    # node-1, judged by the image's health check
    node_home = deployment.root / "node-1-home"
    env = service_env("node-1", deployment.localize, free_port(), str(node_home), deployment.base)
    assert env["SWARMNODE_SWARM__PEERS_FILE"] == str(deployment.boot_home / "peers.txt")
    assert env["SWARMNODE_MODEL__PATH"] == str(deployment.models / "current")
    node = deployment.start("node-1", env)
    wait_until(lambda: healthcheck("node", env) == 0, 180, node, "node health check")
    assert (node_home / "swarmnode.toml").is_file() and (node_home / "identity.key").is_file()
    status = http_json(f"http://127.0.0.1:{env['SWARMNODE_API__PORT']}/status")
    assert status["name"] == "node-1"
    assert status["peers"] >= 1  # the bootstrap, found through the peers file
    assert any(m.startswith("/ip4/127.0.0.1/") for m in status["maddrs"])

    # `docker stop`: SIGTERM through tini; both exit cleanly.
    assert node.stop() == 0, node.tail()
    assert boot.stop() == 0, boot.tail()
    assert healthcheck("node", env) == 1  # and the health check notices
