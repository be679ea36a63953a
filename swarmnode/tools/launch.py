"""`swarmnode swarm`: a local swarm on loopback (one bootstrap peer, N nodes), as separate processes.

The nodes are specialists (#14): node i starts from the tiny model warm-started on one family of
``SPECIALIST_FAMILIES`` alone (add, sub, mul, then dec), and every node trains on the union of the
families in play, answering the same prompts each round, so what a node learns of its peers'
families it can only learn from their rollouts. ``--mixing`` picks the sharing rule (default
``replay``, the best of the specialists testbed); ``--mixing none`` is the control: the same
swarm, gossip included, with every node ignoring its peers' groups.

One combined live view (polled from each node's /status: held-out accuracy on the node's own family
and on its peers', start -> now), a clean stop on Ctrl-C or after ``--minutes``, and at the end
HOME/summary.json (per node and family) and HOME/learning.png (accuracy per family over time, one
line per node, from each node's ledger).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from swarmnode.errors import SwarmError
from swarmnode.home import NodeHome
from swarmnode.ops.api import ThreadedApiServer
from swarmnode.ops.status import fetch_status
from swarmnode.roles.common import BUILTIN_CHAT_MAX_NEW_TOKENS
from swarmnode.store.atomic import atomic_write_text
from swarmnode.tasks import SPECIALIST_FAMILIES, DatasetSpec
from swarmnode.testing import swarm as harness
from swarmnode.tools.swarm_page import SwarmPage

READY_TIMEOUT = 120.0
STOP_TIMEOUT = 60.0
BOOTSTRAP_STOP_TIMEOUT = 20.0
MARKER = ".swarm-demo"  # in each node home the demo made (and so may remove on its next run)
HELDOUT_PER_FAMILY = 100  # greedy held-out tasks per family, evaluated every 10 rounds
#: The specialists testbed's settings (simulations/scenarios/specialists.toml, J = 8: #14's sweep).
DEMO_SETTINGS: dict[str, Any] = {
    "rollout.prompts_per_round": 8,
    "rollout.group_size": 8,
    "rollout.max_new_tokens": 6,
    "swarm.local_groups": 4,
    "swarm.external_groups": 8,
    "tasks.seed": 0,  # every node answers the same prompts each round, as in the testbed
    "checkpoint.every_rounds": 10,
}


def _metric(status: dict[str, Any], name: str, label: str = "") -> float:
    return float(status.get("metrics", {}).get(name, {}).get(label, 0.0))


#: A node that got less than this share of the groups its peers shared is named at the end: in a
#: loopback swarm every share is 99.8-100% (the last round's batches may still be in flight).
DELIVERY_WARNING_SHARE = 0.95
#: The gossip counters a low share is explained by (``GossipStats``), copied into summary.json.
GOSSIP_HEALTH = (
    "pulls_failed",
    "pulls_timed_out",
    "pulls_refused",
    "peers_shunned",
    "peers_paused",
    "admission_timeouts",
)


def delivery_warnings(nodes: list[dict[str, Any]]) -> list[str]:
    """A line for each node (``SwarmDemo._node_summary`` records) that received less than
    ``DELIVERY_WARNING_SHARE`` of the groups its peers shared, with the gossip counters that say
    why. (A node once got 82% for minutes unnoticed: charged pull failures had made it stop
    pulling from one peer.)"""
    lines = []
    for node in nodes:
        expected = sum(other["groups_shared"] for other in nodes if other is not node)
        received = node["groups_received"]
        if expected <= 0 or received >= DELIVERY_WARNING_SHARE * expected:
            continue
        counters = ", ".join(f"{k} {v}" for k, v in node.get("gossip", {}).items() if v)
        lines.append(
            f"warning: {node['node']} received {received / expected:.0%} of the groups its peers shared "
            f"({received:,.0f} of {expected:,.0f}); its gossip counters: {counters or 'none set'} "
            "(peers_shunned: a peer it stopped pulling from for 10 minutes after 3 charged rejections)"
        )
    return lines


def _family_means(status: dict[str, Any], own: str, key: str) -> tuple[float | None, float | None]:
    """(own family's, mean of the other families') held-out accuracy in ``status[key]``."""
    by_family: dict[str, float] = status.get(key) or {}
    others = [v for f, v in by_family.items() if f != own]
    return by_family.get(own), (sum(others) / len(others) if others else None)


def _row(status: dict[str, Any] | None, name: str, family: str) -> list[str]:
    if status is None:
        return [name, family, "starting", "", "", "", "", "", ""]
    rejected = sum(
        status.get("admission", {}).get(k, 0) for k in status.get("admission", {}) if k != "accepted"
    )

    def f(value: Any, spec: str = ".2f") -> str:
        return "-" if value is None else format(value, spec)

    own0, peers0 = _family_means(status, family, "heldout_first_by_family")
    own, peers = _family_means(status, family, "heldout_by_family")
    return [
        name,
        family,
        str(status["rounds_this_run"]),
        f"{f(own0)} -> {f(own)}",
        f"{f(peers0)} -> {f(peers)}",
        str(int(_metric(status, "groups_published"))),
        str(int(_metric(status, "groups_accepted"))),
        str(int(_metric(status, "groups_used", "source=external"))),
        str(rejected),
    ]


HEADER = [
    "node",
    "family",
    "rounds",
    "own family",
    "peers' families",
    "shared",
    "received",
    "used",
    "rejected",
]


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [HEADER, *rows]) for i in range(len(HEADER))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in [HEADER, *rows]]
    return "\n".join(lines)


def _dataset_entry(spec: DatasetSpec) -> dict[str, Any]:
    """``spec`` as a ``[[tasks.datasets]]`` table."""
    return {
        "name": spec.name,
        "config": dict(spec.config),
        "weight": spec.weight,
        "prompt_format": spec.prompt_format,
        "label": spec.label,
    }


class SwarmDemo:
    """The demo: a ``swarmnode.testing.LocalSwarm`` of ``nodes`` specialist nodes, watched for ``minutes``.

    Its processes are started, awaited and stopped by the package's one process harness."""

    def __init__(
        self,
        root: Path,
        *,
        nodes: int,
        minutes: float,
        mixing: str,
        round_seconds: float,
        page_port: int = 0,
        model: str = "tiny",
    ) -> None:
        if nodes < 1:
            raise SwarmError("--nodes must be at least 1")
        if not minutes > 0:
            raise SwarmError(f"--minutes must be > 0, got {minutes}")
        self.root = root
        self.nodes = nodes
        self.minutes = minutes
        self.mixing = mixing
        self.round_seconds = round_seconds
        self.page_port = page_port
        if model not in ("tiny", "chat"):
            raise SwarmError(f"--model must be tiny or chat, got {model!r}")
        self.model = model
        self.page_server: ThreadedApiServer | None = None
        #: the families in play: one per node, up to the four of SPECIALIST_FAMILIES
        self.families = list(SPECIALIST_FAMILIES[: min(nodes, len(SPECIALIST_FAMILIES))])
        self.swarm: harness.LocalSwarm | None = None

    def family_of(self, node: int) -> str:
        return self.families[node % len(self.families)].label

    # -------------------------------------------------------------- processes

    def _prepare_models(self) -> dict[str, Path]:
        """Each family's specialist: the built-in model (``--model``) warm-started on that family
        alone (cached)."""
        from swarmnode.policy.warmstart import SPECIALIST_WARM_START, warm_start
        from swarmnode.tasks import TaskMixture

        models = {}
        for spec in self.families:
            print(f"warm start of the {spec.label} specialist (cached after the first run)...", flush=True)
            models[spec.label] = warm_start(
                self.root,
                TaskMixture([spec], 0),
                0,
                progress=lambda line: print("  " + line, flush=True),
                settings=SPECIALIST_WARM_START,
                builtin=self.model,  # type: ignore[arg-type]  # checked in __init__
            )
        return models

    def _clear_previous_nodes(self) -> None:
        """A run starts its nodes fresh: the node homes an earlier run made here (marked) are removed,
        so a control run (``--mixing none``) never resumes the policies of a sharing run. The
        warm-start cache (HOME/models) stays. A ``node-i`` directory without the mark is not ours:
        refuse rather than delete it."""
        for home in sorted(self.root.glob("node-*")):
            if (home / MARKER).is_file():
                shutil.rmtree(home)
                print(f"removed the previous run's {home.name} (each run starts its nodes fresh)", flush=True)
        for i in range(self.nodes):
            if (self.root / f"node-{i}").exists():
                raise SwarmError(
                    f"{self.root / f'node-{i}'} exists and was not made by this version's `swarmnode swarm`; "
                    "remove it or use another --home"
                )

    def _node_settings(self) -> dict[str, Any]:
        return {
            **DEMO_SETTINGS,
            # The chat model answers inside <answer></answer> through its chat template.
            **({"rollout.max_new_tokens": BUILTIN_CHAT_MAX_NEW_TOKENS} if self.model == "chat" else {}),
            "node.threads": max(1, (os.cpu_count() or 1) // self.nodes),
            "swarm.mixing": self.mixing,
            "tasks.datasets": [_dataset_entry(spec) for spec in self.families],
            "tasks.heldout_size": HELDOUT_PER_FAMILY * len(self.families),
        }

    def _stop_all(self) -> None:
        # Finish the shutdown even if Ctrl-C is pressed again meanwhile.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            if self.page_server is not None:
                self.page_server.stop()
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

    def _rows(self, statuses: list[dict[str, Any] | None]) -> list[list[str]]:
        return [_row(s, f"node-{i}", self.family_of(i)) for i, s in enumerate(statuses)]

    def run(self) -> int:
        def interrupt(signum: int, frame: object) -> None:
            raise KeyboardInterrupt  # SIGTERM / SIGHUP stop the swarm like Ctrl-C does

        signal.signal(signal.SIGTERM, interrupt)
        signal.signal(signal.SIGHUP, interrupt)
        t0 = time.monotonic()
        self.root.mkdir(parents=True, exist_ok=True)
        self._clear_previous_nodes()
        models = self._prepare_models()
        warm_seconds = time.monotonic() - t0
        # The children inherit this environment as it is (no test settings): node.threads sets torch's.
        swarm = harness.LocalSwarm(
            self.root,
            models[self.family_of(0)],
            round_seconds=self.round_seconds,
            node_settings=self._node_settings(),
            child_env={},
            stop_timeout=STOP_TIMEOUT,
        )
        self.swarm = swarm
        homes: list[NodeHome] = []
        statuses: list[dict[str, Any] | None] = []
        interrupted = False
        started = time.time()
        try:
            peers = swarm.start_bootstrap(timeout=READY_TIMEOUT)
            print(f"bootstrap peer: {peers[0]}", flush=True)
            for i in range(self.nodes):
                model = str(models[self.family_of(i)].resolve())
                homes.append(swarm.write_node_config(f"node-{i}", i, **{"model.path": model}))
                (homes[-1].root / MARKER).write_text("made by swarmnode swarm\n", encoding="utf-8")
                swarm.start_node(f"node-{i}")
            page = SwarmPage(
                {home.root.name: home for home in homes},
                family_of=lambda name: self.family_of(int(name.removeprefix("node-"))),
                bootstrap_http=swarm.bootstrap_http,
            )
            self.page_server = page.serve(port=self.page_port)
            print(
                f"the swarm's page (curves, exchange, each node's page): {self.page_server.url}", flush=True
            )
            print(
                f"{self.nodes} specialist nodes started on {', '.join(s.label for s in self.families)} "
                f"(mixing {self.mixing}, {self.round_seconds:g} s rounds); "
                f"logs in {self.root}/*/process.log; Ctrl-C stops cleanly",
                flush=True,
            )
            started = time.time()
            deadline = time.monotonic() + self.minutes * 60
            tty = sys.stdout.isatty()
            last_print = 0.0
            while time.monotonic() < deadline:
                for proc in swarm.exited():
                    raise SwarmError(f"{proc.name} exited with code {proc.popen.returncode}; see {proc.log}")
                statuses = list(page.poll().values())
                table = _table(self._rows(statuses))
                left = deadline - time.monotonic()
                if tty:
                    sys.stdout.write(
                        "\x1b[H\x1b[J"
                        + f"swarmnode local swarm  ({left:4.0f} s left)  held-out accuracy, start -> now\n\n"
                        + table
                        + "\n"
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
        curves = {
            f"node-{i}": learning_curves(home, started, statuses[i] if i < len(statuses) else None)
            for i, home in enumerate(homes)
        }
        nodes = [self._node_summary(i, s, curves.get(f"node-{i}", {})) for i, s in enumerate(statuses)]
        summary = {
            "mixing": self.mixing,
            "families": [s.label for s in self.families],
            "nodes": nodes,
            "interrupted": interrupted,
            "round_seconds": self.round_seconds,
            "warm_start_seconds": round(warm_seconds, 1),  # ~0 when every specialist was cached
            "seconds": round(time.monotonic() - t0, 1),  # the whole run, warm starts included
        }
        where = str(self.root / "summary.json")
        try:
            atomic_write_text(self.root / "summary.json", json.dumps(summary, indent=1))
        except OSError as exc:
            where = f"not written: {exc}"
        print(f"\nsummary ({where}):")
        print(_table(self._rows(statuses)))
        for line in delivery_warnings(nodes):
            print(line)
        print(self._write_plot(curves))
        return 0

    def _node_summary(self, i: int, s: dict[str, Any] | None, curve: dict[str, Any]) -> dict[str, Any]:
        family = self.family_of(i)
        own0, peers0 = _family_means(s or {}, family, "heldout_first_by_family")
        own, peers = _family_means(s or {}, family, "heldout_by_family")
        return {
            "node": f"node-{i}",
            "family": family,
            "rounds": s["rounds_this_run"] if s else 0,
            "heldout_own_start": own0,
            "heldout_own_end": own,
            "heldout_peers_start": peers0,
            "heldout_peers_end": peers,
            "heldout_by_family_start": (s or {}).get("heldout_first_by_family", {}),
            "heldout_by_family_end": (s or {}).get("heldout_by_family", {}),
            "curve": curve,
            "reward_start": s["reward_first"] if s else None,
            "reward_end": s["reward_last"] if s else None,
            "groups_shared": _metric(s, "groups_published") if s else 0,
            "groups_received": _metric(s, "groups_accepted") if s else 0,
            "groups_used": _metric(s, "groups_used", "source=external") if s else 0,
            "rejections": s.get("admission", {}) if s else {},
            "gossip": {k: (s or {}).get("gossip", {}).get(k, 0) for k in GOSSIP_HEALTH},
        }

    def _write_plot(self, curves: dict[str, dict[str, Any]]) -> str:
        path = self.root / "learning.png"
        try:
            plot_learning(
                path,
                curves,
                {f"node-{i}": self.family_of(i) for i in range(self.nodes)},
                [s.label for s in self.families],
                self.mixing,
            )
        except (SwarmError, OSError, ValueError) as exc:
            return f"learning.png not written: {exc}"
        return f"held-out accuracy per family over time: {path}"


def learning_curves(home: NodeHome, started: float, status: dict[str, Any] | None) -> dict[str, Any]:
    """A node's held-out accuracy per family over time, from its ledger (every evaluated round) and
    its start evaluation (``status``): ``{"minutes": [...], "rounds": [...], family: [...]}``."""
    minutes: list[float] = []
    rounds: list[int] = []
    by_family: dict[str, list[float]] = {}
    first = (status or {}).get("heldout_first_by_family") or {}
    if first:
        minutes.append(0.0)
        rounds.append(0)
        for family, value in first.items():
            by_family.setdefault(family, []).append(value)
    try:
        records = harness.ledger_rounds(home)
    except (SwarmError, sqlite3.Error, OSError) as exc:  # a damaged ledger costs the curve, not the summary
        print(f"{home.root.name}: no learning curve ({exc})", flush=True)
        records = []
    for record in records:
        values = {k.removeprefix("heldout/"): v for k, v in record.extra.items() if k.startswith("heldout/")}
        if not values or (by_family and set(values) != set(by_family)):
            continue
        minutes.append((record.started_at + record.seconds - started) / 60)
        rounds.append(record.round)
        for family, value in values.items():
            by_family.setdefault(family, []).append(value)
    return {"minutes": minutes, "rounds": rounds, **by_family}


def plot_learning(
    path: Path, curves: dict[str, dict[str, Any]], specialty: dict[str, str], families: list[str], mixing: str
) -> None:
    """One panel per family, one line per node (solid: the family's specialist; dashed: its peers)."""
    from swarmnode.sim.plots import pyplot

    plt = pyplot()
    fig, axes = plt.subplots(1, len(families), figsize=(3.6 * len(families), 3.4), sharey=True, squeeze=False)
    for ax, family in zip(axes[0], families, strict=True):
        for node, curve in curves.items():
            if family not in curve:
                continue
            own = specialty.get(node) == family
            ax.plot(
                curve["minutes"],
                curve[family],
                marker=".",
                linestyle="-" if own else "--",
                label=f"{node} ({specialty.get(node)})",
            )
        ax.set_title(f"{family}", fontsize=10)
        ax.set_xlabel("minutes")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("greedy held-out accuracy")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 4), fontsize=8, frameon=False)
    fig.suptitle(
        f"swarmnode swarm, mixing {mixing}: held-out accuracy per family "
        "(solid: the family's specialist; dashed: its peers)",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
