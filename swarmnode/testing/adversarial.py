"""Run the attacker's scenarios against a live swarm and measure each one from the honest side.

Used by ``tests/fault/test_adversarial.py`` (asserts nothing poisoned got through) and
``bench/adversarial.py`` (prints the table). Bootstrap + 2 honest ``swarmnode run`` processes
under ``swarmnode.testing.hooked_node`` with an admission log each, + ``swarmnode.testing.attacker``.

Per scenario window, from the honest nodes' admission logs:

- ``poisoned``: verdicts that let attacker input in: any group accepted from bytes the
  attacker delivered, except in ``inflated_reward``, where the groups are valid and accepted,
  and poison means training on the claimed rewards instead of our verifier's;
- ``refused``: the attacker's items the honest nodes refused (the attack did reach them);
- ``honest_per_min``: groups admitted from the honest signers per minute (both nodes), and
  ``share``: that rate over the baseline window's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarmnode.testing.swarm import LocalSwarm

HONEST = ("node-0", "node-1")


@dataclass
class ScenarioResult:
    name: str
    window_s: float
    poisoned: int
    accepted_from_attacker: int
    refused: dict[str, int]
    honest_groups: int
    honest_per_min: float
    share: float | None
    sent: dict[str, int]

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def read_log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_swarm(
    swarm: LocalSwarm, *, window: float, scenarios: list[str], timeout: float
) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]], dict[str, str]]:
    """Start everything, run the attacker's scenarios, stop; return (timeline, logs, honest ids)."""
    boot = swarm.start_bootstrap()[0]
    logs = {}
    for i, name in enumerate(HONEST):
        swarm.write_node_config(name, i)
        logs[name] = swarm.root / name / "admissions.jsonl"
        swarm.start_hooked_node(
            name, swarm.root / "faults" / name, env={"SWARMNODE_ADMIT_LOG": str(logs[name])}
        )
    up = swarm.wait_statuses(lambda s: True, "the honest nodes' APIs")
    ids = {n: up[n]["peer_id"] for n in HONEST}

    def groups_from(s: dict[str, Any], sender: str) -> int:
        return int(s["external_by_sender"].get(sender, {}).get("groups", 0))

    swarm.wait_statuses(
        lambda s: groups_from(s["node-0"], ids["node-1"]) > 2 and groups_from(s["node-1"], ids["node-0"]) > 2,
        "the honest nodes to exchange groups",
    )
    home = swarm.root / "attacker"
    home.mkdir(parents=True, exist_ok=True)
    args = ["-m", "swarmnode.testing.attacker", "--home", str(home), "--peer", boot]
    args += [
        "--round-seconds",
        str(swarm.round_seconds),
        "--window",
        str(window),
        "--scenarios",
        ",".join(scenarios),
    ]
    swarm.start_process("attacker", args, home, identity=home / "none.key")
    swarm.wait(lambda: (home / "done.json").exists(), "the attacker's scenarios", timeout=timeout)
    timeline: list[dict[str, Any]] = json.loads((home / "timeline.json").read_text())
    swarm.close()
    return timeline, {n: read_log(p) for n, p in logs.items()}, ids


def measure(
    timeline: list[dict[str, Any]], logs: dict[str, list[dict[str, Any]]], honest_ids: dict[str, str]
) -> list[ScenarioResult]:
    honest = set(honest_ids.values())
    attackers = {entry["libp2p"] for entry in timeline if entry["libp2p"]}
    results = []
    baseline_rate: float | None = None
    for entry in timeline:
        start, end = entry["start"], entry["end"]
        signers = set(entry["signers"])
        window = [r for log in logs.values() for r in log if start <= r["t"] < end]
        from_attacker = [r for r in window if r["via"] in attackers or r.get("sender") in signers]
        accepted = [r for r in from_attacker if r["verdict"] == "accepted"]
        if entry["name"] == "inflated_reward":
            poisoned = sum(1 for r in accepted for g in r["groups"] if g["rewards"] == g["claimed"])
        else:
            poisoned = sum(max(1, len(r["groups"])) for r in accepted)
        refused: dict[str, int] = {}
        for r in from_attacker:
            if r["verdict"] != "accepted":
                refused[r["verdict"]] = refused.get(r["verdict"], 0) + 1
        honest_groups = sum(
            1 for r in window if r["verdict"] == "accepted" for g in r["groups"] if g["sender"] in honest
        )
        minutes = max(1e-9, (end - start) / 60.0)
        rate = honest_groups / minutes
        if entry["name"] == "baseline":
            baseline_rate = rate
        results.append(
            ScenarioResult(
                name=entry["name"],
                window_s=round(end - start, 1),
                poisoned=poisoned,
                accepted_from_attacker=len(accepted),
                refused=refused,
                honest_groups=honest_groups,
                honest_per_min=round(rate, 1),
                share=round(rate / baseline_rate, 2) if baseline_rate else None,
                sent=entry.get("sent", {}),
            )
        )
    return results
