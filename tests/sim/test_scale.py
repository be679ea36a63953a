"""The scale run of issue #6: 1 GiB to 1,000 nodes plus 100 gossip rounds (slow; time it yourself).

/usr/bin/time -v python -m pytest -q -m slow tests/sim/test_scale.py -s

Issue #6 asks for at most 60 s of wall time on 2 cores; the run is single-threaded, so the CPU
time it prints is the figure to compare on a shared machine (~43 s; see simulations/README.md).
Timings are printed, never asserted.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from swarmnode.sim.run import simulate_network
from swarmnode.sim.scenario import load_scenario

SCENARIO = Path(__file__).resolve().parents[2] / "simulations" / "scenarios" / "broadcast_1000.toml"


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_1gib_broadcast_to_1000_nodes_with_100_gossip_rounds() -> None:
    scenario = load_scenario(SCENARIO)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    r = simulate_network(scenario)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    print(f"\nscale run: wall {wall:.1f} s, cpu {cpu:.1f} s, {r['calendar_entries']} calendar entries")
    b, g = r["broadcast"], r["gossip"]
    assert b["receivers_alive"] == 999 and b["all_completed"]
    assert b["completion_seconds"]["last"] >= b["bounds_seconds"]["fluid"]
    assert g["rounds"] == 100
    # Nearly every honest item reaches every node. Not all: while the broadcast runs, a gossip
    # publisher's uplink is a FIFO queue behind 32 MiB chunk uploads (network model), so a few
    # nodes' pulls of an item published then time out ``max_attempts`` times and they give up
    # on it (a handful of nodes for a handful of items; seed 7: min 0.993, mean 0.9999).
    assert g["coverage_mean"] >= 0.999
    assert g["coverage_min"] >= 0.99
