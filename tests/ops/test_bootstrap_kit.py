"""bootstrap/: the systemd unit, its example settings and the peers-file example.

The unit is checked by `systemd-analyze verify` and `systemd-analyze security --offline`
where systemd-analyze is installed (it is not run under systemd here), and always by
reading its sections and by handing its command line to the bootstrap's own parser.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from swarmnode.net.config import NetConfig, read_peers_file
from swarmnode.roles.bootstrap import _parse_args

from .support import BOOTSTRAP_KIT

UNIT = BOOTSTRAP_KIT / "swarmnode-bootstrap.service"
ENV_EXAMPLE = BOOTSTRAP_KIT / "bootstrap.env.example"
HOME = "/var/lib/swarmnode-bootstrap"


def unit_sections(path: Path = UNIT) -> dict[str, list[tuple[str, str]]]:
    """Section -> (key, value) pairs in order; systemd allows a key more than once."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        assert current is not None, f"key outside a section: {line}"
        key, sep, value = line.partition("=")
        assert sep, f"not a key=value line: {line}"
        current.append((key.strip(), value.strip()))
    return sections


def service() -> dict[str, str]:
    """[Service] keys, the last value winning (Environment= collected separately)."""
    return {k: v for k, v in unit_sections()["Service"] if k != "Environment"}


def environment() -> dict[str, str]:
    """Environment= defaults, then the example EnvironmentFile on top (systemd's order)."""
    env: dict[str, str] = {}
    for key, value in unit_sections()["Service"]:
        if key == "Environment":
            for item in shlex.split(value):
                name, _, setting = item.partition("=")
                env[name] = setting
    for raw in ENV_EXAMPLE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            name, _, setting = line.partition("=")
            env[name.strip()] = setting.strip()
    return env


def exec_start_argv() -> list[str]:
    """ExecStart as systemd expands it: ${VAR} is one argument, a bare $VAR splits on whitespace."""
    env = environment()
    argv = []
    for word in service()["ExecStart"].split():
        braced = re.fullmatch(r"\$\{(\w+)\}", word)
        bare = re.fullmatch(r"\$(\w+)", word)
        if braced:
            argv.append(env[braced.group(1)])
        elif bare:
            argv.extend(env[bare.group(1)].split())
        else:
            argv.append(word)
    return argv


def test_the_unit_restarts_on_failure_with_a_start_limit() -> None:
    assert service()["Restart"] == "on-failure"
    assert int(service()["RestartSec"]) > 0
    unit = dict(unit_sections()["Unit"])
    assert int(unit["StartLimitBurst"]) >= 1 and "network-online.target" in unit["After"]
    assert dict(unit_sections()["Install"])["WantedBy"] == "multi-user.target"


def test_the_unit_runs_unprivileged_with_only_its_state_directory_writable() -> None:
    s = service()
    assert s["User"] not in ("", "root")
    assert s["NoNewPrivileges"] == "yes"
    assert s["ProtectSystem"] == "strict"
    assert s["ReadWritePaths"] == HOME
    assert f"/var/lib/{s['StateDirectory']}" == HOME and s["StateDirectoryMode"] == "0700"
    for key in ("PrivateTmp", "ProtectHome", "PrivateDevices", "ProtectKernelModules", "RestrictSUIDSGID"):
        assert s[key] == "yes", key
    assert s["CapabilityBoundingSet"] == ""
    assert s["KillMode"] == "mixed"  # SIGTERM to the daemon, which stops p2pd in order


def test_the_unit_command_line_is_accepted_by_the_bootstrap_parser() -> None:
    argv = exec_start_argv()
    assert argv[0].endswith("/swarmnode") and argv[1] == "bootstrap"
    args = _parse_args(argv[2:])
    assert str(args.home) == HOME
    assert args.http_host == "127.0.0.1"  # the status endpoint stays local
    assert args.http_port == 8700
    NetConfig(host_maddrs=tuple(args.listen), announce_maddrs=tuple(args.announce)).check()


def test_the_example_peers_file_is_read_as_nodes_read_it() -> None:
    peers = read_peers_file(BOOTSTRAP_KIT / "peers.example.txt")
    assert len(peers) == 2
    assert all("/p2p/" in p for p in peers)


@pytest.fixture
def verifiable_unit(tmp_path: Path) -> Path:
    """The unit with ExecStart pointing at an executable that exists here (verify checks it)."""
    program = tmp_path / "swarmnode"
    program.write_text("#!/bin/sh\nexit 0\n")
    program.chmod(0o755)
    text = UNIT.read_text(encoding="utf-8").replace("/opt/swarmnode/venv/bin/swarmnode", str(program))
    unit = tmp_path / UNIT.name
    unit.write_text(text, encoding="utf-8")
    return unit


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verifies_the_unit(verifiable_unit: Path) -> None:
    done = subprocess.run(
        ["systemd-analyze", "verify", str(verifiable_unit)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == ""


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_rates_the_unit_exposure_low(verifiable_unit: Path) -> None:
    done = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", str(verifiable_unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+)", done.stdout)
    assert match, done.stdout + done.stderr
    assert float(match.group(1)) <= 2.0  # systemd's scale: 0 (locked down) .. 10 (exposed)
