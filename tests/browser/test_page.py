"""The dashboard page in a real browser (headless Chromium), against the real aiohttp app.

Specs: the page draws what /dashboard.json describes (cards, curves with their points, tables with
a banned peer marked), redraws live without reloading, shows peers' bytes as text and never as
markup, fits a phone's width, and says so when the node stops answering.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from swarmnode.ops.api import ThreadedApiServer, dashboard_app
from swarmnode.ops.dashboard import (
    MAX_POINTS,
    Chart,
    Dashboard,
    PeerRow,
    Section,
    Series,
    peers_table,
)

from .support import PHONE, browser_page, chart_points, overflows_horizontally, table_rows, wait_loaded

HOSTILE = '<img src=x onerror="window.pwned=1">'


class Node:
    """A page's data source the test can change while the browser watches."""

    def __init__(self) -> None:
        self.rounds = 10
        self.peers = [
            PeerRow(
                "honest-peer-aaaaaaaaaaaa",
                score=1.4,
                received=12,
                admitted=12,
                used=8,
                replayed=5,
                last_seen=1.0,
            ),
            PeerRow(HOSTILE, score=0.0, received=3, rejections={"bad_signature": 3}, banned_until=4e9),
        ]

    async def dashboard(self) -> Dashboard:
        reward = [(float(r), r / 100) for r in range(1, self.rounds + 1)]
        long = [(float(i), float(i % 7)) for i in range(10_000)]
        return Dashboard(
            "swarmnode · test-node",
            "trainer",
            cards=[("rounds", str(self.rounds)), ("policy version", "v7")],
            sections=[
                Section(
                    "Learning",
                    charts=[
                        Chart("reward", "Mean reward", [Series("reward", reward)]),
                        Chart("long", "A long run", [Series("ten thousand", long)]),
                        Chart("empty", "Nothing yet", []),
                        # a steady reward, downsampled: a range two ulps wide (red team: the tick
                        # loop never ended and the tab ran out of memory)
                        Chart("ulps", "Steady", [Series("steady", [(1.0, 0.6999999999999998), (2.0, 0.7)])]),
                    ],
                ),
                Section("Peers", tables=[peers_table(self.peers, now=2.0)]),
            ],
            poll_seconds=0.5,
        )


@contextmanager
def serve(node: Node) -> Iterator[str]:
    """The real app on 127.0.0.1, in a thread with its own event loop; stopped on exit."""
    from swarmnode.ops.dashboard import downsample

    async def dashboard() -> Dashboard:
        doc = await node.dashboard()
        for section in doc.sections:  # as every role does: series are downsampled before they go out
            for chart in section.charts:
                chart.series = [Series(s.name, downsample(s.points)) for s in chart.series]
        return doc

    server = ThreadedApiServer(dashboard_app(dashboard))
    try:
        yield server.url
    finally:
        server.stop()


def test_the_page_draws_the_document_and_redraws_it_live_without_reloading() -> None:
    node = Node()
    with serve(node) as url, browser_page() as page:
        page.goto(url)
        wait_loaded(page)
        assert page.inner_text("#title") == "swarmnode · test-node"
        assert page.inner_text('[data-card="rounds"] .value') == "10"
        assert chart_points(page, "reward") == {"reward": 10}
        assert 0 < chart_points(page, "long")["ten thousand"] <= MAX_POINTS
        assert "no data yet" in page.inner_text('[data-chart="empty"]')
        assert chart_points(page, "ulps") == {"steady": 2}
        rows = table_rows(page, "peers")
        assert rows[0][0] == "banned" and rows[0][1][7].startswith("banned,")  # banned peers first
        assert rows[1][0] == "" and rows[1][1][:6] == ["honest-peer-…", "1.4", "12", "12", "8", "5"]

        page.evaluate("window.sameDocument = true")  # lost if the page reloads
        node.rounds = 25
        page.wait_for_function("document.querySelector('[data-card=\"rounds\"] .value').innerText === '25'")
        assert page.evaluate("window.sameDocument") is True
        assert chart_points(page, "reward") == {"reward": 25}
        assert page.inner_text("#status").startswith("live")


def test_peers_bytes_are_shown_as_text_never_run_as_markup() -> None:
    node = Node()
    with serve(node) as url, browser_page() as page:
        page.goto(url)
        wait_loaded(page)
        cells = [cells[0] for _, cells in table_rows(page, "peers")]
        assert HOSTILE[:12] + "…" in cells  # the id as its characters (shortened for the cell)
        assert page.evaluate("document.querySelectorAll('img').length") == 0
        assert page.evaluate("window.pwned === undefined")


def test_the_page_fits_a_phone_and_says_when_the_node_stops_answering() -> None:
    node = Node()
    with serve(node) as url, browser_page(PHONE) as page:
        page.goto(url)
        wait_loaded(page)
        assert not overflows_horizontally(page)  # wide tables scroll inside their own box
        assert page.evaluate("getComputedStyle(document.querySelector('.tablewrap')).overflowX") == "auto"
    with serve(node) as url, browser_page() as page:
        page.goto(url)
        wait_loaded(page)
        page.route("**/dashboard.json", lambda route: route.abort())  # the node went away
        page.wait_for_function("document.getElementById('status').className === 'stale'")
        assert page.inner_text("#status").startswith("not answering")
