"""Adversarial peers against a live swarm: for every attack, no poisoned item is accepted, and
each attack really reached the honest nodes (they refused its items, or its streams and records
were delivered). Throughput under attack is measured by bench/adversarial.py, never asserted.

Scenarios and the definition of "poisoned" for each: swarmnode/testing/attacker.py and
swarmnode/testing/adversarial.py. Corrupt weight chunks are not a scenario yet (no broadcast).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from swarmnode.testing import LocalSwarm
from swarmnode.testing.adversarial import measure, run_swarm
from swarmnode.testing.attacker import SCENARIOS

pytestmark = [pytest.mark.network, pytest.mark.fault, pytest.mark.timeout(1200)]

ROUND_SECONDS = 2.0
WINDOW = 16.0
# Items each scenario sends that an honest node must refuse (when it pulls them at all).
REFUSED_AS = {
    "forged_signature": {"bad_signature", "banned"},
    "replay": {"replay", "duplicate", "banned"},
    "prompt_mismatch": {"prompt_mismatch", "banned"},
    "oversized": {"too_large", "malformed", "banned"},
    "sybil_flood": {"prompt_mismatch", "banned"},
}


def test_no_poisoned_item_is_accepted_under_any_attack(local_swarm: Any, tmp_path: Path) -> None:
    swarm: LocalSwarm = local_swarm(ROUND_SECONDS)
    timeline, logs, ids = run_swarm(swarm, window=WINDOW, scenarios=list(SCENARIOS), timeout=900)
    results = {r.name: r for r in measure(timeline, logs, ids)}
    print(json.dumps([r.as_dict() for r in results.values()]))
    assert set(results) == set(SCENARIOS)
    for name, result in results.items():
        assert result.poisoned == 0, result
        if name in REFUSED_AS:
            assert result.refused, f"{name}: the honest nodes never saw the attack: {result}"
            assert set(result.refused) <= REFUSED_AS[name], result
    # Inflated groups are admitted (they are valid), each with our verifier's rewards.
    assert results["inflated_reward"].accepted_from_attacker > 0, results["inflated_reward"]
    assert results["oversized"].sent.get("oversized_request_too_large", 0) > 0, results["oversized"]
    assert results["slow_loris"].sent.get("slow_streams_opened", 0) > 0, results["slow_loris"]
    assert results["dht_spam"].sent.get("spam_records_stored", 0) > 0, results["dht_spam"]
