"""Learning mode: real learners exchange rollouts through the gossip core, reproducibly.

The tests that run learners cost ~30 s of CPU together (imports, a 60-step warm start, three 2-agent
2-round runs), so they are marked slow: ``pytest -m slow tests/sim/test_learning.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from swarmnode.errors import ConfigError
from swarmnode.sim.learning import merge_seeds, parse_learning, run_learning
from swarmnode.train.precision import bf16_supported


def scenario(cache: Path, **learning: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "agents": 2,
        "rounds": 2,
        "seeds": [0],
        "mixing": "sapo",
        "local_groups": 4,
        "external_groups": 4,
        "prompts_per_round": 8,
        "group_size": 4,
        "max_new_tokens": 4,
        "heldout_size": 4,
        # A short supervised pass: enough for some non-zero rewards (groups with signal), cheap.
        "warm_start_steps": 60,
        "cache_dir": str(cache),
        "threads": 1,
    }
    base.update(learning)
    return {"simulation": {"mode": "learning"}, "learning": base}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sim-cache")


@pytest.fixture(scope="module")
def sharing_run(cache: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_learning(scenario(cache), tmp_path_factory.mktemp("run-a"))


def without_timing(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k not in ("timing", "wall_seconds")}


@pytest.mark.slow
def test_the_same_scenario_and_seed_reproduce_the_run_bit_for_bit(
    cache: Path, sharing_run: dict[str, Any], tmp_path: Path
) -> None:
    again = run_learning(scenario(cache), tmp_path)
    assert without_timing(again) == without_timing(sharing_run)  # rewards, losses, counts, held-out
    hashes = [a["weights_sha256"] for a in sharing_run["runs"][0]["agents"]]
    assert [a["weights_sha256"] for a in again["runs"][0]["agents"]] == hashes
    assert hashes[0] != hashes[1]  # the two agents really are different learners
    assert (tmp_path / "learning.json").is_file()


@pytest.mark.slow
def test_seeds_run_apart_and_merged_are_the_run_over_every_seed(cache: Path, tmp_path: Path) -> None:
    both = run_learning(scenario(cache, seeds=[0, 1]), tmp_path / "both")
    parts = [run_learning(scenario(cache, seeds=[s]), tmp_path / f"seed-{s}") for s in (1, 0)]
    merged = merge_seeds(scenario(cache, seeds=[0, 1]), parts, tmp_path / "merged")
    assert [r["seed"] for r in merged["runs"]] == [0, 1]  # the scenario's order, not the parts'
    assert without_timing(merged) == without_timing(both)  # records, summary and scenario
    assert merged["wall_seconds"] == pytest.approx(sum(p["wall_seconds"] for p in parts))
    assert (tmp_path / "merged" / "learning.json").is_file()
    with pytest.raises(ValueError, match=r"seed\(s\) \[1\]"):
        merge_seeds(scenario(cache, seeds=[0, 1]), parts[1:], tmp_path / "short")


@pytest.mark.slow
def test_external_groups_reach_the_other_agent_and_are_trained_on(sharing_run: dict[str, Any]) -> None:
    first, second = sharing_run["runs"][0]["agents"]
    for me, other in ((first, second), (second, first)):
        # Every round, the peer's whole batch (8 groups) arrived through gossip and admission ...
        assert me["external_received"] == [8, 8]
        assert me["external_sources"] == {other["name"]: 16}
        assert me["gossip"]["accepted"] == 2 and me["gossip"]["rejected"] == 0
        assert me["admission"] == {"accepted": 2}
        # ... and SAPO's J = 4 picked some with signal into the update.
        assert 0 < sum(me["external_used"]) <= 8
        assert all(used <= 4 for used in me["external_used"])


@pytest.mark.slow
def test_agents_sample_with_the_configured_engine(cache: Path, tmp_path: Path) -> None:
    """The hf engine (transformers' generate) runs the same exchange as the torch engine."""
    result = run_learning(scenario(cache, engine="hf"), tmp_path)
    assert result["learning"]["engine"] == "hf"
    for agent in result["runs"][0]["agents"]:
        assert agent["external_received"] == [8, 8] and sum(agent["own_used"]) > 0


@pytest.mark.skipif(not bf16_supported(torch.device("cpu")), reason="this CPU has no bfloat16 arithmetic")
def test_a_bf16_scenario_trains_every_agent_in_bf16(
    cache: Path, sharing_run: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from swarmnode.train import trainer as trainer_module

    precisions: list[str] = []
    real = trainer_module.update_precision

    def spy(precision: Any, device: torch.device) -> Any:
        precisions.append(precision)
        return real(precision, device)

    monkeypatch.setattr(trainer_module, "update_precision", spy)
    result = run_learning(scenario(cache, precision="bf16"), tmp_path)
    assert result["learning"]["precision"] == "bf16"
    assert precisions and set(precisions) == {"bf16"}  # every update's forward passes
    for agent, fp32_agent in zip(result["runs"][0]["agents"], sharing_run["runs"][0]["agents"], strict=True):
        assert sum(agent["own_used"]) > 0 and agent["external_received"] == [8, 8]
        assert agent["weights_sha256"] != fp32_agent["weights_sha256"]  # other arithmetic, other weights


@pytest.mark.slow
def test_no_external_groups_means_no_exchange(cache: Path, tmp_path: Path) -> None:
    result = run_learning(scenario(cache, local_groups=8, external_groups=0), tmp_path)
    for agent in result["runs"][0]["agents"]:
        assert agent["external_received"] == [0, 0]
        assert agent["external_used"] == [0, 0]
        assert agent["gossip"]["published"] == 0 and agent["gossip"]["pulls_started"] == 0
        assert agent["admission"] == {}
        assert sum(agent["own_used"]) > 0


def test_unknown_or_invalid_keys_are_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="agnets"):
        parse_learning({"learning": {"agnets": 2}})
    with pytest.raises(ConfigError, match=r"learning\.mixing"):
        parse_learning({"learning": {"mixing": "gossip"}})
    with pytest.raises(ConfigError, match="shared_tasks"):
        parse_learning({"learning": {"mixing": "hacpo", "external_groups": 8}})
    with pytest.raises(ConfigError, match=r"learning\.engine must be one of"):
        parse_learning({"learning": {"engine": "jax"}})
    with pytest.raises(ConfigError, match=r"learning\.precision must be one of"):
        parse_learning({"learning": {"precision": "fp16"}})
    assert parse_learning({"learning": {}}).precision == "fp32"
    assert parse_learning({"learning": {"engine": "hf"}}).engine == "hf"
    assert parse_learning({"learning": {}}).engine == "torch"
    spec = parse_learning(
        {"learning": {"seeds": [3, 4], "models": [{"name": "tiny"}, {"name": "s", "overrides": {"x": 1}}]}}
    )
    assert spec.seeds == (3, 4)
    assert [spec.model_of(i).name for i in range(3)] == ["tiny", "s", "tiny"]


#: Two families the tiny alphabet writes: 1-digit sums and differences, 1-digit products.
FAMILIES = [
    {
        "name": "chain_sum",
        "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
        "prompt_format": "compact",
    },
    {
        "name": "products",
        "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
        "prompt_format": "compact",
    },
]


@pytest.mark.slow
def test_specialists_are_warm_started_each_on_its_own_family_and_evaluated_on_every_family(
    cache: Path, tmp_path: Path
) -> None:
    result = run_learning(
        scenario(cache, datasets=FAMILIES, specialists=True, heldout_size=20, warm_start_steps=150), tmp_path
    )
    first, second = result["runs"][0]["agents"]
    assert (first["warm_family"], second["warm_family"]) == ("chain_sum", "products")
    for agent in (first, second):
        curves = agent["heldout_by_family"]
        assert set(curves) == {"chain_sum", "products"} and set(curves["products"]) == {"0", "2"}
        for r in ("0", "2"):  # the overall figure is the mean over families
            assert agent["heldout"][r] == pytest.approx((curves["chain_sum"][r] + curves["products"][r]) / 2)
    # Each warm start learnt its own family better than the other agent's (150 supervised steps).
    assert first["heldout_by_family"]["chain_sum"]["0"] > second["heldout_by_family"]["chain_sum"]["0"]
    assert second["heldout_by_family"]["products"]["0"] > first["heldout_by_family"]["products"]["0"]
    # Both train on the union, so each admits the other's groups of both families.
    assert first["admission"] == {"accepted": 2} and second["admission"] == {"accepted": 2}
    summary = result["summary"]["specialists"]
    assert summary["own_start"]["mean"] > summary["others_start"]["mean"]
    assert result["learning"]["datasets"][1]["name"] == "products"


def test_configured_datasets_are_checked_by_entry() -> None:
    spec = parse_learning({"learning": {"datasets": FAMILIES, "specialists": True, "agents": 3}})
    assert list(spec.families()) == ["chain_sum", "products"]
    assert [spec.warm_family(i) for i in range(3)] == ["chain_sum", "products", "chain_sum"]
    assert spec.training_mixture(0).specs[1].name == "products"
    assert parse_learning({"learning": {"datasets": FAMILIES}}).warm_family(0) is None
    bad_key = [{**FAMILIES[0], "config": {"max_term": 2}}]
    with pytest.raises(ConfigError, match=r"learning\.datasets\[0\] \(chain_sum\).*max_term"):
        parse_learning({"learning": {"datasets": bad_key}})
    with pytest.raises(ConfigError, match=r"learning\.datasets\[0\] \(no_such_family\)"):
        parse_learning({"learning": {"datasets": [{"name": "no_such_family"}]}})
    with pytest.raises(ConfigError, match=r"learning\.datasets\[1\] must be a table"):
        parse_learning({"learning": {"datasets": [FAMILIES[0], {"name": "products", "wieght": 2}]}})
    with pytest.raises(ConfigError, match="at least two"):
        parse_learning({"learning": {"datasets": FAMILIES[:1], "specialists": True}})
    with pytest.raises(ConfigError, match="not both"):
        parse_learning({"learning": {"datasets": FAMILIES, "mixture": "default"}})


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Any:
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)  # run_learning sets the thread count for the whole process


