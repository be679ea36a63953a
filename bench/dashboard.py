"""What the node's page costs: its JSON size and how fast it is built, served and drawn.

Question (#17): for a node that has run 1,000 rounds with 8 peers, how large is /dashboard.json,
how long does the node spend building it, and how long does a real browser take from opening the
page to its first drawing? Reference: the page polls every ``POLL_SECONDS`` (2 s), so building the
document should cost a small share of that, and the node's /status document of the same node
(the text table the page replaced) is the size beside which the page's JSON is judged.

Setup: a real ledger (SQLite) with 1,000 rounds recorded as a trainer records them (held-out
evaluation every 10 rounds, 3 task families), 8 peers (one banned, with rejections), 1,000
samples of admission verdicts by 8 reasons; the document is built by the trainer's own builder
(``ops.dashboard.trainer_dashboard``, the ledger read by ``LedgerRounds``) and served by the real
app (``ops.api.dashboard_app``) on 127.0.0.1; Debian's Chromium (Playwright) opens the page.

    python bench/dashboard.py                  # table
    python bench/dashboard.py --json out.json  # and the same figures as JSON

Run it alone: on a shared 2-core machine other work skews the figures.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from swarmnode.ops.api import ThreadedApiServer, dashboard_app
from swarmnode.ops.dashboard import (
    POLL_SECONDS,
    CounterHistory,
    Dashboard,
    LedgerRounds,
    PeerRow,
    trainer_dashboard,
)
from swarmnode.store import Ledger, RoundRecord

ROUNDS = 1000
PEERS = 8
FAMILIES = ("add", "sub", "mul")
REASONS = ("accepted", "duplicate", "replay", "bad_signature", "malformed", "stale", "too_large", "banned")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]


def fill_ledger(ledger: Ledger) -> None:
    for r in range(1, ROUNDS + 1):
        extra = {"groups_used": 4.0, "external_used": 8.0}
        if r % 10 == 0:
            extra["heldout_accuracy"] = min(1.0, r / ROUNDS)
            extra.update({f"heldout/{f}": min(1.0, r / ROUNDS * (i + 1) / 3) for i, f in enumerate(FAMILIES)})
        ledger.record_round(RoundRecord(r, 1e9 + r, 0.5, r / ROUNDS, r / ROUNDS, 400, 0.01, r, extra))


def peers(now: float) -> list[PeerRow]:
    rows = [
        PeerRow(f"peer-{i:02d}-" + "x" * 40, 2.0, 900, 880, 600, {"duplicate": 3}, None, now - i)
        for i in range(PEERS - 1)
    ]
    rows.append(
        PeerRow("attacker-" + "y" * 40, -10.0, 20, 2, 1, {"bad_signature": 9, "replay": 4}, now + 3000, now)
    )
    return rows


def build(rounds_source: LedgerRounds, verdicts: CounterHistory) -> Dashboard:
    now = time.time()
    return trainer_dashboard(
        "swarmnode · bench-node",
        [("rounds", str(ROUNDS)), ("policy version", str(ROUNDS))],
        rounds_source.charts(),
        peers(now),
        verdicts,
        {"external pool (groups waiting)": 12, "replay cache (ids remembered)": "9,000 of 200,000"},
        now,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp, Ledger(Path(tmp) / "ledger.sqlite") as ledger:
        fill_ledger(ledger)
        verdicts = CounterHistory()
        for r in range(1, ROUNDS + 1):
            verdicts.add(r, {reason: r * (10 if reason == "accepted" else 1) for reason in REASONS})
        source = LedgerRounds(ledger)
        cold = time.perf_counter()
        build(source, verdicts)  # the first read takes every round from SQLite
        cold_s = time.perf_counter() - cold
        builds, sizes = [], []
        for _ in range(args.repeats):
            t = time.perf_counter()
            text = json.dumps(build(source, verdicts).as_json(), separators=(",", ":"), allow_nan=False)
            builds.append(time.perf_counter() - t)
            sizes.append(len(text.encode()))

        async def dashboard() -> Dashboard:
            return build(source, verdicts)

        server = ThreadedApiServer(dashboard_app(dashboard))
        url = server.url
        served = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            with urllib.request.urlopen(url + "dashboard.json", timeout=10) as response:
                response.read()
            served.append(time.perf_counter() - t)
        draws = first_draws(url)
        server.stop()

    figures: dict[str, Any] = {
        "machine": f"{platform.machine()}, python {platform.python_version()}",
        "rounds": ROUNDS,
        "peers": PEERS,
        "json_bytes": statistics.median(sizes),
        "build_ms_median": statistics.median(builds) * 1e3,
        "build_ms_first_read": cold_s * 1e3,
        "served_ms_median": statistics.median(served) * 1e3,
        "first_draw_ms_median": statistics.median(draws) * 1e3 if draws else None,
        "first_draw_runs": len(draws),
        "poll_seconds": POLL_SECONDS,
    }
    print(f"node page, {ROUNDS} rounds, {PEERS} peers ({figures['machine']})")
    print(f"  /dashboard.json size         {figures['json_bytes'] / 1024:8.1f} KiB")
    print(
        f"  build (median of {args.repeats})       {figures['build_ms_median']:8.2f} ms"
        f"   = {figures['build_ms_median'] / 1e3 / POLL_SECONDS:.2%} of the {POLL_SECONDS:g}-s poll"
    )
    print(f"  build, first ledger read     {figures['build_ms_first_read']:8.2f} ms")
    print(f"  served over HTTP (median)    {figures['served_ms_median']:8.2f} ms")
    if draws:
        first = figures["first_draw_ms_median"]
        print(f"  Chromium: open -> first draw {first:8.1f} ms (median of {len(draws)})")
    else:
        print("  Chromium: not measured (install Debian's chromium and playwright)")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


def first_draws(url: str, runs: int = 5) -> list[float]:
    """Seconds from navigation to the page's first drawing of the document, each in a new page."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return []
    import shutil

    chromium = shutil.which("chromium")
    if chromium is None:
        return []
    out = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        for _ in range(runs):
            page = browser.new_context(bypass_csp=True).new_page()
            t = time.perf_counter()
            page.goto(url)
            page.wait_for_function("Number(document.body.dataset.loaded || 0) >= 1")
            out.append(time.perf_counter() - t)
            page.close()
        browser.close()
    return out


if __name__ == "__main__":
    raise SystemExit(main())
