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


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[Service]]:
    services: list[Service] = []
    yield services
    for service in reversed(services):
        service.kill()


def seed_warm_start_cache(models: Path) -> Path:
    """Stand in for the minutes-long warm start: a cached result where warm_start looks first."""
    target = warm_start_dir(models, default_mixture(0), 0)
    save_policy(build_tiny_policy(0), target, extra_files={INFO_FILE: json.dumps({"seeded_by": "test"})})
    return target


def test_compose_roles_run_outside_docker_and_pass_their_own_health_checks(
    tmp_path: Path, started: list[Service]
) -> None:
    base = base_env(shim_bin(tmp_path / "bin"))
    image_env = dockerfile_env("Dockerfile")
    localize = Localizer(tmp_path)
    boot_home, models = tmp_path / "bootstrap-home", tmp_path / "models"
    localize.mount("/bootstrap", boot_home)  # nodes see the bootstrap's home here (read-only in compose)
    localize.mount(image_env["SWARMNODE_MODELS"], models)
    services = compose()["services"]

    # prepare-model: the shared base model, linked as MODELS/current.
    target = seed_warm_start_cache(models)
    env = service_env("prepare-model", localize, 0, str(tmp_path / "prepare-home"), base)
    prepare = Service(services["prepare-model"]["command"], env, tmp_path / "prepare.log")
    started.append(prepare)
    assert prepare.proc.wait(120) == 0, prepare.tail()
    assert (models / "current").resolve() == target.resolve()

    # bootstrap
    boot_port = free_port()
    env = service_env("bootstrap", localize, boot_port, str(boot_home), base)
    env["SWARMNODE_BOOTSTRAP_HTTP_PORT"] = str(free_port())
    boot = Service(services["bootstrap"]["command"], env, tmp_path / "bootstrap.log")
    started.append(boot)
    boot_check = services["bootstrap"]["healthcheck"]["test"]
    assert boot_check[:2] == ["CMD", "swarmnode-healthcheck"]
    wait_until(lambda: healthcheck(boot_check[2], env) == 0, 90, boot, "bootstrap health check")
    peers = read_peers_file(boot_home / "peers.txt")
    assert len(peers) == 1 and peers[0].startswith(f"/ip4/127.0.0.1/tcp/{boot_port}/p2p/")

    # node-1, with the image's health check
    node_home = tmp_path / "node-1-home"
    env = service_env("node-1", localize, free_port(), str(node_home), base)
    assert env["SWARMNODE_SWARM__PEERS_FILE"] == str(boot_home / "peers.txt")
    assert env["SWARMNODE_MODEL__PATH"] == str(models / "current")
    node = Service(services["node-1"]["command"], env, tmp_path / "node-1.log")
    started.append(node)
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
