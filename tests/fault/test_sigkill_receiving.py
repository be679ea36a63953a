"""SIGKILL a rollout worker while it receives a weight version; it restarts clean and catches up.

Bootstrap + learner + 2 workers (``swarmnode run --role learner|worker``) on 127.0.0.1. The
learner's uploads are capped at ``UPLOAD_RATE`` so one ~4 MB version takes > 10 s to arrive: a
worker spends most of its life with a version in ``weights.receiving``. Each trial waits until
the victim's /status shows a version being received, SIGKILLs the victim's process group (its
p2pd, in a group of its own, dies with it: the trial waits for that), restarts it at once, and
checks:

- it starts cleanly on what the kill left on disk (a worker writes only its identity, config
  and api.port; no partial weights are ever written) and is active for the learner again;
- it receives a complete version (``policy_version`` >= 0, one the learner published: the
  broadcast verifies every chunk against the learner's signed manifest before the swap);
- it generates again (the learner's ``completions_by_worker`` for it grows);
- the other worker kept going meanwhile (its completions and its policy version grew while the
  victim was down or catching up).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from swarmnode.identity import load_or_create_identity
from swarmnode.testing import LocalSwarm, p2pd_pids, wait_until

pytestmark = [pytest.mark.network, pytest.mark.fault, pytest.mark.timeout(2400)]

UPLOAD_RATE = 300_000  # bytes/s for the learner: a ~4.2 MB version takes ~14 s from it alone
CHUNK_BYTES = 512 * 1024  # several chunks a version, so workers relay to each other mid-version
WORKERS = ("w-0", "w-1")
VICTIMS = ("w-0", "w-1", "w-0")  # one trial each; both workers are killed at least once
TIMEOUT = 420.0  # generous: 2 shared cores, every restart imports torch and calibrates


def learner_status(swarm: LocalSwarm) -> dict[str, Any] | None:
    return swarm.status("learner")


def completions(status: dict[str, Any], peer: str) -> int:
    return int(status["completions_by_worker"].get(peer, 0))


def home_files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def trial(swarm: LocalSwarm, ids: dict[str, str], number: int, victim: str) -> dict[str, Any]:
    """One kill-and-restart of ``victim`` while it receives a version; returns what was seen."""
    other = next(w for w in WORKERS if w != victim)
    vid, oid = ids[victim], ids[other]
    vhome = swarm.homes[victim]

    # -- wait for the victim to be mid-version, then kill it with everything in its group
    def mid_version() -> dict[str, Any] | None:
        s = swarm.status(victim)
        return s if s is not None and s["weights"]["receiving"] else None

    receiving = swarm.wait(mid_version, f"{victim} to be receiving a version", timeout=TIMEOUT)
    before = learner_status(swarm)
    assert before is not None
    other_before = swarm.status(other)
    assert other_before is not None
    proc = swarm.procs[victim]
    t_kill = time.monotonic()
    proc.kill_group(signal.SIGKILL)
    proc.popen.wait(30)
    assert proc.popen.returncode == -signal.SIGKILL, proc.tail()
    identity = swarm.libp2p_identity(victim)
    wait_until(lambda: not p2pd_pids(identity), 15.0, f"{victim}'s p2pd to die with it")

    # -- what the kill left on disk: no weights, nothing partial (the worker keeps them in memory)
    files = home_files(vhome.root)
    allowed = {
        str(vhome.config_file.relative_to(vhome.root)),
        str(vhome.identity_key.relative_to(vhome.root)),
        str(identity.relative_to(vhome.root)),
        # The runtime's advisory flock file (net/identity_lock.py): the kernel drops the lock
        # with the process, so it never blocks the restart (checked below).
        str(identity.relative_to(vhome.root)) + ".lock",
        "process.log",
        "api.port",  # the killed run's; removed by the next start
    }
    assert files <= allowed, f"unexpected files in the killed worker's home: {sorted(files - allowed)}"

    # -- restart at once; it must come back, be activated, receive a whole version, generate
    swarm.start_node(victim)

    def caught_up() -> dict[str, Any] | None:
        s = swarm.status(victim)
        ok = (
            s is not None
            and s["active"]
            and s["learner_address"] is not None
            and s["policy_version"] >= 0
            and s["weights"]["last_receive_s"] is not None
        )
        return s if ok else None

    def generating() -> dict[str, Any] | None:
        s = learner_status(swarm)
        return s if s is not None and completions(s, vid) > completions(before, vid) else None

    back = swarm.wait(caught_up, f"{victim} to be re-activated with a complete version", timeout=TIMEOUT)
    t_weights = time.monotonic()
    after = swarm.wait(generating, f"{victim} to deliver rollouts again", timeout=TIMEOUT)
    t_generating = time.monotonic()
    assert 0 <= back["policy_version"] <= after["policy_version"]  # a version the learner published
    other_after = swarm.status(other)
    assert other_after is not None
    # The other worker kept working meanwhile: more rollouts delivered, newer weights taken.
    assert completions(after, oid) > completions(before, oid), (before, after)
    assert other_after["policy_version"] > other_before["policy_version"], (other_before, other_after)
    assert swarm.procs["learner"].alive()
    outcome = {
        "trial": number,
        "victim": victim,
        "killed_receiving": receiving["weights"]["receiving"],
        "killed_at_version": receiving["policy_version"],
        "chunks_fetched_this_run": receiving["weights"]["stats"]["chunks_fetched"],
        "files_left": sorted(files),
        "back_with_version": back["policy_version"],
        "receive_s": back["weights"]["last_receive_s"],
        "to_weights_s": round(t_weights - t_kill, 1),
        "to_generating_s": round(t_generating - t_kill, 1),
        "learner_version": after["policy_version"],
        "other_completions": (completions(before, oid), completions(after, oid)),
        "other_version": (other_before["policy_version"], other_after["policy_version"]),
        "victim_completions": (completions(before, vid), completions(after, vid)),
    }
    return outcome


def test_sigkill_while_receiving_weights_restarts_clean_and_catches_up(local_swarm: Any) -> None:
    swarm: LocalSwarm = local_swarm(30.0)
    swarm.start_bootstrap()
    home = swarm.write_node_config(
        "learner",
        0,
        **{
            "node.role": "learner",
            "learner.activation": "all",
            "learner.groups_per_step": 4,
            "learner.recruit_seconds": 1.0,
            "learner.spot_check_rate": 0.0,
            "learner.lease_seconds": 15,  # renewed every 10 s: a restarted worker is re-activated soon
            "learner.chunk_bytes": CHUNK_BYTES,
            "dataplane.upload_rate": UPLOAD_RATE,
        },
    )
    learner_id = load_or_create_identity(home.identity_key).peer_id
    ids: dict[str, str] = {}
    for i, name in enumerate(WORKERS):
        wh = swarm.write_node_config(name, 10 + i, **{"node.role": "worker", "worker.learner": learner_id})
        ids[name] = load_or_create_identity(wh.identity_key).peer_id
    for name in ("learner", *WORKERS):
        swarm.start_node(name)

    # Both workers generating with weights from the learner before the first kill.
    def both_delivered() -> bool:
        s = learner_status(swarm)
        return s is not None and all(completions(s, ids[w]) > 0 for w in WORKERS)

    swarm.wait(both_delivered, "both workers to deliver rollouts", timeout=TIMEOUT)

    outcomes = []
    for number, victim in enumerate(VICTIMS, 1):
        outcome = trial(swarm, ids, number, victim)
        outcomes.append(outcome)
        print(f"trial {number}: {outcome}", flush=True)

    assert len(outcomes) == len(VICTIMS)
    final = learner_status(swarm)
    assert final is not None
    print(
        f"learner after {len(VICTIMS)} trials: steps {final['steps_this_run']}, "
        f"version {final['policy_version']}, completions {final['completions_by_worker']}, "
        f"staleness {final['staleness']}",
        flush=True,
    )
