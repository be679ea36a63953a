"""The dashboard: one JSON document per process (``GET /dashboard.json``) and one page that draws it.

Every process (a node of any role, the bootstrap peer, the local swarm launcher) describes what a
person should see as a ``Dashboard``: cards (headline figures), then sections of line charts and
tables. The page (``static/dashboard.html``, shipped in the package: no CDN, no JS library) polls the
document every few seconds and redraws it as SVG and HTML tables without reloading; it builds every
element with ``textContent``, never ``innerHTML``, because peer ids and reasons are peers' bytes.

Owns: the document's shape, the helpers that turn the ledger's rounds and counter histories into
charts (downsampled so a 10,000-round ledger is still a small document), the peers table, and the
page's text. Must not: read a node's state itself; each role (``roles/``) decides what it shows.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any

from swarmnode.store.ledger import Ledger, RoundRecord

#: Points per series at most; longer series are averaged into this many buckets.
MAX_POINTS = 300
#: Rows of a table at most (peers beyond it are summed into the table's note).
MAX_ROWS = 64
#: Seconds between the page's polls of ``/dashboard.json``.
POLL_SECONDS = 2.0


@dataclass
class Series:
    name: str
    points: list[tuple[float, float]]


@dataclass
class Chart:
    id: str
    title: str
    series: list[Series]
    x_label: str = "round"
    y_label: str = ""
    y_min: float | None = None  # fixed axis ends (e.g. 0 and 1 for accuracies); None: from the data
    y_max: float | None = None


@dataclass
class Table:
    id: str
    title: str
    columns: list[str]
    rows: list[list[str]]
    row_classes: list[str] = field(default_factory=list)  # per row: "" or e.g. "banned"
    note: str = ""


@dataclass
class Section:
    title: str
    charts: list[Chart] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    text: str = ""


@dataclass
class Dashboard:
    title: str
    role: str
    cards: list[tuple[str, str]] = field(default_factory=list)
    sections: list[Section] = field(default_factory=list)
    links: list[tuple[str, str]] = field(default_factory=list)  # (text, href) under the title
    updated: float = field(default_factory=time.time)
    poll_seconds: float = POLL_SECONDS

    def as_json(self) -> dict[str, Any]:
        document = asdict(self)
        document["cards"] = [{"label": label, "value": value} for label, value in self.cards]
        document["links"] = [{"text": text, "href": href} for text, href in self.links]
        return _finite(document)


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: a diverged loss is drawn as a gap (None), not a parse error."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def page_html() -> str:
    """The page every process serves at ``/``: it draws whatever ``/dashboard.json`` describes."""
    return resources.files("swarmnode.ops").joinpath("static/dashboard.html").read_text(encoding="utf-8")


# -- figures -----------------------------------------------------------------------------------


def fmt(value: float | int | None, digits: int = 3) -> str:
    """A figure as a person reads it: ``-`` for none, integers as such, else ``digits`` significant."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:.{digits}g}"


def ago(then: float | None, now: float) -> str:
    """``then`` as a distance from ``now``: "12 s ago", "5 min ago", "-" for never."""
    if not then:
        return "-"
    seconds = max(0.0, now - then)
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def short_id(peer_id: str, keep: int = 12) -> str:
    """A peer id shortened for a table cell (the full id stays in the JSON's other fields)."""
    return peer_id if len(peer_id) <= keep + 1 else peer_id[:keep] + "…"


def downsample(
    points: Sequence[tuple[float, float]], max_points: int = MAX_POINTS
) -> list[tuple[float, float]]:
    """At most ``max_points`` points: consecutive points averaged in equal buckets (x and y both),
    so a noisy per-round reward reads as its trend and the document stays small at any length."""
    n = len(points)
    if n <= max_points:
        return [(float(x), float(y)) for x, y in points]
    out = []
    for b in range(max_points):
        lo, hi = b * n // max_points, (b + 1) * n // max_points
        bucket = points[lo:hi]
        out.append((sum(x for x, _ in bucket) / len(bucket), sum(y for _, y in bucket) / len(bucket)))
    return out


# -- learning ------------------------------------------------------------------------------------

HELDOUT_PREFIX = "heldout/"


