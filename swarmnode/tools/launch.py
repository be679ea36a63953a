"""`swarmnode swarm`: a local swarm on loopback (one bootstrap peer, N nodes), as separate processes.

One combined live view (polled from each node's /status), a clean stop on
Ctrl-C or after ``--minutes``, and a per-node summary at the end (also written
to HOME/summary.json). Every node starts from the same warm-started tiny model
(as SAPO's agents share a base model), with its own seed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from swarmnode.config import load_config, render_commented_config
from swarmnode.errors import SwarmError
from swarmnode.home import NodeHome
from swarmnode.net.child_guard import die_with_parent
from swarmnode.ops.status import fetch_status
from swarmnode.store.atomic import atomic_write_text

READY_TIMEOUT = 120.0
STOP_TIMEOUT = 60.0


def _metric(status: dict[str, Any], name: str, label: str = "") -> float:
    return float(status.get("metrics", {}).get(name, {}).get(label, 0.0))


def _row(status: dict[str, Any] | None, name: str) -> list[str]:
    if status is None:
        return [name, "starting", "", "", "", "", "", "", ""]
    rejected = sum(
        status.get("admission", {}).get(k, 0) for k in status.get("admission", {}) if k != "accepted"
    )

    def f(value: Any, spec: str = ".3f") -> str:
        return "-" if value is None else format(value, spec)

    return [
        name,
        str(status["rounds_this_run"]),
        f(status["reward_first"]),
        f(status["reward_last"]),
        f(status["heldout_accuracy"]),
        str(int(_metric(status, "groups_published"))),
        str(int(_metric(status, "groups_accepted"))),
        str(int(_metric(status, "groups_used", "source=external"))),
        str(rejected),
    ]


HEADER = ["node", "rounds", "reward@1", "reward", "held-out", "shared", "received", "used", "rejected"]


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [HEADER, *rows]) for i in range(len(HEADER))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in [HEADER, *rows]]
    return "\n".join(lines)


class LocalSwarm:
    def __init__(self, root: Path, *, nodes: int, minutes: float, mixing: str, round_seconds: float) -> None:
        if nodes < 1:
            raise SwarmError("--nodes must be at least 1")
        self.root = root
        self.nodes = nodes
        self.minutes = minutes
        self.mixing = mixing
        self.round_seconds = round_seconds
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: list[IO[bytes]] = []

    # -------------------------------------------------------------- processes

    def _spawn(self, name: str, args: list[str], home: Path) -> subprocess.Popen[bytes]:
        home.mkdir(parents=True, exist_ok=True)
        log = open(home / "process.log", "ab")
        self.logs.append(log)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "swarmnode.cli", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # Ctrl-C reaches us; we stop the children in order
            preexec_fn=die_with_parent(),  # and if we die anyway, they get SIGTERM
        )
        self.procs[name] = proc
        return proc

    def _start_bootstrap(self) -> list[str]:
        home = self.root / "bootstrap"
        ready = home / "ready.json"
        ready.unlink(missing_ok=True)
        proc = self._spawn(
            "bootstrap",
            [
                "bootstrap",
                "--home",
                str(home),
                "--listen",
                "/ip4/127.0.0.1/tcp/0",
                "--ready-file",
                str(ready),
            ],
            home,
        )
        deadline = time.monotonic() + READY_TIMEOUT
        while not ready.exists():
            if proc.poll() is not None:
                raise SwarmError(f"bootstrap peer exited early; see {home / 'process.log'}")
            if time.monotonic() > deadline:
                raise SwarmError(
                    f"bootstrap peer not ready after {READY_TIMEOUT:.0f} s; see {home / 'process.log'}"
                )
            time.sleep(0.2)
        maddrs: list[str] = json.loads(ready.read_text())["maddrs"]
        return maddrs

    def _prepare_model(self) -> Path:
        from swarmnode.policy.warmstart import warm_start
        from swarmnode.tasks import default_mixture

        print("preparing the shared warm-started tiny model (cached after the first run)...", flush=True)
        return warm_start(
            self.root, default_mixture(0), 0, progress=lambda line: print("  " + line, flush=True)
        )

    def _write_node_config(self, index: int, model: Path, peers: list[str]) -> NodeHome:
        home = NodeHome(self.root / f"node-{index}").ensure()
        threads = max(1, (os.cpu_count() or 1) // self.nodes)
        config = load_config(
            None,
            environ={},
            overrides={
                "node.name": f"node-{index}",
                "node.seed": index,
                "node.threads": threads,
                "model.path": str(model.resolve()),
                "swarm.mixing": self.mixing,
                "swarm.initial_peers": peers,
                "swarm.round_seconds": self.round_seconds,
                "checkpoint.every_rounds": 5,
                # HACPO compares agents on the same prompts: share the task stream.
                "tasks.seed": 0 if self.mixing == "hacpo" else -1,
            },
        )
        atomic_write_text(home.config_file, render_commented_config(config))
        (home.root / "api.port").unlink(missing_ok=True)
        return home

    def _stop_all(self) -> None:
        # Finish the shutdown even if Ctrl-C is pressed again meanwhile.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            self._stop_children()
        finally:
            signal.signal(signal.SIGINT, previous)

    def _stop_children(self) -> None:
        nodes = [(n, p) for n, p in self.procs.items() if n != "bootstrap"]
        for _, proc in nodes:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + STOP_TIMEOUT
        for name, proc in nodes:
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"{name} did not stop in {STOP_TIMEOUT:.0f} s; killing it", file=sys.stderr)
                proc.kill()
                proc.wait(timeout=10)
        boot = self.procs.get("bootstrap")
        if boot is not None and boot.poll() is None:
            boot.send_signal(signal.SIGINT)
            try:
                boot.wait(timeout=20)
            except subprocess.TimeoutExpired:
                boot.kill()
                boot.wait(timeout=10)
        for log in self.logs:
            log.close()

    # -------------------------------------------------------------- run

    def _poll(self, homes: list[NodeHome]) -> list[dict[str, Any] | None]:
        out: list[dict[str, Any] | None] = []
        for home in homes:
            try:
                out.append(fetch_status(home, timeout=2.0))
            except SwarmError:
                out.append(None)
        return out

    def run(self) -> int:
        def interrupt(signum: int, frame: object) -> None:
            raise KeyboardInterrupt  # SIGTERM / SIGHUP stop the swarm like Ctrl-C does

        signal.signal(signal.SIGTERM, interrupt)
        signal.signal(signal.SIGHUP, interrupt)
        self.root.mkdir(parents=True, exist_ok=True)
        model = self._prepare_model()
        homes: list[NodeHome] = []
        statuses: list[dict[str, Any] | None] = []
        interrupted = False
        try:
            peers = self._start_bootstrap()
            print(f"bootstrap peer: {peers[0]}", flush=True)
            for i in range(self.nodes):
                home = self._write_node_config(i, model, peers)
                homes.append(home)
                self._spawn(f"node-{i}", ["run", "--home", str(home.root)], home.root)
            print(
                f"{self.nodes} nodes started (mixing {self.mixing}, {self.round_seconds:g} s rounds); "
                f"logs in {self.root}/*/process.log; Ctrl-C stops cleanly",
                flush=True,
            )
            deadline = time.monotonic() + self.minutes * 60
            tty = sys.stdout.isatty()
            last_print = 0.0
            while time.monotonic() < deadline:
                for name, proc in self.procs.items():
                    if proc.poll() is not None:
                        raise SwarmError(f"{name} exited with code {proc.returncode}; see its process.log")
                statuses = self._poll(homes)
                table = _table([_row(s, f"node-{i}") for i, s in enumerate(statuses)])
                left = deadline - time.monotonic()
                if tty:
                    sys.stdout.write(
                        "\x1b[H\x1b[J" + f"swarmnode local swarm  ({left:4.0f} s left)\n\n" + table + "\n"
                    )
                    sys.stdout.flush()
                elif time.monotonic() - last_print >= 15:
                    print(f"--- {left:4.0f} s left\n{table}", flush=True)
                    last_print = time.monotonic()
                time.sleep(2.0)
        except KeyboardInterrupt:
            interrupted = True
            print("\nstopping the swarm...", flush=True)
        finally:
            try:
                final = self._poll(homes) if homes else []
                statuses = [f or s for f, s in zip(final, statuses or final, strict=False)] or final
            except KeyboardInterrupt:
                pass  # a second Ctrl-C: skip the last poll, still stop everything below
            finally:
                self._stop_all()
        summary = {
            "nodes": [
                {
                    "node": f"node-{i}",
                    "rounds": s["rounds_this_run"] if s else 0,
                    "reward_start": s["reward_first"] if s else None,
                    "reward_end": s["reward_last"] if s else None,
                    "heldout_accuracy": s["heldout_accuracy"] if s else None,
                    "groups_shared": _metric(s, "groups_published") if s else 0,
                    "groups_received": _metric(s, "groups_accepted") if s else 0,
                    "groups_used": _metric(s, "groups_used", "source=external") if s else 0,
                    "rejections": s.get("admission", {}) if s else {},
                }
                for i, s in enumerate(statuses)
            ],
            "interrupted": interrupted,
        }
        where = str(self.root / "summary.json")
        try:
            atomic_write_text(self.root / "summary.json", json.dumps(summary, indent=1))
        except OSError as exc:
            where = f"not written: {exc}"
        print(f"\nsummary ({where}):")
        print(_table([_row(s, f"node-{i}") for i, s in enumerate(statuses)]))
        return 0
