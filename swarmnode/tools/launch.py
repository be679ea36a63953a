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
import sys
import time
from pathlib import Path
from typing import Any

from swarmnode.errors import SwarmError
from swarmnode.home import NodeHome
from swarmnode.ops.status import fetch_status
from swarmnode.store.atomic import atomic_write_text
from swarmnode.testing import swarm as harness

READY_TIMEOUT = 120.0
STOP_TIMEOUT = 60.0
BOOTSTRAP_STOP_TIMEOUT = 20.0


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


class SwarmDemo:
    """The demo: a ``swarmnode.testing.LocalSwarm`` of ``nodes`` nodes, watched for ``minutes``.

    Its processes are started, awaited and stopped by the package's one process harness."""

    def __init__(self, root: Path, *, nodes: int, minutes: float, mixing: str, round_seconds: float) -> None:
        if nodes < 1:
            raise SwarmError("--nodes must be at least 1")
        self.root = root
        self.nodes = nodes
        self.minutes = minutes
        self.mixing = mixing
        self.round_seconds = round_seconds
        self.swarm: harness.LocalSwarm | None = None

    # -------------------------------------------------------------- processes

    def _prepare_model(self) -> Path:
        from swarmnode.policy.warmstart import warm_start
        from swarmnode.tasks import default_mixture

        print("preparing the shared warm-started tiny model (cached after the first run)...", flush=True)
        return warm_start(
            self.root, default_mixture(0), 0, progress=lambda line: print("  " + line, flush=True)
        )

    def _node_settings(self) -> dict[str, Any]:
        return {
            "node.threads": max(1, (os.cpu_count() or 1) // self.nodes),
            "swarm.mixing": self.mixing,
            "checkpoint.every_rounds": 5,
            # HACPO and the joint rule compare agents on the same prompts: share the task stream.
            "tasks.seed": 0 if self.mixing in ("hacpo", "joint") else -1,
        }

    def _stop_all(self) -> None:
        # Finish the shutdown even if Ctrl-C is pressed again meanwhile.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            if self.swarm is not None:
                self.swarm.close(bootstrap_timeout=BOOTSTRAP_STOP_TIMEOUT)
        finally:
            signal.signal(signal.SIGINT, previous)

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
        # The children inherit this environment as it is (no test settings): node.threads sets torch's.
        swarm = harness.LocalSwarm(
            self.root,
            model,
            round_seconds=self.round_seconds,
            node_settings=self._node_settings(),
            child_env={},
            stop_timeout=STOP_TIMEOUT,
        )
        self.swarm = swarm
        homes: list[NodeHome] = []
        statuses: list[dict[str, Any] | None] = []
        interrupted = False
        try:
            peers = swarm.start_bootstrap(timeout=READY_TIMEOUT)
            print(f"bootstrap peer: {peers[0]}", flush=True)
            for i in range(self.nodes):
                homes.append(swarm.write_node_config(f"node-{i}", i))
                swarm.start_node(f"node-{i}")
            print(
                f"{self.nodes} nodes started (mixing {self.mixing}, {self.round_seconds:g} s rounds); "
                f"logs in {self.root}/*/process.log; Ctrl-C stops cleanly",
                flush=True,
            )
            deadline = time.monotonic() + self.minutes * 60
            tty = sys.stdout.isatty()
            last_print = 0.0
            while time.monotonic() < deadline:
                for proc in swarm.exited():
                    raise SwarmError(f"{proc.name} exited with code {proc.popen.returncode}; see {proc.log}")
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
