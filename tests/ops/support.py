"""Helpers for the ops tests: read the Docker files, and run their commands outside Docker."""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
BOOTSTRAP_KIT = REPO / "bootstrap"


@functools.cache
def compose() -> dict[str, Any]:
    """docker/compose.yaml, parsed once (callers must not modify it)."""
    document = yaml.safe_load((DOCKER / "compose.yaml").read_text(encoding="utf-8"))
    assert isinstance(document, dict)
    return document


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case, e.g. "RUN"
    args: str
    line: int


def dockerfile(name: str) -> list[Instruction]:
    """Instructions of ``docker/<name>``: continuation lines joined, comments and blanks dropped."""
    out: list[Instruction] = []
    pending = ""
    start = 0
    for number, raw in enumerate((DOCKER / name).read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        text = pending + line
        pending = ""
        keyword, _, args = text.partition(" ")
        out.append(Instruction(keyword.upper(), args.strip(), start))
    return out


def dockerfile_env(name: str) -> dict[str, str]:
    """ENV settings of a Dockerfile (``KEY=value`` pairs; later ones win)."""
    env: dict[str, str] = {}
    for instruction in dockerfile(name):
        if instruction.keyword == "ENV":
            for pair in shlex.split(instruction.args):
                key, _, value = pair.partition("=")
                env[key] = value
    return env


def exec_form(args: str) -> list[str]:
    """A JSON-array instruction argument (CMD, ENTRYPOINT, the CMD of a HEALTHCHECK)."""
    match = re.search(r"\[.*\]", args)
    assert match, f"not in exec form: {args}"
    value = json.loads(match.group(0))
    assert isinstance(value, list)
    return [str(v) for v in value]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def shim_bin(directory: Path) -> Path:
    """``swarmnode``, ``swarmnode-healthcheck`` and ``python`` as the image has them on PATH.

    The checkout may not be pip-installed, so ``swarmnode`` runs ``python -m swarmnode.cli``.
    """
    directory.mkdir(parents=True, exist_ok=True)
    scripts = {
        "swarmnode": f'exec "{sys.executable}" -m swarmnode.cli "$@"',
        "swarmnode-healthcheck": f'exec "{sys.executable}" "{DOCKER / "healthcheck.py"}" "$@"',
        "python": f'exec "{sys.executable}" "$@"',
    }
    for name, body in scripts.items():
        path = directory / name
        path.write_text(f"#!/bin/sh\n{body}\n", encoding="utf-8")
        path.chmod(0o755)
    return directory


def base_env(bin_dir: Path) -> dict[str, str]:
    return {
        "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
        "PYTHONPATH": str(REPO),
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HOME": os.environ.get("HOME", "/tmp"),
        "TMPDIR": os.environ.get("TMPDIR", "/tmp"),
    }


class Service:
    """One entrypoint role started as its own process group, always killed at the end."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                ["sh", str(DOCKER / "entrypoint.sh"), *args],
                env=env,
                cwd=log.parent,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 90.0) -> int:
        """SIGTERM (what `docker stop` sends through tini), then wait; SIGKILL if it hangs."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return int(self.proc.returncode)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def healthcheck(role: str, env: dict[str, str]) -> int:
    done = subprocess.run(
        [sys.executable, str(DOCKER / "healthcheck.py"), role],
        env=env,
        capture_output=True,
        timeout=30,
    )
    return done.returncode


def wait_until(predicate: Any, timeout: float, service: Service, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if not service.running():
            raise AssertionError(f"{what}: the service exited ({service.proc.returncode}):\n{service.tail()}")
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout:.0f} s:\n{service.tail()}")


def http_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())