@pytest.mark.slow
def test_warm_starts_built_ahead_in_parallel_are_the_ones_every_run_then_reads(tmp_path: Path) -> None:
    # simulations/*.py build a study's warm starts first (``warm_all``, one per distinct start, in
    # ``--jobs`` processes), so its runs never build the same one at once; each run then reads them.
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "simulations"))
    from learning_runs import warm_all

    from swarmnode.sim.learning import cache_of, warm_policy_dir, warm_start_keys

    cache = tmp_path / "cache"
    specialists = scenario(cache, datasets=FAMILIES, specialists=True, warm_start_steps=5, heldout_size=0)
    mixture = scenario(cache, datasets=FAMILIES, warm_start_steps=5, heldout_size=0)
    spec = parse_learning(specialists)
    keys = warm_start_keys(spec)
    assert keys == [("tiny", "chain_sum"), ("tiny", "products")]
    assert warm_start_keys(parse_learning(mixture)) == [("tiny", None)]
    warm_all([specialists, mixture, specialists], jobs=2)  # the repeated scenario adds nothing
    built = sorted((cache / "models").iterdir())
    expected = sorted(
        [warm_policy_dir(spec, key, cache_of(spec, tmp_path)) for key in keys]
        + [warm_policy_dir(parse_learning(mixture), ("tiny", None), cache)]
    )
    assert built == expected
    stamps = {path: path.stat().st_mtime_ns for path in built}
    result = run_learning(specialists, tmp_path / "run")
    assert sorted((cache / "models").iterdir()) == built  # read, none built again
    assert {path: path.stat().st_mtime_ns for path in built} == stamps
    assert result["timing"]["warm_start_seconds"] < 5.0


@pytest.mark.slow
def test_with_a_round_demand_each_agent_pulls_only_that_many_peer_batches_a_round(
    cache: Path, tmp_path: Path
) -> None:
    # Issue #18: three agents, each wanting one peer's batch a round, drawn at the round's end
    # (core.demand), so a round's batch arrives for the next round's update; without a demand
    # each would pull both peers' batches every round (16 groups).
    result = run_learning(scenario(cache, agents=3, rounds=3, round_demand=1), tmp_path)
    for agent in result["runs"][0]["agents"]:
        assert agent["external_received"] == [0, 8, 8]
        assert sum(agent["external_sources"].values()) == 16
        assert agent["gossip"]["offers_selected"] == 2  # rounds 0 and 1; round 2's after the run
        assert agent["gossip"]["accepted"] == 2 and agent["gossip"]["rejected"] == 0
