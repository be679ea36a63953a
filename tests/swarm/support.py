"""Helpers for multi-process swarm tests: a bootstrap peer and node processes on 127.0.0.1.

Every process is started in its own session (process group) and stopped by
``LocalSwarm.close``: SIGINT, a deadline, then SIGKILL of the whole group, and
finally SIGKILL of any p2pd still holding one of the homes' libp2p identities
(p2pd runs in a process group of its own, see ``swarmnode.net.child_guard``).
Nothing here sleeps for a fixed time where a condition can be polled.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from swarmnode.config import load_config, render_commented_config
from swarmnode.errors import SwarmError
from swarmnode.home import NodeHome
from swarmnode.ops.status import fetch_status
from swarmnode.store import Ledger, RoundRecord
from swarmnode.store.atomic import atomic_write_text

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]
LISTEN = "/ip4/127.0.0.1/tcp/0"
START_TIMEOUT = 240.0  # generous: 2 shared cores, every process imports torch and loads a model
STOP_TIMEOUT = 30.0
POLL = 0.25


@dataclass
class Proc:
    """A process started in its own session; ``log`` has its stdout and stderr."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError as exc:
            return f"(no log: {exc})"

    def kill_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, sig)

    def wait_stopped(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """Wait for a process already sent SIGINT (a second SIGINT would abort its clean stop)."""
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill_group(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(10)
        self.kill_group(signal.SIGKILL)
        return self.popen.returncode

    def stop(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGINT (a clean stop: the node checkpoints), then SIGKILL of the group after ``timeout``."""
        if self.alive():
            self.kill_group(signal.SIGINT)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill_group(signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.popen.wait(10)
        # Anything left in the group (a child that ignored the parent's exit) goes too.
        self.kill_group(signal.SIGKILL)
        return self.popen.returncode


def spawn(name: str, args: list[str], log: Path) -> Proc:
    """``python ARGS`` from the repository root, in a new session, output appended to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    with open(log, "ab") as out:
        popen = subprocess.Popen(
            [sys.executable, *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
            start_new_session=True,  # own process group: cleanup can always kill it all
        )
    return Proc(name, popen, log)


# ---------------------------------------------------------------------------------- p2pd


def p2pd_socket_dir(identity_path: Path) -> str:
    """The private directory of p2pd's control sockets for this identity (hivemind_runtime)."""
    digest = hashlib.sha256(str(identity_path.resolve()).encode()).hexdigest()[:16]
    return str(Path(tempfile.gettempdir()) / f"swarmnode-p2p-{os.getuid()}-{digest}")


def p2pd_pids(identity_path: Path) -> list[int]:
    """Live p2pd processes whose control sockets are this identity's (whoever their parent is)."""
    marker = p2pd_socket_dir(identity_path)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if state != "Z" and argv and argv[0].endswith(b"p2pd") and marker.encode() in b" ".join(argv):
            found.append(int(entry.name))
    return found


def kill_pids(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------------------------- polling


def wait_until(
    check: Callable[[], T | None],
    timeout: float,
    what: str,
    *,
    procs: Sequence[Proc] = (),
    interval: float = POLL,
) -> T:
    """Poll ``check`` until it returns something other than None/False; fail naming ``what``.

    Fails early, with its log, when one of ``procs`` exits meanwhile.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value is not None and value is not False:
            return value
        for proc in procs:
            if not proc.alive():
                code = proc.popen.returncode
                raise AssertionError(
                    f"{proc.name} exited with {code} while waiting for {what}:\n{proc.tail()}"
                )
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name}\n{p.tail(1500)}" for p in procs)
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{tails}")
        time.sleep(interval)


def metric(status: dict[str, Any], name: str, label: str = "") -> float:
    return float(status.get("metrics", {}).get(name, {}).get(label, 0.0))


def summary(status: dict[str, Any]) -> dict[str, Any]:
    """The parts of a /status that swarm tests look at, for failure messages."""
    keys = ("rounds", "rounds_this_run", "policy_version", "admission", "external_by_sender", "peers")
    gossip = status.get("gossip", {})
    return {
        **{k: status.get(k) for k in keys},
        "gossip": {
            k: v
            for k, v in gossip.items()
            if v and k in ("items_corrupt", "bans", "pulls_failed", "rejected")
        },
        "external_used": metric(status, "groups_used", "source=external"),
    }


def ledger_rounds(home: NodeHome) -> list[RoundRecord]:
    with Ledger(home.ledger) as ledger:
        return ledger.rounds()


# ---------------------------------------------------------------------------------- swarm


class LocalSwarm:
    """A bootstrap peer and swarm nodes as processes under ``root``; ``close`` stops them all."""

    def __init__(self, root: Path, model: Path, *, round_seconds: float) -> None:
        self.root = root
        self.model = model
        self.round_seconds = round_seconds
        self.procs: dict[str, Proc] = {}
        self.homes: dict[str, NodeHome] = {}
        self.bootstrap_maddrs: list[str] = []
        self.extra_identities: list[Path] = []  # other processes' libp2p keys (e.g. an adversary)

    # -- processes -------------------------------------------------------------------------

    def start_bootstrap(self) -> list[str]:
        home = self.root / "bootstrap"
        ready = home / "ready.json"
        proc = spawn(
            "bootstrap",
            [
                "-m",
                "swarmnode.cli",
                "bootstrap",
                "--home",
                str(home),
                "--listen",
                LISTEN,
                "--ready-file",
                str(ready),
            ],
            home / "process.log",
        )
        self.procs["bootstrap"] = proc
        self.extra_identities.append(home / "p2p" / "libp2p.key")
        info = wait_until(
            lambda: json.loads(ready.read_text()) if ready.exists() else None,
            START_TIMEOUT,
            "the bootstrap peer",
            procs=[proc],
        )
        self.bootstrap_maddrs = list(info["maddrs"])
        return self.bootstrap_maddrs

    def write_node_config(self, name: str, seed: int, **overrides: Any) -> NodeHome:
        home = NodeHome(self.root / name).ensure()
        settings: dict[str, Any] = {
            "node.name": name,
            "node.seed": seed,
            "node.threads": 1,
            "model.path": str(self.model.resolve()),
            "tasks.heldout_size": 0,
            "rollout.prompts_per_round": 4,
            "rollout.group_size": 4,
            "swarm.mixing": "sapo",
            "swarm.initial_peers": self.bootstrap_maddrs,
            "swarm.round_seconds": self.round_seconds,
            "checkpoint.every_rounds": 1,
        }
        settings.update(overrides)
        config = load_config(None, environ={}, overrides=settings)
        atomic_write_text(home.config_file, render_commented_config(config))
        self.homes[name] = home
        return home

    def start_node(self, name: str) -> Proc:
        home = self.homes[name]
        (home.root / "api.port").unlink(missing_ok=True)
        proc = spawn(
            name, ["-m", "swarmnode.cli", "run", "--home", str(home.root)], home.root / "process.log"
        )
        self.procs[name] = proc
        return proc

    def start_process(self, name: str, args: list[str], home: Path, *, identity: Path) -> Proc:
        """Another process of the test (e.g. an adversary) whose p2pd uses ``identity``."""
        proc = spawn(name, args, home / "process.log")
        self.procs[name] = proc
        self.extra_identities.append(identity)
        return proc

    def node_names(self) -> list[str]:
        return list(self.homes)

    def libp2p_identity(self, name: str) -> Path:
        return self.homes[name].p2p / "libp2p.key"

    # -- observing -------------------------------------------------------------------------

    def status(self, name: str) -> dict[str, Any] | None:
        """The node's /status, or None while it is not answering."""
        if not self.procs[name].alive():
            return None
        try:
            return fetch_status(self.homes[name], timeout=5.0)
        except SwarmError:
            return None

    def statuses(self, names: list[str] | None = None) -> dict[str, dict[str, Any]] | None:
        """Every named node's /status, or None if any of them does not answer."""
        out = {}
        for name in names or self.node_names():
            status = self.status(name)
            if status is None:
                return None
            out[name] = status
        return out

    def wait(self, check: Callable[[], T | None], what: str, timeout: float = START_TIMEOUT) -> T:
        return wait_until(check, timeout, what, procs=list(self.procs.values()))

    def wait_statuses(
        self, accept: Callable[[dict[str, dict[str, Any]]], bool], what: str, timeout: float = START_TIMEOUT
    ) -> dict[str, dict[str, Any]]:
        last: list[dict[str, dict[str, Any]]] = []

        def check() -> dict[str, dict[str, Any]] | None:
            statuses = self.statuses()
            if statuses is not None:
                last[:] = [statuses]
            return statuses if statuses is not None and accept(statuses) else None

        try:
            return self.wait(check, what, timeout)
        except AssertionError as exc:
            seen = {n: summary(s) for n, s in last[0].items()} if last else "no status answered"
            raise AssertionError(f"{exc}\nlast statuses: {json.dumps(seen, indent=1)}") from None

    # -- teardown --------------------------------------------------------------------------

    def close(self) -> None:
        """Stop nodes (SIGINT, then SIGKILL), then the bootstrap; kill any p2pd left behind."""
        nodes = [p for n, p in self.procs.items() if n != "bootstrap"]
        for proc in nodes:
            if proc.alive():
                proc.kill_group(signal.SIGINT)  # all stop at once ...
        for proc in nodes:
            proc.wait_stopped()  # ... and only a node that does not stop in time is killed
        boot = self.procs.get("bootstrap")
        if boot is not None:
            boot.stop()
        keys = [self.libp2p_identity(n) for n in self.homes] + self.extra_identities
        for key in keys:
            kill_pids(p2pd_pids(key))


def write_atomic_json(path: Path, value: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)
