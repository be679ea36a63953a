"""Weight broadcast in the simulator: the real BroadcastCore against the bounds of ALGORITHMS.md §6."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from swarmnode.sim.run import simulate_network
from swarmnode.sim.scenario import parse_scenario

MIB = 2**20


def broadcast_scenario(nodes: int = 8, seed: int = 1, **sections: dict[str, Any]) -> Any:
    data: dict[str, Any] = {
        "simulation": {"mode": "network", "seed": seed},
        "network": {"upload_mbps": 100, "download_mbps": 100, "latency_ms": 20},
        "nodes": {"count": nodes},
        "broadcast": {
            "bytes": 128 * MIB,
            "chunk_bytes": 4 * MIB,
            "neighbors": 4,
            "core": {"busy_backoff": 0.3},
        },
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return parse_scenario(data)


def test_homogeneous_completion_is_above_the_fluid_bound_and_near_the_chain_bound() -> None:
    b = simulate_network(broadcast_scenario())["broadcast"]
    assert b["all_completed"]
    last, bounds = b["completion_seconds"]["last"], b["bounds_seconds"]
    assert bounds["fluid"] == bounds["fluid_homogeneous"]
    assert last >= bounds["fluid"]
    assert last <= 1.5 * bounds["chain"]
    assert last < bounds["star"] / 3  # relaying beats serving everyone from the publisher


def test_broadcast_runs_are_deterministic() -> None:
    a = simulate_network(broadcast_scenario(seed=2))
    b = simulate_network(broadcast_scenario(seed=2))
    assert a["broadcast"]["completion_times"] == b["broadcast"]["completion_times"]
    assert a["calendar_entries"] == b["calendar_entries"]


def test_corrupt_chunks_are_blamed_and_everyone_honest_still_completes() -> None:
    r = simulate_network(broadcast_scenario(nodes=12, adversaries={"corrupt": 2}))
    b = r["broadcast"]
    assert b["blames"] > 0
    assert b["core_stats"]["chunks_invalid"] > 0
    assert b["all_completed"]


def test_a_slow_sender_does_not_stall_the_swarm() -> None:
    fast = simulate_network(broadcast_scenario(nodes=12))["broadcast"]
    slowed = simulate_network(broadcast_scenario(nodes=12, adversaries={"slow": 2, "slow_upload_mbps": 1}))
    b = slowed["broadcast"]
    assert b["all_completed"]
    assert b["completion_seconds"]["median"] < 2 * fast["completion_seconds"]["median"]


def test_nodes_that_crash_or_leave_midway_do_not_stop_the_others() -> None:
    r = simulate_network(
        broadcast_scenario(nodes=16, churn={"leaves": 2, "crashes": 2, "joins": 2, "start": 2, "end": 8})
    )
    b = r["broadcast"]
    assert b["receivers_alive"] == 16 - 1 - 4 + 2
    assert b["all_completed"]


def test_a_regenerated_results_file_is_byte_identical(tmp_path: Path) -> None:
    """A network-mode run is a pure function of its scenario and seed, and so is its results.json:
    the run's wall time is printed, not written (it made every committed file differ on rerun)."""
    from swarmnode.sim.run import write_results

    first, second = tmp_path / "first", tmp_path / "second"
    write_results(simulate_network(broadcast_scenario(seed=2)), first)
    write_results(simulate_network(broadcast_scenario(seed=2)), second)
    assert (first / "results.json").read_bytes() == (second / "results.json").read_bytes()
    assert b"wall_seconds" not in (first / "results.json").read_bytes()
