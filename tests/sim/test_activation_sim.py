"""Activation policies in the simulator: the real ActivationCore against fixed policies and the formula."""

from __future__ import annotations

from typing import Any

import pytest

from swarmnode.sim.activation import simulate_activation
from swarmnode.sim.scenario import parse_scenario


def activation(**values: Any) -> Any:
    spec: dict[str, Any] = {
        "workers": 10,
        "worker_rate": {"distribution": "uniform", "low": 0.5, "high": 2.0},
        "worker_price": {"distribution": "uniform", "low": 1, "high": 10},
        "step_seconds": 10,
        "batch": 40,
        "staleness": 2,
        "broadcast_seconds": 1,
        "steps": 60,
        "policies": ["planner", "all", "cheapest:2"],
    }
    spec.update(values)
    return parse_scenario({"simulation": {"mode": "network", "seed": 2}, "activation": spec}).activation


def by_policy(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["policy"]: r for r in result["policies"]}


def test_measured_utilization_and_cost_match_the_formula() -> None:
    runs = by_policy(simulate_activation(activation(), seed=2))
    for run in runs.values():
        assert run["utilization"] == pytest.approx(run["predicted"]["utilization"], abs=0.05)
        assert run["cost_per_step"] == pytest.approx(run["predicted"]["cost_per_step"], rel=0.1)


def test_the_planner_keeps_the_learner_busy_for_less_than_all_on() -> None:
    runs = by_policy(simulate_activation(activation(), seed=2))
    planner, all_on, starved = runs["planner"], runs["all"], runs["cheapest:2"]
    assert planner["plan"]["feasible"]
    assert planner["utilization"] >= 0.95
    assert planner["cost_per_step"] < 0.8 * all_on["cost_per_step"]
    assert starved["utilization"] < 0.9  # too few workers: the learner waits


def test_too_few_workers_is_reported_infeasible_and_all_are_used() -> None:
    runs = by_policy(simulate_activation(activation(workers=2, policies=["planner"]), seed=2))
    plan = runs["planner"]["plan"]
    assert not plan["feasible"]
    assert len(runs["planner"]["active_workers"]) == 2


def test_the_simulated_learner_drives_the_cores_tail_latency_model_through_its_deliveries() -> None:
    # S * T = 1 * 10 s, D = 1 s; one completion per delivery at 0.1-0.15/s models a tail of 2 / rate
    # = 13-20 s: once the workers deliver, none meets the bound, and the core says it planned without it.
    spec = activation(
        workers=4,
        worker_rate={"distribution": "uniform", "low": 0.1, "high": 0.15},
        batch=4,
        staleness=1,
        steps=5,
        policies=["planner"],
    )
    plan = by_policy(simulate_activation(spec, seed=2))["planner"]["plan"]
    assert not plan["feasible"] and "no worker meets D + T_gen_tail <= S * T" in plan["reason"]
