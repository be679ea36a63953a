"""SIGKILL a swarm node at random instants inside each window of its life; it always restarts
from its last committed state and leaves nothing corrupt behind.

Bootstrap + 2 ``swarmnode run`` processes on 127.0.0.1 (checkpoint every round); the victim
runs with the node's own fault points on (``swarmnode.ops.faults``), which mark (and for
checkpoint writes, hold open) each window, so every kill lands where the trial says:

- ``generate``: making the round's rollouts; ``train``: the update, before its ledger commit;
- ``ckpt_partial`` / ``ckpt_unrenamed`` / ``ckpt_unpruned``: inside a checkpoint write (model
  file only; all files unrenamed; renamed but the oldest not pruned);
- ``receive``: admitting a group pulled from the other node;
- ``anytime``: a uniformly random instant of a round.

After every kill: every checkpoint under a final name verifies, the ledger opens with rounds
1..l (no gap, policy version = round) and c <= l <= c + 1 for the newest checkpoint c; rounds
up to a checkpoint are never rewritten later. Each restart logs that it resumed from exactly
c (the leftovers of an interrupted write never stop it), trains, and a final clean run leaves
no leftovers. Killing a rollout worker while it receives weight chunks is its own trial:
tests/fault/test_sigkill_receiving.py (figures in tests/fault/README.md).
"""

from __future__ import annotations

import json
import random
import time
from typing import Any

import pytest

from swarmnode.home import NodeHome
from swarmnode.testing import LocalSwarm

from .support import check_disk, facts, log_since, sigkill, start_hooked_node, wait_for_marker

pytestmark = [pytest.mark.network, pytest.mark.fault, pytest.mark.timeout(2400)]

ROUND_SECONDS = 2.0
VICTIM, PEER = "node-0", "node-1"
HOLD = 1.0  # seconds each checkpoint window is held open
# (phase, pause, kill delay range after the marker); 22 trials.
PLAN: list[tuple[str, dict[str, float], tuple[float, float]]] = [
    *[("generate", {}, (0.0, 0.25))] * 4,
    *[("train", {}, (0.0, 0.3))] * 4,
    *[("ckpt_partial", {"ckpt_partial": HOLD}, (0.05, HOLD - 0.1))] * 3,
    *[("ckpt_unrenamed", {"ckpt_unrenamed": HOLD}, (0.05, HOLD - 0.1))] * 3,
    *[("ckpt_unpruned", {"ckpt_unpruned": HOLD}, (0.05, HOLD - 0.1))] * 3,
    *[("receive", {}, (0.0, 0.05))] * 3,
    *[("anytime", {}, (0.0, ROUND_SECONDS))] * 2,
]


def resumed_line(state_round: int) -> str:
    return f"resumed from checkpoint: {state_round} rounds done"


def test_sigkill_in_every_window_of_a_nodes_life_restarts_from_its_last_commit(local_swarm: Any) -> None:
    swarm: LocalSwarm = local_swarm(ROUND_SECONDS)
    swarm.start_bootstrap()
    swarm.write_node_config(VICTIM, 0)
    swarm.write_node_config(PEER, 1)
    swarm.start_node(PEER)
    home: NodeHome = swarm.homes[VICTIM]
    identity = swarm.libp2p_identity(VICTIM)
    rng = random.Random(20260611)
    plan = list(PLAN)
    rng.shuffle(plan)  # windows at every stage of the node's life, not grouped by kind
    checkpointed: dict[int, tuple[object, ...]] = {}  # facts of rounds covered by a checkpoint
    results: list[dict[str, Any]] = []
    previous = check_disk(home)
    for trial, (phase, pauses, (low, high)) in enumerate(plan):
        fault_dir = swarm.root / "faults" / f"trial-{trial:02d}"
        offset = home.root.joinpath("process.log").stat().st_size if trial else 0
        started = time.monotonic()
        proc = start_hooked_node(swarm, VICTIM, fault_dir, pauses)
        # The window's second occurrence in this run, so the run first commits (and checkpoints)
        # a round of its own: every trial then resumes from a newer commit than the last.
        # "anytime": once the node trains again, at a random instant of the round.
        wait_for_marker(fault_dir, "train" if phase == "anytime" else phase, proc, timeout=240, nth=2)
        time.sleep(rng.uniform(low, high))
        sigkill(proc, identity)
        up_s = time.monotonic() - started

        # It resumed from the checkpoint the previous kill left (or started fresh without one).
        log = log_since(proc, offset)
        if previous.checkpoint_round:
            assert resumed_line(previous.checkpoint_round) in log, (trial, phase, log[-3000:])
        else:
            assert "resumed from checkpoint" not in log, (trial, phase)

        state = check_disk(home)
        for row in state.ledger_rounds[: state.checkpoint_round]:
            assert checkpointed.setdefault(row.round, facts(row)) == facts(row), (
                f"trial {trial} ({phase}): committed round {row.round} was rewritten"
            )
        results.append(
            {
                "trial": trial,
                "phase": phase,
                "checkpoint_round": state.checkpoint_round,
                "ledger_round": len(state.ledger_rounds),
                "leftovers": len(state.leftovers),
                "start_to_kill_s": round(up_s, 1),
            }
        )
        previous = state

    # A last clean run: resumes, trains two rounds, stops on SIGINT; the leftovers are gone.
    offset = home.root.joinpath("process.log").stat().st_size
    proc = start_hooked_node(swarm, VICTIM, swarm.root / "faults" / "final")
    back = swarm.wait_statuses(lambda s: s[VICTIM]["rounds_this_run"] >= 2, "the victim to train again")
    assert back[VICTIM]["rounds"] >= previous.checkpoint_round + 2
    assert proc.stop() == 0, proc.tail()
    log = log_since(proc, offset)
    if previous.checkpoint_round:
        assert resumed_line(previous.checkpoint_round) in log
    final = check_disk(home)
    assert final.leftovers == [], final.leftovers
    assert final.checkpoint_round == len(final.ledger_rounds)  # a clean stop checkpoints its last round
    for row in final.ledger_rounds[: previous.checkpoint_round]:
        assert checkpointed[row.round] == facts(row)
    phases = {p for p, _, _ in PLAN}
    assert {r["phase"] for r in results} == phases and len(results) >= 20
    # The checkpoint windows were really hit: each such kill left an interrupted write behind.
    assert all(r["leftovers"] for r in results if r["phase"] in ("ckpt_partial", "ckpt_unrenamed"))
    # The resume point only moved forward, and most runs committed a round of their own first.
    rounds = [r["checkpoint_round"] for r in results]
    assert rounds == sorted(rounds) and rounds[-1] >= len(plan) // 3, rounds
    print(json.dumps({"trials": results, "final_rounds": len(final.ledger_rounds)}))
