"""The one local swarm: a bootstrap peer and node processes on 127.0.0.1 under one directory.

Used by ``swarmnode swarm`` (``swarmnode.tools.launch``), the multi-process tests and ``bench/``.
``LocalSwarm.close`` stops everything it started: nodes SIGINT at once (each checkpoints), each
SIGKILLed only if it does not stop in time, then the bootstrap, and finally any p2pd still
holding one of the swarm's libp2p identities. Nothing here sleeps for a fixed time where a
condition can be polled.
"""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from swarmnode.config import load_config, render_commented_config
from swarmnode.errors import SwarmError
from swarmnode.home import NodeHome
from swarmnode.ops.status import fetch_status
from swarmnode.store import Ledger, RoundRecord
from swarmnode.store.atomic import atomic_write_text
from swarmnode.testing.p2pd import kill_p2pd_of
from swarmnode.testing.process import START_TIMEOUT, STOP_TIMEOUT, HarnessError, Proc, spawn, wait_until

T = TypeVar("T")
LISTEN = "/ip4/127.0.0.1/tcp/0"
HOOKED_NODE = "swarmnode.testing.hooked_node"  # ``swarmnode`` with an admission log
#: Node settings of a small, fast swarm (tests, benchmarks): one thread, 4 groups of 4, no held-out.
SMALL_NODE: Mapping[str, Any] = {
    "node.threads": 1,
    "tasks.heldout_size": 0,
    "rollout.prompts_per_round": 4,
    "rollout.group_size": 4,
    "swarm.mixing": "sapo",
    "checkpoint.every_rounds": 1,
}
#: What a small swarm's children add to the environment: one OpenMP thread each on a shared machine.
SMALL_ENV: Mapping[str, str] = {"OMP_NUM_THREADS": "1"}


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


