"""Gossip at scale in the simulator (issue #18): every node publishes every round, each pulls only
its round demand, and the figures the scale scenarios report (items wanted met in time, bytes up and
down, announcement bytes, what adversaries cost) measure what they say."""

from __future__ import annotations

from typing import Any

from swarmnode.sim.run import simulate_network
from swarmnode.sim.scenario import parse_scenario

ITEM_BYTES = 65_536
DEMAND = 4
ROUNDS = 6


def every_node_publishes(nodes: int = 40, seed: int = 2, **sections: dict[str, Any]) -> Any:
    data: dict[str, Any] = {
        "simulation": {"mode": "network", "seed": seed},
        "network": {"latency_ms": {"distribution": "lognormal", "median": 30, "sigma": 0.5}},
        "nodes": {"count": nodes},
        "gossip": {
            "rounds": ROUNDS, "round_seconds": 10, "publishers": nodes, "items_per_round": 1,
            "item_bytes": ITEM_BYTES, "wanted": 2,
            "core": {"read_interval": 2.0, "round_demand": DEMAND, "announce_buckets": 4, "read_buckets": 2},
        },
    }  # fmt: skip
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return parse_scenario(data)


def test_each_node_downloads_its_demand_not_the_swarms_output_and_gets_what_it_wants() -> None:
    g = simulate_network(every_node_publishes())["gossip"]
    assert g["wanted_met_share"] == 1.0
    down = g["bytes_down_per_node_round"]
    # About DEMAND items a round, far below the 39 other nodes' items that pulling everything takes.
    assert 0.5 * DEMAND * ITEM_BYTES < down["mean"] <= (DEMAND + 1) * ITEM_BYTES
    assert down["max"] < 10 * ITEM_BYTES
    assert g["bytes_up_per_node_round"]["mean"] == down["mean"]  # every byte served is received
    assert g["bytes_down_from_adversaries_per_node_round"]["max"] == 0
    # 2 of 4 buckets read: about half of the round's 39 other records, not all of them.
    assert 0 < g["announcement_bytes_per_node_round"]["mean"] < 0.75 * 39 * (160 + 32)
    assert g["distinct_sources_per_node"] > DEMAND


def test_without_a_demand_every_node_downloads_everything() -> None:
    g = simulate_network(every_node_publishes(gossip={"core": {"read_interval": 2.0}}))["gossip"]
    assert g["bytes_down_per_node_round"]["mean"] > 30 * ITEM_BYTES


def test_silent_forging_and_copycat_announcers_cost_bytes_and_time_but_honest_demand_is_met() -> None:
    adversaries = {"forgers": 4, "silent": 4, "copycats": 4}
    r = simulate_network(every_node_publishes(adversaries=adversaries))
    g = r["gossip"]
    assert r["nodes"]["roles"]["copycat"] == 4 and r["nodes"]["roles"]["silent"] == 4
    assert g["items_published"]["copycat"] == 0  # copycats only re-announce
    assert g["forged_accepted"] == 0
    stats = g["core_stats"]
    assert stats["pulls_timed_out"] > 0  # the silent ones
    assert stats["rejected"] > 0  # the forgers' items
    assert stats["items_missing"] > 0  # pulls of copied digests answered with nothing
    # Copycats' empty answers and forgers' items are bytes honest nodes downloaded for nothing.
    assert g["bytes_down_from_adversaries_per_node_round"]["mean"] > 0
    assert g["wanted_met_share"] >= 0.95
