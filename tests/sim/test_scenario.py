"""Scenario files: every bad value is a ScenarioError naming its key; the CLI exits 2, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarmnode.cli import main
from swarmnode.sim.scenario import Dist, ScenarioError, parse_scenario

BASE = {"simulation": {"mode": "network"}, "gossip": {"rounds": 2}}


def with_(section: str, **values: object) -> dict:
    data = {k: dict(v) for k, v in BASE.items()}
    data.setdefault(section, {}).update(values)
    return data


@pytest.mark.parametrize(
    ("data", "key"),
    [
        (with_("network", loss=1.5), "network.loss"),
        (with_("network", upload_mbps=-3), "network.upload_mbps"),
        (
            with_("network", latency_ms={"distribution": "lognormal", "median": 10}),
            "network.latency_ms.sigma",
        ),
        (with_("network", latency_ms={"distribution": "zipf"}), "network.latency_ms.distribution"),
        (with_("nodes", count=0), "nodes.count"),
        (with_("nodes", cuont=3), "nodes.cuont"),
        (with_("gossip", rounds="many"), "gossip.rounds"),
        (with_("gossip", core={"pull_rate": -1}), "gossip.core"),
        (with_("gossip", core={"no_such_knob": 1}), "gossip.core.no_such_knob"),
        (with_("churn", crashes=50), "churn.leaves"),
        (with_("adversaries", forgers=10), "adversaries: forgers"),
        (with_("adversaries", forgers=5, copycats=5), "adversaries: forgers"),
        (with_("adversaries", silent=-1), "adversaries.silent"),
        (with_("simulation", mode="quantum"), "simulation.mode"),
        (with_("broadcast", bytes=10), "broadcast.chunk_bytes"),
        ({"simulation": {"mode": "network"}}, "a network-mode scenario needs"),
        (
            with_("activation", workers=2, step_seconds=1, batch=4, staleness=1, policies=["cheapest"]),
            "activation.policies[0]",
        ),
    ],
)
def test_a_bad_value_is_an_error_naming_its_key(data: dict, key: str) -> None:
    with pytest.raises(ScenarioError, match=key.replace("[", r"\[").replace("]", r"\]")):
        parse_scenario(data)


def test_distributions_sample_within_their_support() -> None:
    import random

    rng = random.Random(0)
    spec = parse_scenario(
        with_("network", upload_mbps={"distribution": "uniform", "low": 10, "high": 20},
              download_mbps={"distribution": "choice", "values": [1, 2], "weights": [0, 1]})
    ).network  # fmt: skip
    assert all(10 <= spec.upload_mbps.sample(rng) <= 20 for _ in range(100))
    assert {spec.download_mbps.sample(rng) for _ in range(20)} == {2.0}
    assert Dist.constant(3).median() == 3


def test_learning_mode_leaves_its_sections_to_the_learning_helper() -> None:
    scenario = parse_scenario({"simulation": {"mode": "learning"}, "agents": {"count": 8}})
    assert scenario.mode == "learning"
    assert scenario.raw["agents"] == {"count": 8}


def test_cli_reports_a_bad_scenario_with_exit_2_and_no_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[simulation]\nmode = "network"\n[gossip]\nrounds = 2\n[network]\nloss = 2.0\n')
    assert main(["simulate", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "network.loss" in err
    assert "Traceback" not in err


def test_cli_reports_a_missing_or_broken_file_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", str(tmp_path / "nope.toml")]) == 2
    broken = tmp_path / "broken.toml"
    broken.write_text("[simulation\n")
    assert main(["simulate", str(broken)]) == 2
    assert "not valid TOML" in capsys.readouterr().err