class LocalSwarm:
    """A bootstrap peer and swarm nodes as processes under ``root``; ``close`` stops them all.

    ``node_settings`` are every node's config overrides (besides its name, seed, the model, the
    bootstrap and the round length); ``child_env`` is added to each child's environment.
    """

    def __init__(
        self,
        root: Path,
        model: Path,
        *,
        round_seconds: float,
        node_settings: Mapping[str, Any] = SMALL_NODE,
        child_env: Mapping[str, str] = SMALL_ENV,
        stop_timeout: float = STOP_TIMEOUT,
    ) -> None:
        self.root = root
        self.model = model
        self.round_seconds = round_seconds
        self.node_settings = dict(node_settings)
        self.child_env = dict(child_env)
        self.stop_timeout = stop_timeout
        self.procs: dict[str, Proc] = {}
        self.homes: dict[str, NodeHome] = {}
        self.bootstrap_maddrs: list[str] = []
        self.bootstrap_http: str | None = None  # the bootstrap's page and /status, once it is up
        self.extra_identities: list[Path] = []  # other processes' libp2p keys (e.g. an adversary)

    # -- processes -------------------------------------------------------------------------

    def spawn(
        self,
        name: str,
        args: Sequence[str],
        log: Path,
        *,
        env: Mapping[str, str] | None = None,
        prefix: Sequence[str] = (),
        ready_file: Path | None = None,
    ) -> Proc:
        """Start a child of this swarm (stopped by ``close``) with the swarm's environment.

        Every process of the swarm starts here: a subclass can change how (e.g. in a namespace)."""
        env = {**self.child_env, **(env or {})}
        proc = spawn(name, args, log, env=env, prefix=prefix, ready_file=ready_file)
        self.procs[name] = proc
        return proc

    def start_bootstrap(self, *, listen: str = LISTEN, timeout: float = START_TIMEOUT) -> list[str]:
        """Start the bootstrap peer and wait for its ready file; return its multiaddrs."""
        home = self.root / "bootstrap"
        ready = home / "ready.json"
        args = ["-m", "swarmnode.cli", "bootstrap", "--home", str(home), "--listen", listen]
        proc = self.spawn(
            "bootstrap", [*args, "--ready-file", str(ready)], home / "process.log", ready_file=ready
        )
        identity = home / "p2p" / "libp2p.key"
        if identity not in self.extra_identities:
            self.extra_identities.append(identity)
        info = wait_until(proc.ready, timeout, "the bootstrap peer", procs=[proc])
        self.bootstrap_maddrs = list(info["maddrs"])
        self.bootstrap_http = info.get("http_url")
        return self.bootstrap_maddrs

    def write_node_config(self, name: str, seed: int, **overrides: Any) -> NodeHome:
        home = NodeHome(self.root / name).ensure()
        settings: dict[str, Any] = {
            "node.name": name,
            "node.seed": seed,
            "model.path": str(self.model.resolve()),
            "swarm.initial_peers": self.bootstrap_maddrs,
            "swarm.round_seconds": self.round_seconds,
            **self.node_settings,
            **overrides,
        }
        config = load_config(None, environ={}, overrides=settings)
        atomic_write_text(home.config_file, render_commented_config(config))
        self.homes[name] = home
        return home

    def start_node(
        self, name: str, *, module: str = "swarmnode.cli", env: Mapping[str, str] | None = None
    ) -> Proc:
        """``python -m MODULE run --home HOME`` for ``name`` (``module``: the CLI, or ``HOOKED_NODE``)."""
        home = self.homes[name]
        (home.root / "api.port").unlink(missing_ok=True)  # a stale port would point at nothing
        return self.spawn(
            name, ["-m", module, "run", "--home", str(home.root)], home.root / "process.log", env=env
        )

    def start_hooked_node(
        self,
        name: str,
        fault_dir: Path,
        pauses: Mapping[str, float] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Proc:
        """``start_node`` under ``hooked_node``; its fault points mark their phases in ``fault_dir``."""
        hooks = {
            **(env or {}),
            "SWARMNODE_FAULT_DIR": str(fault_dir),
            "SWARMNODE_FAULT_PAUSE": ",".join(f"{k}={v}" for k, v in (pauses or {}).items()),
        }
        return self.start_node(name, module=HOOKED_NODE, env=hooks)

    def start_process(self, name: str, args: list[str], home: Path, *, identity: Path) -> Proc:
        """Another process of the swarm (e.g. an adversary) whose p2pd uses ``identity``."""
        proc = self.spawn(name, args, home / "process.log")
        self.extra_identities.append(identity)
        return proc

    def node_names(self) -> list[str]:
        return list(self.homes)

    def libp2p_identity(self, name: str) -> Path:
        return self.homes[name].p2p / "libp2p.key"

    # -- observing -------------------------------------------------------------------------

    def status(self, name: str) -> dict[str, Any] | None:
        """The node's /status, or None while it is not answering."""
        proc = self.procs.get(name)
        if proc is None or not proc.alive():
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

    def exited(self) -> list[Proc]:
        """The swarm's processes that are no longer running."""
        return [proc for proc in self.procs.values() if not proc.alive()]

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
        except HarnessError as exc:
            seen = {n: summary(s) for n, s in last[0].items()} if last else "no status answered"
            raise type(exc)(f"{exc}\nlast statuses: {json.dumps(seen, indent=1)}") from None

    # -- teardown --------------------------------------------------------------------------

    def close(self, bootstrap_timeout: float | None = None) -> None:
        """Stop nodes (SIGINT, then SIGKILL), then the bootstrap; kill any p2pd left behind."""
        nodes = [p for n, p in self.procs.items() if n != "bootstrap"]
        for proc in nodes:
            if proc.alive():
                proc.kill_group(signal.SIGINT)  # all stop at once ...
        for proc in nodes:
            proc.wait_stopped(self.stop_timeout)  # ... and only a node that does not stop in time is killed
        boot = self.procs.get("bootstrap")
        if boot is not None:
            boot.stop(self.stop_timeout if bootstrap_timeout is None else bootstrap_timeout)
        for proc in self.procs.values():
            if proc.killed:
                print(f"{proc.name} did not stop in time; killed it (log: {proc.log})", file=sys.stderr)
        for key in [self.libp2p_identity(n) for n in self.homes] + self.extra_identities:
            kill_p2pd_of(key)
