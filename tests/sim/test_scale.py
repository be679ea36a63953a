"""The scale run of issue #6: 1 GiB to 1,000 nodes plus 100 gossip rounds (slow; time it yourself).

/usr/bin/time python -m pytest -q -m slow tests/sim/test_scale.py -s
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
    assert g["coverage_min"] == 1.0
