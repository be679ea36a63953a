"""A poisoning peer in a live swarm: every forged or poisoned item is refused for its own reason,
the offender is banned (and the ban is on disk), honest nodes keep learning from each other.

Bootstrap + 3 honest ``swarmnode run`` processes + ``swarmnode/testing/adversary.py`` on 127.0.0.1.
The adversary's items and the verdict each must get are listed in its module docstring and
in ``phase2.json``; the honest nodes are measured only from outside: /status and their ledgers.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from swarmnode.admit import ScoreRule
from swarmnode.core.rounds import round_start
from swarmnode.store import Ledger
from swarmnode.testing.process import WaitTimedOut

from .support import LocalSwarm, metric, read_json, start_adversary

pytestmark = [pytest.mark.network, pytest.mark.timeout(600)]

ROUND_SECONDS = 2.0
NODES = ("node-0", "node-1", "node-2")
# The gossip core forgets a handled digest remember_rounds (4) after its verdict; the publisher
# serves its own item for keep_rounds + 1 (3) rounds first. Past that, a replayed digest is pulled
# again and reaches admission, which remembers envelope ids for max_age_s (300 s).
REMEMBER_ROUNDS = 4
FORGOTTEN_AFTER_ROUNDS = 8


def tallies(status: dict[str, Any]) -> dict[str, dict[str, float]]:
    by_sender: dict[str, dict[str, float]] = status["external_by_sender"]
    return by_sender


def groups_from(status: dict[str, Any], sender: str) -> int:
    return int(tallies(status).get(sender, {}).get("groups", 0))


def verdict_report(swarm: LocalSwarm, adv_home: Path, expected: Counter[str]) -> str:
    """What each node judged and what the adversary served to whom: the end of a failure's message
    (which a CI log shows), for a wait that timed out."""
    statuses = swarm.statuses() or {}
    judged = {n: {k: v for k, v in s["admission"].items() if k != "accepted"} for n, s in statuses.items()}
    log = adv_home / "process.log"
    served = [line for line in log.read_text().splitlines() if "served" in line] if log.exists() else []
    lines = [f"expected verdicts: {dict(expected)}", *(f"{n} judged: {v}" for n, v in judged.items())]
    return "\n".join([*lines, *served[-12:]])


def test_poisoned_and_forged_groups_are_rejected_the_offender_is_banned_and_honest_traffic_continues(
    local_swarm: Any,
) -> None:
    swarm: LocalSwarm = local_swarm(ROUND_SECONDS)
    boot = swarm.start_bootstrap()[0]
    for i, name in enumerate(NODES):
        swarm.write_node_config(name, i)
        swarm.start_node(name)
    adv_home, adversary = start_adversary(swarm, boot, ROUND_SECONDS)

    # 1. An honest swarm: every node admits groups from both others.
    up = swarm.wait_statuses(lambda s: True, "every node's API")
    honest = {name: up[name]["peer_id"] for name in NODES}
    libp2p = {name: up[name]["libp2p_peer_id"] for name in NODES}
    swarm.wait_statuses(
        lambda s: all(groups_from(s[n], honest[o]) > 0 for n in NODES for o in NODES if o != n),
        "honest nodes to admit each other's groups",
    )

    # 2. Phase 1: the adversary keeps a copy of an honest envelope and offers one valid envelope
    # whose group claims reward 1 for three wrong answers (and 0 for the right one).
    (adv_home / "go-phase1").touch()
    phase1 = swarm.wait(lambda: read_json(adv_home / "phase1.json"), "the adversary's phase 1")
    main = adversary["main"]
    swarm.wait_statuses(
        lambda s: all(groups_from(s[n], main) == len(phase1["items"]) for n in NODES),
        "every node to admit the inflated groups",
    )
    # Every verdict on phase 1's items was reached by now: on a loaded machine that can be rounds
    # after the round they were announced in, and a window counted from the announcement alone
    # could open while a node still remembered the digest replayed below (no verdict then).
    phase1_judged = time.time()
    captured = phase1["captured"]
    assert captured["signer"] in honest.values()
    origin = next(n for n in NODES if honest[n] == captured["signer"])
    assert captured["owner"] == libp2p[origin]

    # 3. Phase 2 once every core has forgotten the digests (so the replays reach admission).
    ready_at = max(
        round_start(captured["round"] + FORGOTTEN_AFTER_ROUNDS, ROUND_SECONDS),
        round_start(phase1["round"] + FORGOTTEN_AFTER_ROUNDS - 2, ROUND_SECONDS),
        phase1_judged + (REMEMBER_ROUNDS + 1) * ROUND_SECONDS,
    )
    swarm.wait(lambda: time.time() >= ready_at, "the replay window")
    (adv_home / "go-phase2").touch()
    phase2 = swarm.wait(lambda: read_json(adv_home / "phase2.json"), "the adversary's phase 2")
    items = phase2["items"]
    expected = Counter(i["expected"] for i in items if i["expected"] != "accepted")

    def verdicts_in(s: dict[str, dict[str, Any]]) -> bool:
        return all(
            sum(v for k, v in s[n]["admission"].items() if k != "accepted") >= sum(expected.values())
            for n in NODES
        )

    try:
        after = swarm.wait_statuses(verdicts_in, "every node's verdicts on the poison", timeout=120)
    except WaitTimedOut as exc:
        raise AssertionError(f"{exc}\n{verdict_report(swarm, adv_home, expected)}") from None
    attack_done = time.time()

    for name in NODES:
        status = after[name]
        rejections = {k: v for k, v in status["admission"].items() if k != "accepted"}
        # Each poisoned item was refused for its own reason, and honest traffic caused no refusal.
        # Admission runs in its own thread, so a ban reaches the gossip core a moment after the
        # verdict: pulls already in flight from the banned peer may add "banned" verdicts (only a
        # banned peer, an adversary's, can earn one).
        assert rejections.pop("banned", 0) >= expected.get("banned", 0), (name, rejections)
        assert rejections == {k: v for k, v in expected.items() if k != "banned"}, (name, rejections)
        assert metric(status, "groups_rejected", "reason=prompt_mismatch") == 1
        # Claimed rewards are never used: the adversary's two admitted groups carry our verifier's
        # rewards (1 for the one right answer, 0 for each wrong answer it claimed 1 for).
        local = [i["local"] for i in (*phase1["items"], *items) if i["expected"] == "accepted"]
        claimed = [i["claimed"] for i in (*phase1["items"], *items) if i["expected"] == "accepted"]
        tally = tallies(status)[main]
        assert {k: tally[k] for k in ("groups", "completions", "reward_sum", "claimed_reward_sum")} == {
            "groups": len(local),
            "completions": sum(len(r) for r in local),
            "reward_sum": sum(map(sum, local)),
            "claimed_reward_sum": sum(map(sum, claimed)),
        }
        assert sum(map(sum, local)) == len(local) != sum(map(sum, claimed))
        assert adversary["sybil"] not in tallies(status) and adversary["forger"] not in tallies(status)
        # The gossip core stopped pulling from the adversary's transport peer.
        assert status["gossip"]["bans"] >= 1
        assert metric(status, "bans") == 2  # the main signer and the transport peer, once each

    # 4. Honest traffic continues: each node admits both other nodes' groups and trains on them.
    def progressed(s: dict[str, dict[str, Any]]) -> bool:
        return all(
            groups_from(s[n], honest[o]) > groups_from(after[n], honest[o])
            and metric(s[n], "groups_used", "source=external")
            > metric(after[n], "groups_used", "source=external")
            for n in NODES
            for o in NODES
            if o != n
        )

    swarm.wait_statuses(progressed, "honest traffic after the attack", timeout=120)

    # 5. The bans are on disk: stop every process, then read each ledger.
    swarm.close()
    ban_seconds = ScoreRule().ban_seconds
    report = {}
    for name in NODES:
        with Ledger(swarm.homes[name].ledger) as ledger:
            bans = ledger.active_bans(time.time())
            assert main in bans and adversary["libp2p_peer_id"] in bans, (name, bans)
            assert set(bans) == {main, adversary["libp2p_peer_id"]}  # no honest peer was banned
            assert ledger.rejection_counts(main) == {
                "duplicate": 1,
                "invalid_payload": 1,
                "prompt_mismatch": 1,
            }
            assert ledger.rejection_counts(adversary["libp2p_peer_id"]) == {
                "malformed": 1,
                "too_large": 1,
                "replay": 2,
                "bad_signature": 1,
            }
            for peer in honest.values():
                assert ledger.rejection_counts(peer) == {}
            report[name] = {
                "ban_after_s": {
                    "signer": round(bans[main] - ban_seconds - phase2["time"], 2),
                    "transport": round(bans[adversary["libp2p_peer_id"]] - ban_seconds - phase2["time"], 2),
                },
                "rejections": {k: v for k, v in after[name]["admission"].items() if k != "accepted"},
            }
    print(
        json.dumps(
            {"origin_of_replayed_envelope": origin, "attack_s": attack_done - phase2["time"], **report}
        )
    )