def learning_charts(rounds: Sequence[RoundRecord], max_points: int = MAX_POINTS) -> list[Chart]:
    """From the ledger's rounds (so the curves survive restarts): mean reward of own completions per
    round, and greedy held-out accuracy (the mean, and one line per task family when there are
    several) at the rounds that evaluated it."""
    reward = [(float(r.round), r.mean_reward) for r in rounds if math.isfinite(r.mean_reward)]
    heldout = [(float(r.round), r.extra["heldout_accuracy"]) for r in rounds if "heldout_accuracy" in r.extra]
    families: dict[str, list[tuple[float, float]]] = {}
    for r in rounds:
        for key, value in r.extra.items():
            if key.startswith(HELDOUT_PREFIX):
                families.setdefault(key[len(HELDOUT_PREFIX) :], []).append((float(r.round), value))
    held_series = [Series("mean", downsample(heldout, max_points))] if heldout else []
    held_series += [Series(name, downsample(pts, max_points)) for name, pts in sorted(families.items())]
    return [
        Chart(
            "reward",
            "Mean reward of own completions",
            [Series("reward", downsample(reward, max_points))],
            y_label="reward",
        ),
        Chart("heldout", "Held-out accuracy (greedy)", held_series, y_label="accuracy", y_min=0.0, y_max=1.0),
    ]


