"""The ``swarmnode`` command line: ``config large-swarm`` prints a large swarm's [swarm] settings."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from swarmnode.cli import EXIT_OK, EXIT_USAGE, build_parser, main
from swarmnode.config import Config, load_config


@pytest.fixture(autouse=True)
def no_config_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The effective config is the file's and the flags' alone (SWARMNODE_* would change it)."""
    import os

    for name in list(os.environ):
        if name.startswith("SWARMNODE_"):
            monkeypatch.delenv(name)


def large_swarm(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[str, dict[str, Any]]:
    assert main(["config", "large-swarm", *args]) == EXIT_OK
    out = capsys.readouterr().out
    return out, tomllib.loads(out)["swarm"]


def refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["config", *args]) == EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err


@pytest.mark.parametrize(
    ("nodes", "buckets", "read"),
    [(1, 1, 0), (64, 1, 0), (65, 2, 2), (1000, 16, 2), (10_000, 157, 2), (4_194_304, 65_536, 2)],
)
def test_large_swarm_spreads_records_over_one_bucket_per_64_nodes_and_reads_two(
    capsys: pytest.CaptureFixture[str], nodes: int, buckets: int, read: int
) -> None:
    out, swarm = large_swarm(capsys, "--nodes", str(nodes))
    # The defaults: mixing = "none" trains on no peer's group, so the least demand.
    assert swarm == {"round_demand": 2, "announce_buckets": buckets, "read_buckets": read, "relay": False}
    assert out.index("[swarm]") > 0 and out.startswith("# swarmnode config large-swarm")


def test_large_swarm_says_announce_buckets_is_swarm_wide_and_why_relay_stays_off(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out, _ = large_swarm(capsys, "--nodes", "10000")
    text = " ".join(line.removeprefix("# ") for line in out.splitlines())
    assert "It must be the same on every node of the swarm" in text
    assert "bootstrap operator publishes it" in text
    assert "Relaying stays off with a demand: a node pulls right after the round, before relays" in text
    assert 'mixing = "none" trains on no peer\'s group' in text


@pytest.mark.parametrize(
    ("swarm_keys", "prompts", "demand", "basis"),
    [
        ('mixing = "sapo"\nexternal_groups = 64', 16, 6, "= 6, rounded up: 6"),
        ('mixing = "hacpo"\nexternal_groups = 6', 4, 3, "= 2.25, rounded up: 3"),
        ('mixing = "sapo"\nexternal_groups = 5', 4, 2, "= 1.875, rounded up: 2"),
        ('mixing = "replay"\nexternal_groups = 8', 16, 2, "= 0.75, rounded up: 1, at least 2"),
        ('mixing = "replay"\nexternal_groups = 0', 16, 2, "external_groups = 0 trains on no peer's group"),
        ('mixing = "none"\nexternal_groups = 64', 1, 2, 'mixing = "none" trains on no peer\'s group'),
    ],
)
def test_large_swarm_round_demand_is_one_and_a_half_external_groups_in_batches_from_the_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, swarm_keys: str, prompts: int, demand: int, basis: str
) -> None:
    path = tmp_path / "swarmnode.toml"
    path.write_text(f"[rollout]\nprompts_per_round = {prompts}\n[swarm]\n{swarm_keys}\n", encoding="utf-8")
    out, swarm = large_swarm(capsys, "--nodes", "1000", "--config", str(path))
    assert swarm["round_demand"] == demand
    assert basis in " ".join(line.removeprefix("# ") for line in out.splitlines())


def test_large_swarm_reads_a_homes_config_and_set_overrides(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "swarmnode.toml").write_text('[swarm]\nmixing = "sapo"\nexternal_groups = 32\n')
    _, swarm = large_swarm(capsys, "--nodes", "500", "--home", str(tmp_path))
    assert swarm["round_demand"] == 3  # 1.5 x 32 / 16
    _, swarm = large_swarm(
        capsys, "--nodes", "500", "--home", str(tmp_path), "--set", "rollout.prompts_per_round=4"
    )
    assert (swarm["round_demand"], swarm["announce_buckets"]) == (12, 8)


def test_the_printed_block_is_a_valid_swarm_table(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out, _ = large_swarm(capsys, "--nodes", "10000")
    path = tmp_path / "c.toml"
    path.write_text(out, encoding="utf-8")
    config = load_config(path, environ={})
    assert config.swarm.model_dump(include={"round_demand", "announce_buckets", "read_buckets", "relay"}) == {
        "round_demand": 2,
        "announce_buckets": 157,
        "read_buckets": 2,
        "relay": False,
    }
    assert config.model_dump(exclude={"swarm"}) == Config().model_dump(exclude={"swarm"})


@pytest.mark.parametrize("nodes", ["0", "-3"])
def test_large_swarm_refuses_fewer_than_one_node(capsys: pytest.CaptureFixture[str], nodes: str) -> None:
    assert f"--nodes must be at least 1 (got {nodes})" in refused(capsys, "large-swarm", "--nodes", nodes)


def test_large_swarm_refuses_a_swarm_beyond_the_bucket_limit(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(capsys, "large-swarm", "--nodes", "4194305")
    assert "--nodes 4194305 needs swarm.announce_buckets = 65537, above its limit 65536" in err


def test_large_swarm_needs_nodes_and_nodes_is_for_large_swarm_alone(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert "`swarmnode config large-swarm` needs --nodes N" in refused(capsys, "large-swarm")
    assert "--nodes is for `swarmnode config large-swarm`" in refused(capsys, "reference", "--nodes", "9")


def test_large_swarm_refuses_a_bad_config_file_naming_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    absent = tmp_path / "absent.toml"
    assert f"config file {absent} does not exist" in refused(
        capsys, "large-swarm", "--nodes", "9", "--config", str(absent)
    )
    broken = tmp_path / "broken.toml"
    broken.write_text("[swarm\n", encoding="utf-8")
    err = refused(capsys, "large-swarm", "--nodes", "9", "--config", str(broken))
    assert f"config file {broken} is not valid TOML" in err
    invalid = tmp_path / "invalid.toml"
    invalid.write_text("[swarm]\nexternal_groups = -1\n", encoding="utf-8")
    err = refused(capsys, "large-swarm", "--nodes", "9", "--config", str(invalid))
    assert "swarm.external_groups = -1" in err and str(invalid) in err


def test_config_help_describes_large_swarm() -> None:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command")
    config_help = subparsers.choices["config"].format_help()  # type: ignore[attr-defined]
    assert "large-swarm" in config_help and "--nodes N" in config_help
    assert "must be the same on every node" in " ".join(config_help.split())


def test_readmes_large_swarm_example_is_the_commands_output(capsys: pytest.CaptureFixture[str]) -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    out, _ = large_swarm(capsys, "--nodes", "10000")
    assert f"```toml\n{out}```\n" in readme, (
        "README's large-swarm example is stale: paste `swarmnode config large-swarm --nodes 10000`"
    )
