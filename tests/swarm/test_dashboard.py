"""What an operator sees, in a real browser: a live swarm's node page, the bootstrap's page and the
swarm's page (headless Chromium against real processes on 127.0.0.1).

Bootstrap + 2 honest ``swarmnode run`` processes + ``swarmnode/testing/adversary.py``, which sends
poison until the nodes ban it. Then, as a person would look: node-0's learning curves have points,
its peers table lists the other node by its id and shows the adversary as banned; the bootstrap's
page shows its peers over time; the swarm page shows both nodes' curves and what each trained on
from the other. Screenshots go to the test's directory, and (node, bootstrap) to
``$SWARMNODE_SCREENSHOTS`` when set (how ``docs/*.png`` are made: see docs/README.md).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from swarmnode.tools.swarm_page import SwarmPage
from tests.browser.support import (
    DESKTOP,
    browser_page,
    chart_points,
    require_browser,
    table_rows,
    wait_loaded,
)

from .support import LocalSwarm, metric, read_json, start_adversary

pytestmark = [pytest.mark.network, pytest.mark.timeout(600)]

ROUND_SECONDS = 2.0
NODES = ("node-0", "node-1")


def admitted_from(status: dict[str, Any], sender: str) -> int:
    return int(status["external_by_sender"].get(sender, {}).get("groups", 0))


def screenshot(page: Any, tmp_path: Path, name: str, *, for_docs: bool = True) -> None:
    path = tmp_path / name
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000  # a drawn page, not a blank one
    out = os.environ.get("SWARMNODE_SCREENSHOTS")
    if out and for_docs:
        Path(out).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(out) / name)


def test_node_bootstrap_and_swarm_pages_show_live_curves_peers_and_a_banned_attacker(
    local_swarm: Any, tmp_path: Path
) -> None:
    require_browser()  # before minutes of swarm: skip (or fail in CI) at once without Chromium
    swarm: LocalSwarm = local_swarm(ROUND_SECONDS)
    boot = swarm.start_bootstrap()[0]
    for i, name in enumerate(NODES):
        swarm.write_node_config(name, i, **{"tasks.heldout_size": 24})  # a curve to draw
        swarm.start_node(name)
    adv_home, adversary = start_adversary(swarm, boot, ROUND_SECONDS)
    up = swarm.wait_statuses(lambda s: True, "every node's API")
    honest = {name: up[name]["peer_id"] for name in NODES}
    swarm.wait_statuses(
        lambda s: (
            admitted_from(s["node-0"], honest["node-1"]) > 0
            and admitted_from(s["node-1"], honest["node-0"]) > 0
        ),
        "the nodes to admit each other's groups",
    )
    (adv_home / "go-phase1").touch()
    swarm.wait(lambda: read_json(adv_home / "phase1.json"), "the adversary's phase 1")
    (adv_home / "go-phase2").touch()
    swarm.wait(lambda: read_json(adv_home / "phase2.json"), "the adversary's phase 2")
    swarm.wait_statuses(
        lambda s: all(metric(s[n], "bans") >= 1 for n in NODES), "the nodes to ban the adversary", timeout=120
    )
    # Held-out accuracy is evaluated every 10 rounds: wait for two evaluations and used groups.
    swarm.wait_statuses(
        lambda s: all(
            s[n]["rounds"] >= 20 and metric(s[n], "groups_used", "source=external") > 0 for n in NODES
        ),
        "20 rounds with peers' groups used",
        timeout=180,
    )
    banned_ids = {adversary["main"], adversary["libp2p_peer_id"]}
    node_url = f"http://127.0.0.1:{(swarm.homes['node-0'].root / 'api.port').read_text().strip()}/"

    with browser_page(DESKTOP) as page:
        # The node's page: curves from its ledger, its peers, the attacker banned.
        started = time.monotonic()
        page.goto(node_url)
        wait_loaded(page)
        load_seconds = time.monotonic() - started
        assert page.inner_text("#title") == "swarmnode · node-0"
        assert chart_points(page, "reward")["reward"] >= 20
        held = chart_points(page, "heldout")
        assert held and all(n >= 2 for n in held.values()), held
        assert chart_points(page, "groups_used")["peers'"] >= 1
        rows = table_rows(page, "peers")
        by_id = {cells[0].rstrip("…"): (cls, cells) for cls, cells in rows}
        other = next(v for k, v in by_id.items() if honest["node-1"].startswith(k))
        assert other[0] == "" and int(other[1][3].replace(",", "")) > 0  # admitted > 0, not banned
        banned = [cells for cls, cells in rows if cls == "banned"]
        assert banned and all(cells[7].startswith("banned, ") for cells in banned)
        assert any(i.startswith(cells[0].rstrip("…")) for cells in banned for i in banned_ids)
        assert all(not honest["node-1"].startswith(cells[0].rstrip("…")) for cells in banned)
        draws = int(page.evaluate("document.body.dataset.loaded"))
        wait_loaded(page, draws + 1)  # live: redrawn from a new document without a reload
        screenshot(page, tmp_path, "node.png")

        # The bootstrap's page: its peers over time (sampled every 10 s from its start).
        assert swarm.bootstrap_http
        page.goto(swarm.bootstrap_http + "/")
        wait_loaded(page)
        assert chart_points(page, "peers")["DHT routing table"] >= 1
        assert int(page.inner_text('[data-card="DHT peers"] .value')) >= 2
        screenshot(page, tmp_path, "bootstrap.png")

        # The swarm's page (what `swarmnode swarm` serves): both nodes' curves, the exchange.
        swarm_page = SwarmPage({n: swarm.homes[n] for n in NODES}, bootstrap_http=swarm.bootstrap_http)
        swarm_page.poll()
        server = swarm_page.serve()
        try:
            page.goto(server.url)
            wait_loaded(page)
            reward = chart_points(page, "reward")
            assert set(reward) == set(NODES) and min(reward.values()) >= 20
            exchange = {cells[0]: cells for _, cells in table_rows(page, "exchange")}
            for receiver, column in (("node-0", 2), ("node-1", 1)):
                admitted, used = (int(x.replace(",", "")) for x in exchange[receiver][column].split(" / "))
                assert admitted > 0 and 0 < used <= admitted, exchange
            screenshot(page, tmp_path, "swarm.png", for_docs=False)  # docs/swarm.png: the real demo's
        finally:
            server.stop()
    document_bytes = len(json.dumps(up))  # reported beside the page figures below
    print(json.dumps({"node_page_first_draw_s": round(load_seconds, 2), "status_bytes": document_bytes}))