class LedgerRounds:
    """The ledger's rounds for the page, read incrementally (only rounds after the last one read),
    and their charts, redrawn only when a round was added: a page open on a node with a long
    ledger costs one small SQLite read per poll, not a pass over every round.

    ``charts`` touches SQLite: call it off the event loop (``asyncio.to_thread``)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._rounds: list[RoundRecord] = []
        self._charts: list[Chart] = []
        self._charted = -1  # how many rounds the cached charts were drawn from
        self._lock = threading.Lock()

    def charts(self) -> list[Chart]:
        """``learning_charts`` and ``usage_chart`` of every recorded round."""
        with self._lock:
            rounds = self._read()
            if len(rounds) != self._charted:
                self._charts = [*learning_charts(rounds), usage_chart(rounds)]
                self._charted = len(rounds)
            return self._charts

    def _read(self) -> list[RoundRecord]:
        last = self._rounds[-1].round if self._rounds else None
        self._rounds.extend(self.ledger.rounds(after=last))
        return self._rounds


def usage_chart(rounds: Sequence[RoundRecord]) -> Chart:
    """Groups trained on per round: own and peers' (the ledger's ``groups_used``/``external_used``)."""
    own = [(float(r.round), r.extra["groups_used"]) for r in rounds if "groups_used" in r.extra]
    ext = [(float(r.round), r.extra["external_used"]) for r in rounds if "external_used" in r.extra]
    return Chart(
        "groups_used",
        "Groups trained on per round",
        [Series("own", downsample(own)), Series("peers'", downsample(ext))],
        y_label="groups",
        y_min=0.0,
    )


class CounterHistory:
    """Counters sampled over time (at most ``keep`` samples): e.g. admission verdicts by reason after
    each round, drawn as one cumulative line per key. Bounded, in memory (the ledger keeps totals)."""

    def __init__(self, keep: int = 2 * MAX_POINTS) -> None:
        self._samples: deque[tuple[float, dict[str, float]]] = deque(maxlen=keep)

    def __len__(self) -> int:
        return len(self._samples)

    def add(self, x: float, counts: Mapping[str, float]) -> None:
        self._samples.append((float(x), {str(k): float(v) for k, v in counts.items()}))

    def chart(self, id: str, title: str, x_label: str = "round", y_label: str = "count") -> Chart:
        keys = sorted({k for _, counts in self._samples for k in counts})
        series = [
            Series(key, downsample([(x, counts.get(key, 0.0)) for x, counts in self._samples]))
            for key in keys
        ]
        return Chart(id, title, series, x_label=x_label, y_label=y_label, y_min=0.0)


# -- peers ---------------------------------------------------------------------------------------

PEER_COLUMNS = ["peer", "score", "received", "admitted", "used", "replayed", "rejections", "ban", "last seen"]


@dataclass
class PeerRow:
    """What this node knows of one peer: its intake figures (groups), its score, its rejections
    by reason (the ledger's, so they survive restarts), its ban and when it last sent anything."""

    peer: str
    score: float | None = None
    received: int = 0  # groups it signed that reached admission (admitted ones + rejected batches)
    admitted: int = 0
    used: int = 0  # admitted groups the sharing rule trained on
    replayed: int = 0  # its remembered answers replay trained on again (mixing = replay)
    rejections: dict[str, int] = field(default_factory=dict)
    banned_until: float | None = None
    last_seen: float | None = None


def peers_table(rows: Iterable[PeerRow], now: float, max_rows: int = MAX_ROWS, more_banned: int = 0) -> Table:
    """One row per peer, banned ones first, then by groups admitted and rejections; at most
    ``max_rows`` (the rest counted in the note: a flood of identities cannot grow the page).

    Banned peers that never had a group admitted take at most a quarter of the rows: fresh
    identities are free to get banned, and must not push the peers whose groups this node trains
    on out of view (red team: 64 banned throwaway identities hid every honest peer and the
    attacker's active one). ``more_banned``: banned peers the caller left out of ``rows``."""

    def key(row: PeerRow) -> tuple[bool, int, int]:
        return (row.banned_until is None, -row.admitted, -sum(row.rejections.values()))

    ordered = sorted(rows, key=key)
    idle = [r for r in ordered if r.banned_until and not r.admitted]  # banned, nothing admitted
    active = [r for r in ordered if not (r.banned_until and not r.admitted)]
    n_idle = min(len(idle), max(max_rows // 4, max_rows - len(active)))
    chosen = {id(r) for r in idle[:n_idle] + active[: max_rows - n_idle]}
    shown = [r for r in ordered if id(r) in chosen]
    cells = [
        [
            short_id(r.peer),
            fmt(r.score, 2),
            fmt(r.received),
            fmt(r.admitted),
            fmt(r.used),
            fmt(r.replayed),
            ", ".join(f"{reason} {n}" for reason, n in sorted(r.rejections.items())) or "-",
            f"banned, {fmt((r.banned_until - now) / 60, 2)} min left" if r.banned_until else "-",
            ago(r.last_seen, now),
        ]
        for r in shown
    ]
    hidden = len(ordered) - len(shown) + more_banned
    hidden_banned = sum(1 for r in ordered if r.banned_until) - sum(1 for r in shown if r.banned_until)
    note = f"{hidden} more peers not shown" if hidden else ""
    if hidden and hidden_banned + more_banned:
        note += f" ({hidden_banned + more_banned} of them banned)"
    return Table(
        "peers",
        "Peers",
        PEER_COLUMNS,
        cells,
        ["banned" if r.banned_until else "" for r in shown],
        note,
    )


def trainer_dashboard(
    title: str,
    cards: list[tuple[str, str]],
    learning: list[Chart],
    peers: Iterable[PeerRow],
    verdicts: CounterHistory,
    intake: Mapping[str, Any],
    now: float,
    note: str = "",
    more_banned: int = 0,
) -> Dashboard:
    """A trainer's page: learning (``LedgerRounds.charts``), its peers, its intake over rounds."""
    return Dashboard(
        title,
        "trainer",
        cards=cards,
        sections=[
            Section("Learning", charts=learning, text=note),
            Section("Peers", tables=[peers_table(peers, now, more_banned=more_banned)]),
            Section(
                "Intake",
                charts=[verdicts.chart("verdicts", "Admission verdicts (cumulative)")],
                tables=[key_value_table("intake", "Intake and verifier pool", intake)],
            ),
        ],
        links=[("status JSON", "/status"), ("metrics", "/metrics")],
    )


def key_value_table(id: str, title: str, values: Mapping[str, Any]) -> Table:
    """A two-column table of named figures (e.g. the verifier pool's health)."""
    rows = [
        [str(k), v if isinstance(v, str) else fmt(v) if isinstance(v, int | float) or v is None else str(v)]
        for k, v in values.items()
    ]
    return Table(id, title, ["", "value"], rows)


__all__ = [
    "MAX_POINTS",
    "MAX_ROWS",
    "POLL_SECONDS",
    "Chart",
    "CounterHistory",
    "Dashboard",
    "LedgerRounds",
    "PeerRow",
    "Section",
    "Series",
    "Table",
    "ago",
    "downsample",
    "fmt",
    "key_value_table",
    "learning_charts",
    "page_html",
    "peers_table",
    "short_id",
    "trainer_dashboard",
    "usage_chart",
]
