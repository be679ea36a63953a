"""Weight broadcast in the simulator: the real BroadcastCore against the bounds of ALGORITHMS.md §6."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

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


def simulate_versions(
    scenario: Any, later_versions: tuple[float, ...], staleness_bound: int
) -> dict[str, Any]:
    """``simulate_network``'s broadcast path, with more versions published after the first."""
    from swarmnode.sim.broadcast import BroadcastLayer
    from swarmnode.sim.world import World

    world = World(scenario)
    layer = BroadcastLayer(
        world, scenario.broadcast, later_versions=later_versions, staleness_bound=staleness_bound
    )
    world.attach(layer)
    world.start()
    world.sim.run(scenario.end_time())
    return layer.results()


@pytest.mark.parametrize(
    ("staleness_bound", "outcome"),
    [(1, "waits for the receive in flight"), (0, "abandons the receive in flight")],
)
def test_a_second_manifest_mid_broadcast_leaves_every_node_on_the_newest_version(
    staleness_bound: int, outcome: str
) -> None:
    """The worker's real ReceiverCore on every receiver: v1 lands while v0 is still arriving (v0
    takes 3 to 4 s alone here); within S it waits for v0, beyond S it abandons v0; either way
    every receiver ends on v1."""
    scenario = broadcast_scenario(nodes=8, broadcast={"bytes": 32 * MIB, "chunk_bytes": 2 * MIB})
    b = simulate_versions(scenario, later_versions=(1.0,), staleness_bound=staleness_bound)
    v = b["versions"]
    assert b["all_completed"] and b["receivers_alive"] == 7
    assert v["final"] == 1 and set(v["installed"].values()) == {1}
    stats = v["receiver_stats"]
    if outcome == "waits for the receive in flight":
        assert stats["receives_abandoned"] == 0 and stats["installed"] == 2 * 7
    else:
        assert stats["receives_abandoned"] == 7 and stats["installed"] == 7
    assert b["completion_seconds"]["first"] > 1.0  # nobody counts as complete before v1 exists


def test_a_single_version_run_has_no_versions_section() -> None:
    """The committed results of single-version scenarios stay byte-identical."""
    assert "versions" not in simulate_network(broadcast_scenario(nodes=4))["broadcast"]


def test_results_without_plots_are_the_same_file_with_no_pictures(tmp_path: Path) -> None:
    """``simulate --no-plots`` writes the results.json a run with plots writes (before, its own
    copy with the wall time in it), and nothing else."""
    from swarmnode.sim.run import write_results

    results = simulate_network(broadcast_scenario(seed=2))
    with_plots = write_results(results, tmp_path / "plots")
    without = write_results(results, tmp_path / "bare", plots=False)
    assert without == [tmp_path / "bare" / "results.json"] and len(with_plots) > 1
    assert without[0].read_bytes() == (tmp_path / "plots" / "results.json").read_bytes()
    assert sorted(p.name for p in (tmp_path / "bare").iterdir()) == ["results.json"]
