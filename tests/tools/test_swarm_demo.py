"""`swarmnode swarm`, the main job: specialist nodes, their live rows, learning curves and picture.

The whole demo (warm starts, a bootstrap peer and real node processes) runs in the slow test at the
end; the parts here run on real ledgers, configs and matplotlib without starting a swarm."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from swarmnode.config import load_config
from swarmnode.errors import SwarmError
from swarmnode.home import NodeHome
from swarmnode.roles.common import build_mixture
from swarmnode.store import Ledger, RoundRecord
from swarmnode.tools.launch import (
    GOSSIP_HEALTH,
    MARKER,
    SwarmDemo,
    _row,
    delivery_warnings,
    learning_curves,
    plot_learning,
)


def demo(root: Path, nodes: int = 3, mixing: str = "replay") -> SwarmDemo:
    return SwarmDemo(root, nodes=nodes, minutes=1.0, mixing=mixing, round_seconds=1.0)


def test_each_node_is_a_specialist_on_its_own_family_and_all_train_on_the_union(tmp_path: Path) -> None:
    d = demo(tmp_path, nodes=5)
    assert [d.family_of(i) for i in range(5)] == ["add", "sub", "mul", "dec", "add"]
    config = load_config(None, environ={}, overrides=d._node_settings())
    assert list(build_mixture(config).families()) == ["add", "sub", "mul", "dec"]
    assert config.swarm.mixing == "replay" and config.swarm.external_groups == 8
    assert config.tasks.seed == 0  # the same prompts on every node, as in the testbed
    assert config.tasks.heldout_size == 400  # 100 per family
    assert list(
        build_mixture(load_config(None, environ={}, overrides=demo(tmp_path, 2)._node_settings())).families()
    ) == [
        "add",
        "sub",
    ]


def test_a_swarm_of_chat_models_answers_in_tags_within_the_chat_models_length(tmp_path: Path) -> None:
    chat = SwarmDemo(tmp_path, nodes=3, minutes=1.0, mixing="anchored", round_seconds=1.0, model="chat")
    config = load_config(None, environ={}, overrides=chat._node_settings())
    assert config.rollout.max_new_tokens == 64  # the tiny model's 6 cannot hold <answer>84</answer>
    assert (
        load_config(None, environ={}, overrides=demo(tmp_path)._node_settings()).rollout.max_new_tokens == 6
    )
    with pytest.raises(SwarmError, match="--model must be tiny or chat"):
        SwarmDemo(tmp_path, nodes=3, minutes=1.0, mixing="none", round_seconds=1.0, model="llama")


def test_bad_sizes_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SwarmError, match="--nodes"):
        SwarmDemo(tmp_path, nodes=0, minutes=1, mixing="none", round_seconds=1)
    with pytest.raises(SwarmError, match="--minutes"):
        SwarmDemo(tmp_path, nodes=2, minutes=0, mixing="none", round_seconds=1)


def test_the_row_shows_own_and_peers_family_accuracy_start_to_now() -> None:
    status: dict[str, Any] = {
        "rounds_this_run": 12,
        "heldout_first_by_family": {"add": 1.0, "sub": 0.1, "mul": 0.3},
        "heldout_by_family": {"add": 0.9, "sub": 0.2, "mul": 0.4},
        "admission": {"accepted": 30, "task_not_allowed": 2, "bad_signature": 1},
        "metrics": {
            "groups_published": {"": 96.0},
            "groups_accepted": {"": 30.0},
            "groups_used": {"source=external": 20.0, "source=own": 48.0},
        },
    }
    assert _row(status, "node-0", "add") == [
        "node-0", "add", "12", "1.00 -> 0.90", "0.20 -> 0.30", "96", "30", "20", "3",
    ]  # fmt: skip
    assert _row(None, "node-1", "sub")[:3] == ["node-1", "sub", "starting"]
    before_first_eval = {**status, "heldout_first_by_family": {}, "heldout_by_family": {}}
    assert _row(before_first_eval, "node-0", "add")[3:5] == ["- -> -", "- -> -"]


def _record(round_: int, started_at: float, **heldout: float) -> RoundRecord:
    return RoundRecord(
        round=round_,
        started_at=started_at,
        seconds=0.5,
        mean_reward=0.5,
        accuracy=0.5,
        tokens_generated=10,
        loss=0.1,
        policy_version=round_,
        extra={"groups_used": 4.0, **{f"heldout/{k}": v for k, v in heldout.items()}},
    )


def test_learning_curves_come_from_the_ledger_and_the_start_evaluation(tmp_path: Path) -> None:
    home = NodeHome(tmp_path / "node-0").ensure()
    t0 = time.time()
    with Ledger(home.ledger) as ledger:
        ledger.record_round(_record(1, t0 + 1))  # not evaluated: no point
        ledger.record_round(_record(10, t0 + 59.5, add=0.9, sub=0.2))
        ledger.record_round(_record(20, t0 + 119.5, add=0.95, sub=0.4))
    status = {"heldout_first_by_family": {"add": 1.0, "sub": 0.1}}
    curve = learning_curves(home, t0, status)
    assert curve["rounds"] == [0, 10, 20]
    assert curve["minutes"] == pytest.approx([0.0, 1.0, 2.0])
    assert curve["add"] == [1.0, 0.9, 0.95] and curve["sub"] == [0.1, 0.2, 0.4]


def test_a_damaged_ledger_costs_the_curve_not_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = NodeHome(tmp_path / "node-0").ensure()
    home.ledger.write_bytes(b"this is not SQLite" * 100)
    curve = learning_curves(home, time.time(), {"heldout_first_by_family": {"add": 1.0}})
    assert curve == {"minutes": [0.0], "rounds": [0], "add": [1.0]}
    assert "node-0: no learning curve" in capsys.readouterr().out


def test_the_learning_picture_is_a_png_with_a_panel_per_family(tmp_path: Path) -> None:
    curves = {
        "node-0": {
            "minutes": [0, 1, 2],
            "rounds": [0, 10, 20],
            "add": [1, 0.9, 0.95],
            "sub": [0.1, 0.2, 0.4],
        },
        "node-1": {"minutes": [0, 1], "rounds": [0, 10], "add": [0.1, 0.3], "sub": [0.8, 0.8]},
    }
    path = tmp_path / "learning.png"
    plot_learning(path, curves, {"node-0": "add", "node-1": "sub"}, ["add", "sub"], "anchored")
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", head[16:24])
    assert width > 1.5 * height  # two panels side by side


def test_a_run_starts_fresh_nodes_and_keeps_the_warm_start_cache(tmp_path: Path) -> None:
    for name in ("node-0", "node-1", "node-7"):
        (tmp_path / name / "checkpoints").mkdir(parents=True)
        (tmp_path / name / MARKER).write_text("x", encoding="utf-8")
    (tmp_path / "models" / "tiny-warm-x").mkdir(parents=True)
    demo(tmp_path, nodes=2)._clear_previous_nodes()
    assert not any(tmp_path.glob("node-*"))
    assert (tmp_path / "models" / "tiny-warm-x").is_dir()


def test_a_node_home_the_demo_did_not_make_is_refused_not_deleted(tmp_path: Path) -> None:
    (tmp_path / "node-1").mkdir()
    (tmp_path / "node-1" / "identity.key").write_bytes(b"precious")
    with pytest.raises(SwarmError, match=r"node-1 exists and was not made by"):
        demo(tmp_path, nodes=2)._clear_previous_nodes()
    assert (tmp_path / "node-1" / "identity.key").read_bytes() == b"precious"
    demo(tmp_path, nodes=1)._clear_previous_nodes()  # node-1 is not in this run: left alone
    assert (tmp_path / "node-1" / "identity.key").is_file()


@pytest.mark.slow
def test_the_demo_runs_specialists_end_to_end(tmp_path: Path) -> None:
    """Two specialist nodes for 40 s: rows, summary.json with per-family accuracy, learning.png."""
    code = SwarmDemo(tmp_path, nodes=2, minutes=40 / 60, mixing="replay", round_seconds=1.0).run()
    assert code == 0
    summary = json.loads((tmp_path / "summary.json").read_text(encoding="utf-8"))
    assert summary["families"] == ["add", "sub"] and not summary["interrupted"]
    for i, node in enumerate(summary["nodes"]):
        assert node["family"] == ["add", "sub"][i]
        assert node["rounds"] >= 10
        assert set(node["heldout_by_family_start"]) == {"add", "sub"}
        assert set(node["heldout_by_family_end"]) == {"add", "sub"}
        assert node["curve"]["rounds"][0] == 0 and len(node["curve"]["rounds"]) >= 2
        assert node["groups_received"] > 0 and node["groups_used"] > 0
        assert set(node["gossip"]) == set(GOSSIP_HEALTH)
    assert (tmp_path / "learning.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_node_that_got_too_few_of_its_peers_groups_is_named_with_its_gossip_counters() -> None:
    # The figures of a demo run in which two nodes stopped pulling from each other.
    def node(name: str, shared: int, received: int, **gossip: int) -> dict[str, Any]:
        return {"node": name, "groups_shared": shared, "groups_received": received, "gossip": gossip}

    nodes = [
        node("node-0", 3752, 7496),
        node("node-1", 3744, 6120, pulls_failed=3, pulls_refused=3, peers_shunned=1),
        node("node-2", 3752, 6128, pulls_failed=3, pulls_refused=3, peers_shunned=1),
    ]
    lines = delivery_warnings(nodes)
    assert len(lines) == 2
    assert lines[0].startswith("warning: node-1 received 82% of the groups its peers shared (6,120 of 7,504)")
    assert "pulls_refused 3, peers_shunned 1" in lines[0] and "pulls_timed_out" not in lines[0]
    assert lines[1].startswith("warning: node-2 received 82%")
    # The last round's batches in flight at the stop are no warning; nor is a node alone.
    assert delivery_warnings([node("node-0", 3752, 7480), node("node-1", 3744, 3740)]) == []
    assert delivery_warnings([node("node-0", 100, 0)]) == []


@pytest.mark.slow
@pytest.mark.timeout(1500)  # three warm starts (~1 min alone, 13 min seen under load), 150 s of rounds
def test_the_swarm_page_shows_every_nodes_curves_and_the_exchange_in_a_browser(tmp_path: Path) -> None:
    """Three specialists for 150 s with the swarm's page open in Chromium: a curve per node in each
    family's chart, and every node trains on both others' groups. A screenshot goes to the test's
    directory and to ``$SWARMNODE_SCREENSHOTS`` when set (docs/swarm.png)."""
    import os
    import shutil
    import threading

    from tests.browser.support import browser_page, chart_points, require_browser, table_rows, wait_loaded

    require_browser()
    d = SwarmDemo(tmp_path, nodes=3, minutes=150 / 60, mixing="replay", round_seconds=1.0)
    seen: dict[str, Any] = {}

    def watch() -> None:
        try:
            deadline = time.monotonic() + 600
            while d.page_server is None and time.monotonic() < deadline:
                time.sleep(0.5)
            assert d.page_server is not None, "the swarm page never started"
            seen["url"] = d.page_server.url
            with browser_page() as page:
                page.goto(d.page_server.url)
                wait_loaded(page)
                # Every family's chart has a line per node with a few evaluations on it.
                page.wait_for_function(
                    """() => ['add', 'sub', 'mul'].every(f => {
                        const lines = document.querySelectorAll(`[data-chart="heldout-${f}"] polyline`);
                        const drawn = l => l.getAttribute('points').split(' ').length >= 8;
                        return lines.length === 3 && [...lines].every(drawn);
                    })""",
                    timeout=240_000,
                )
                seen["heldout"] = {f: chart_points(page, f"heldout-{f}") for f in ("add", "sub", "mul")}
                seen["exchange"] = {cells[0]: cells[1:] for _, cells in table_rows(page, "exchange")}
                path = tmp_path / "swarm.png"
                page.screenshot(path=str(path), full_page=True)
                if os.environ.get("SWARMNODE_SCREENSHOTS"):
                    shutil.copy(path, Path(os.environ["SWARMNODE_SCREENSHOTS"]) / "swarm.png")
        except Exception as exc:  # reported to the main thread, which runs the demo  # noqa: BLE001
            seen["error"] = exc

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    assert d.run() == 0
    watcher.join(60)
    assert "error" not in seen, seen.get("error")
    assert seen["url"].startswith("http://127.0.0.1:")
    for family, lines in seen["heldout"].items():
        assert len(lines) == 3 and min(lines.values()) >= 8, (family, lines)
    for receiver, cells in seen["exchange"].items():
        pairs = [c for c in cells[:3] if c != "·"]
        assert len(pairs) == 2, cells
        for pair in pairs:
            admitted, used = (int(x.replace(",", "")) for x in pair.split(" / "))
            assert admitted > 0 and 0 < used <= admitted, (receiver, cells)
