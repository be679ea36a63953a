"""Gossip in the simulator: the real GossipCore on every node, over the modelled network."""

from __future__ import annotations

from typing import Any

from swarmnode.sim.run import simulate_network
from swarmnode.sim.scenario import parse_scenario


def gossip_scenario(seed: int = 1, nodes: int = 16, **sections: dict[str, Any]) -> Any:
    data: dict[str, Any] = {
        "simulation": {"mode": "network", "seed": seed},
        "network": {"latency_ms": {"distribution": "lognormal", "median": 30, "sigma": 0.5}},
        "nodes": {"count": nodes},
        "gossip": {"rounds": 4, "round_seconds": 10, "publishers": 4, "items_per_round": 2,
                   "core": {"read_interval": 2.0}},
    }  # fmt: skip
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return parse_scenario(data)


def test_same_seed_same_run_and_another_seed_another_run() -> None:
    a = simulate_network(gossip_scenario(seed=3))
    b = simulate_network(gossip_scenario(seed=3))
    c = simulate_network(gossip_scenario(seed=4))
    for r in (a, b, c):
        r.pop("wall_seconds")
    assert a == b
    assert a["gossip"]["latency_cdf"] != c["gossip"]["latency_cdf"]


def test_in_a_lossless_network_every_item_reaches_every_node() -> None:
    g = simulate_network(gossip_scenario())["gossip"]
    assert g["items_counted"] > 0
    assert g["coverage_min"] == 1.0
    assert g["items_fully_covered"] == g["items_counted"]
    assert g["core_stats"]["rejected"] == 0


def test_a_forgers_items_are_never_admitted_and_it_gets_shunned() -> None:
    r = simulate_network(gossip_scenario(nodes=12, adversaries={"forgers": 2}))
    g = r["gossip"]
    assert g["items_published"]["forger"] > 0
    assert g["forged_accepted"] == 0
    assert g["core_stats"]["rejected"] > 0
    assert g["core_stats"]["bans"] > 0  # admission's ban and the core's own shunning
    assert g["coverage_min"] == 1.0  # honest items still reach everyone


def test_corrupt_payloads_are_caught_by_the_cores_digest_check() -> None:
    g = simulate_network(gossip_scenario(nodes=12, adversaries={"corrupt": 2}))["gossip"]
    assert g["core_stats"]["items_corrupt"] > 0
    assert g["coverage_min"] == 1.0


def test_churn_survivors_and_late_joiners_still_get_every_item() -> None:
    r = simulate_network(
        gossip_scenario(
            nodes=20,
            churn={"joins": 4, "leaves": 3, "crashes": 3, "start": 5, "end": 25, "restart_after": 5},
            gossip={"rounds": 5},
        )
    )
    events = [e["event"] for e in r["churn"]]
    assert events.count("join") == 4 and events.count("leave") == 3 and events.count("crash") == 3
    assert "restart" in events
    g = r["gossip"]
    # Coverage counts honest nodes alive at the end that joined before the item was published.
    assert g["coverage_mean"] >= 0.98


def test_loss_is_survived_by_retries() -> None:
    g = simulate_network(gossip_scenario(network={"loss": 0.05}, gossip={"rounds": 5}))["gossip"]
    assert g["core_stats"]["pulls_timed_out"] > 0
    assert g["coverage_mean"] >= 0.95
