"""The local swarm's page: every node's curves side by side and the exchange between them.

``SwarmPage`` polls each node's ``/status`` and ``/dashboard.json`` (``poll``, from the launcher's own
loop) and describes the swarm as one ``ops.dashboard.Dashboard``: held-out accuracy per task family
with one line per node, each node's reward, and who sends to whom (groups admitted, and of those
the groups trained on). ``serve`` runs the one HTTP app (``ops.api``) in a thread, so the launcher's
loop stays a plain loop. A node that does not answer is shown as such; nothing here can stop a node.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from swarmnode.errors import SwarmError
from swarmnode.home import NodeHome
from swarmnode.ops.api import ThreadedApiServer, dashboard_app
from swarmnode.ops.dashboard import Chart, Dashboard, Section, Series, Table, fmt, short_id
from swarmnode.ops.status import fetch_status

POLL_TIMEOUT = 2.0
#: Senders that are not nodes of this swarm are summed in one column.
OTHERS = "others"


def _fetch_json(url: str, timeout: float) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        document: dict[str, Any] = json.loads(response.read())
    return document


def _chart(document: Mapping[str, Any], chart_id: str) -> dict[str, Any] | None:
    for section in document.get("sections", []):
        for chart in section.get("charts", []):
            if chart.get("id") == chart_id:
                found: dict[str, Any] = chart
                return found
    return None


class SwarmPage:
    """What the swarm's page shows, from its nodes' own documents (``homes``: name -> home)."""

    def __init__(
        self,
        homes: Mapping[str, NodeHome],
        *,
        family_of: Callable[[str], str] | None = None,
        bootstrap_http: str | None = None,
        title: str = "swarmnode · local swarm",
    ) -> None:
        self.homes = dict(homes)
        self.family_of = family_of
        self.bootstrap_http = bootstrap_http
        self.title = title
        self._lock = threading.Lock()
        self._statuses: dict[str, dict[str, Any] | None] = {}
        self._documents: dict[str, dict[str, Any] | None] = {}
        self._ports: dict[str, str] = {}

    def poll(self, timeout: float = POLL_TIMEOUT) -> dict[str, dict[str, Any] | None]:
        """Each node's /status (None if it does not answer) and, beside it, its page's document."""
        statuses: dict[str, dict[str, Any] | None] = {}
        documents: dict[str, dict[str, Any] | None] = {}
        ports: dict[str, str] = {}
        for name, home in self.homes.items():
            try:
                statuses[name] = fetch_status(home, timeout=timeout)
                ports[name] = (home.root / "api.port").read_text().strip()
                documents[name] = _fetch_json(f"http://127.0.0.1:{ports[name]}/dashboard.json", timeout)
            except (SwarmError, OSError, urllib.error.URLError, json.JSONDecodeError):
                statuses.setdefault(name, None)
                documents[name] = None
        with self._lock:
            self._statuses, self._documents, self._ports = statuses, documents, ports
        return statuses

    # -- the document --------------------------------------------------------------------------

    def dashboard(self) -> Dashboard:
        with self._lock:
            statuses, documents, ports = dict(self._statuses), dict(self._documents), dict(self._ports)
        names = list(self.homes)
        up = [n for n in names if statuses.get(n)]
        links = [(f"{n}'s page", f"http://127.0.0.1:{ports[n]}/") for n in names if n in ports]
        if self.bootstrap_http:
            links.append(("bootstrap's page", self.bootstrap_http + "/"))
        return Dashboard(
            self.title,
            "swarm",
            cards=[
                ("nodes answering", f"{len(up)} of {len(names)}"),
                ("rounds (min / max)", self._rounds(statuses, up)),
                ("peers' groups used", fmt(sum(self._used_total(statuses[n]) for n in up))),
            ],
            sections=[
                Section("Learning", charts=self._learning(documents, names)),
                Section("Exchange", tables=[self._exchange(statuses, names), self._nodes(statuses, names)]),
            ],
            links=links,
        )

    @staticmethod
    def _rounds(statuses: Mapping[str, dict[str, Any] | None], up: list[str]) -> str:
        rounds = [int(s["rounds"]) for n in up if (s := statuses.get(n)) and "rounds" in s]
        return f"{min(rounds)} / {max(rounds)}" if rounds else "-"

    @staticmethod
    def _used_total(status: Mapping[str, Any] | None) -> float:
        tallies = (status or {}).get("external_by_sender", {})
        return float(sum(t.get("used", 0) for t in tallies.values()))

    def _learning(self, documents: Mapping[str, dict[str, Any] | None], names: list[str]) -> list[Chart]:
        """Held-out accuracy per family (one line per node), then each node's mean reward."""
        by_family: dict[str, list[Series]] = {}
        rewards: list[Series] = []
        for name in names:
            document = documents.get(name) or {}
            heldout = _chart(document, "heldout") or {}
            series = heldout.get("series", [])
            families = [s for s in series if s["name"] != "mean"] or series
            label = f"{name} ({self.family_of(name)})" if self.family_of else name
            for s in families:
                by_family.setdefault(s["name"], []).append(Series(label, [tuple(p) for p in s["points"]]))
            reward = _chart(document, "reward")
            if reward and reward.get("series"):
                rewards.append(Series(name, [tuple(p) for p in reward["series"][0]["points"]]))
        charts = [
            Chart(
                f"heldout-{family}",
                f"Held-out accuracy: {family}",
                series,
                y_label="accuracy",
                y_min=0,
                y_max=1,
            )
            for family, series in sorted(by_family.items())
        ]
        return [*charts, Chart("reward", "Mean reward of own completions", rewards, y_label="reward")]

    def _exchange(self, statuses: Mapping[str, dict[str, Any] | None], names: list[str]) -> Table:
        """Rows: the receiving node; columns: the sending node; cells: groups admitted / trained on."""
        node_of = {s["peer_id"]: n for n, s in statuses.items() if s and "peer_id" in s}
        rows = []
        for receiver in names:
            status = statuses.get(receiver)
            if not status:
                rows.append([receiver, *["-" for _ in names], "-"])
                continue
            cells: dict[str, list[float]] = {}
            for sender, tally in status.get("external_by_sender", {}).items():
                column = node_of.get(sender, OTHERS)
                admitted_used = cells.setdefault(column, [0.0, 0.0])
                admitted_used[0] += tally.get("groups", 0)
                admitted_used[1] += tally.get("used", 0)
            rows.append(
                [
                    receiver,
                    *(
                        "·"
                        if sender == receiver
                        else f"{fmt(cells.get(sender, [0, 0])[0])} / {fmt(cells.get(sender, [0, 0])[1])}"
                        for sender in [*names, OTHERS]
                    ),
                ]
            )
        return Table(
            "exchange",
            "Who learns from whom: groups admitted / trained on (row: receiver, column: sender)",
            ["receiver", *names, OTHERS],
            rows,
        )

    @staticmethod
    def _nodes(statuses: Mapping[str, dict[str, Any] | None], names: list[str]) -> Table:
        rows, classes = [], []
        for name in names:
            s = statuses.get(name)
            if not s:
                rows.append([name, "not answering", "-", "-", "-", "-", "-"])
                classes.append("banned")
                continue
            rejected = sum(v for k, v in s.get("admission", {}).items() if k != "accepted")
            rows.append(
                [
                    name,
                    short_id(str(s.get("peer_id", ""))),
                    fmt(s.get("rounds")),
                    fmt(s.get("policy_version")),
                    fmt(s.get("heldout_accuracy"), 3),
                    fmt(s.get("reward_last"), 3),
                    fmt(rejected),
                ]
            )
            classes.append("")
        return Table(
            "nodes",
            "Nodes",
            ["node", "peer", "rounds", "policy version", "held-out", "reward", "refused"],
            rows,
            classes,
        )

    # -- serving -------------------------------------------------------------------------------

    def serve(self, host: str = "127.0.0.1", port: int = 0) -> ThreadedApiServer:
        """Serve the page in a thread of its own (``stop()`` it); ``.url`` is its address."""

        async def status() -> dict[str, Any]:
            with self._lock:
                return {"role": "swarm", "nodes": dict(self._statuses)}

        async def dashboard() -> Dashboard:
            return self.dashboard()

        try:
            return ThreadedApiServer(dashboard_app(dashboard, status), host, port, name="swarm page")
        except OSError as exc:
            raise SwarmError(f"the swarm page cannot listen on {host}:{port}: {exc}") from exc


__all__ = ["SwarmPage"]
