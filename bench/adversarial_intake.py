"""Floods against a node's intake: the event loop's lag and the honest signer's share.

Question (issue 12): while hostile peers flood admission as fast as it answers, does the
node's event loop keep running (p99 lag <= 50 ms) and does an honest signer's traffic still
get in (share of its batches admitted >= 0.95)?

Setup, all real, in one process plus its verifier worker: the node's admission pipeline
(SAPO mixture families plus the default chain_sum, the tiny model's renderer) in its
``Intake`` thread, scoring behind a real ``VerifierPool`` (1 worker); an asyncio loop with a
5-ms ticker measuring how late each tick fires; an honest signer sending a 16-group
chain_sum batch every 0.25 s; and, per scenario, attackers keeping 32 admissions in flight:

- ``hostile_answers``: valid envelopes for propositional_logic and binary_matrix whose
  answers are the review's attacks (3,500 nested parentheses, negation chains, ``eval``
  payloads), 64 completions a group, from one signer through one peer;
- ``valid_64x64``: two announcers serving valid 64 x 64 chain_sum batches (the most work
  one envelope may ask for), pulled (solicited), each its own signer;
The honest share is the share of the honest batches sent on schedule that admission
accepted (each awaited to the end, however late). With no attack it is 1.0.

- ``replay_flood``: valid 64-group batches from a new identity every 50 envelopes, all through
  one peer and through 8 peers (Sybils), filling the replay cache.

    python bench/adversarial_intake.py [--seconds 20] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

import torch

from swarmnode.admit import Accepted, AdmissionConfig, AdmissionPipeline, task_families
from swarmnode.admit.intake import Intake
from swarmnode.identity import NodeIdentity
from swarmnode.policy import build_tiny_policy
from swarmnode.roles.convert import trained_texts
from swarmnode.tasks import Task, default_mixture, regenerate, sapo_mixture
from swarmnode.verify import VerifierPool
from swarmnode.wire.envelope import encode_envelope, seal, to_ms
from swarmnode.wire.messages import Completion, RolloutBatch, RolloutGroup

TICK_S = 0.005
HONEST_EVERY_S = 0.25
IN_FLIGHT = 32


def group(task: Task, texts: list[str]) -> RolloutGroup:
    return RolloutGroup(
        task=task.id,
        prompt=task.prompt,
        completions=tuple(Completion(t, 3, -0.5, 0.0) for t in texts),
        model_id="swarmnode-tiny",
        policy_version=0,
        round=1,
        batch_reward_mean=0.5,
    )


def sealed(who: NodeIdentity, groups: list[RolloutGroup]) -> bytes:
    return encode_envelope(seal(who, RolloutBatch(groups=tuple(groups)), to_ms(time.time())))


def hostile_texts(family: str) -> list[str]:
    if family == "propositional_logic":
        base = ["(" * 3500 + "P" + ")" * 3500, "¬" * 3000 + "P", "a ∧ " * 900 + "b"]
    else:
        base = ["open('pwned', 'w').write('x')", "exit(3)", "9**9**9", "[" * 8000]
    return [base[i % len(base)][:8000] for i in range(64)]


async def measure(
    pipeline: AdmissionPipeline,
    attack: list[tuple[bytes, str]],
    honest: list[bytes],
    seconds: float,
) -> dict[str, Any]:
    """Feed the pre-built envelopes (building them on the loop would be the bench's lag, not the
    node's) until ``seconds`` pass or the attack runs out."""
    intake = Intake(pipeline)
    attack_queue = iter(attack)
    honest_queue = iter(honest)
    lags: list[float] = []
    honest_sent = honest_ok = attack_sent = attack_ok = 0
    stop = time.monotonic() + seconds

    async def ticker() -> None:
        while time.monotonic() < stop:
            before = time.monotonic()
            await asyncio.sleep(TICK_S)
            lags.append(max(0.0, time.monotonic() - before - TICK_S))

    async def honest_one(data: bytes) -> None:
        nonlocal honest_ok
        verdict = await intake.admit(data, via="honest-peer", solicited=True)
        honest_ok += isinstance(verdict, Accepted)

    async def honest_sender() -> None:
        """One batch every 0.25 s on schedule, whether or not the previous one is through yet."""
        nonlocal honest_sent
        sends = []
        for data in honest_queue:
            if time.monotonic() >= stop:
                break
            honest_sent += 1
            sends.append(asyncio.ensure_future(honest_one(data)))
            await asyncio.sleep(HONEST_EVERY_S)
        await asyncio.gather(*sends)

    async def attacker() -> None:
        nonlocal attack_sent, attack_ok
        for data, via in attack_queue:
            if time.monotonic() >= stop:
                return
            attack_sent += 1
            verdict = await intake.admit(data, via=via, solicited=True)
            attack_ok += isinstance(verdict, Accepted)

    cpu_before = time.process_time()
    jobs = [ticker(), honest_sender()] + [attacker() for _ in range(IN_FLIGHT if attack else 0)]
    await asyncio.gather(*jobs)
    intake.close()
    lags.sort()
    return {
        "loop_lag_p50_ms": 1000 * statistics.median(lags),
        "loop_lag_p99_ms": 1000 * lags[int(0.99 * (len(lags) - 1))],
        "loop_lag_max_ms": 1000 * lags[-1],
        "honest_sent": honest_sent,
        "honest_admitted": honest_ok,
        "honest_share": honest_ok / max(honest_sent, 1),
        "attack_envelopes": attack_sent,
        "attack_admitted": attack_ok,
        "admission_cpu_s": intake.cpu_seconds,
        "attack_ran_out": next(attack_queue, None) is None and bool(attack),
        "process_cpu_s": time.process_time() - cpu_before,
        "rejections": {k: v for k, v in pipeline.counts().items() if k != "accepted"},
    }


def run_all(seconds: float = 20.0) -> dict[str, Any]:
    torch.set_num_threads(1)
    policy = build_tiny_policy(0)
    chain = default_mixture(0)
    sapo = sapo_mixture(0)
    families = task_families(chain) | task_families(sapo)
    chain_spec = chain.specs[0]
    sapo_specs = {s.name: s for s in sapo.specs}
    counter = iter(range(1, 10**9))
    alice = NodeIdentity.generate()

    def chain_task() -> Task:
        return regenerate(chain_spec.task_id(0, next(counter)))

    def honest() -> bytes:
        tasks = [chain_task() for _ in range(16)]
        return sealed(alice, [group(t, [t.entry["answer"], "0"] * 4) for t in tasks])

    def fresh_pipeline() -> AdmissionPipeline:
        return AdmissionPipeline(
            AdmissionConfig(allowed_tasks=frozenset(families), new_identities=10_000),
            now=time.time(),
            score_groups=verifier.score,
            render=lambda texts: trained_texts(policy, texts, 8),
        )

    mallory = NodeIdentity.generate()
    announcers = [NodeIdentity.generate() for _ in range(2)]
    turn = iter(range(10**9))

    def hostile_answers() -> tuple[bytes, str]:
        family = ("propositional_logic", "binary_matrix")[next(turn) % 2]
        task = regenerate(sapo_specs[family].task_id(0, next(counter)))
        return sealed(mallory, [group(task, hostile_texts(family))]), "mallory-peer"

    def valid_64x64() -> tuple[bytes, str]:
        k = next(turn) % 2
        tasks = [chain_task() for _ in range(64)]
        return sealed(announcers[k], [group(t, [t.entry["answer"]] * 64) for t in tasks]), f"announcer-{k}"

    def replay_flood(peers: int) -> Callable[[], tuple[bytes, str]]:
        identities: list[NodeIdentity] = []

        def make() -> tuple[bytes, str]:
            n = next(turn)
            if not identities or n % 50 == 0:
                identities.append(NodeIdentity.generate())
            tasks = [chain_task() for _ in range(64)]
            return sealed(
                identities[-1], [group(t, [t.entry["answer"]]) for t in tasks]
            ), f"sybil-{n % peers}"

        return make

    # (builder, envelopes built in advance): more than a node admits in ``seconds``.
    scenarios: dict[str, tuple[Callable[[], tuple[bytes, str]] | None, int]] = {
        "baseline": (None, 0),
        "hostile_answers": (hostile_answers, int(60 * seconds)),
        "valid_64x64": (valid_64x64, int(3 * seconds)),
        "replay_flood_1_peer": (replay_flood(1), int(40 * seconds)),
        "replay_flood_8_peers": (replay_flood(8), int(40 * seconds)),
    }
    results: dict[str, Any] = {}
    with VerifierPool(workers=1, families=families) as verifier:
        for name, (builder, count) in scenarios.items():
            attack = [builder() for _ in range(count)] if builder is not None else []
            honest_batches = [honest() for _ in range(int(seconds / HONEST_EVERY_S) + 2)]
            results[name] = asyncio.run(measure(fresh_pipeline(), attack, honest_batches, seconds))
            results[name]["verifier"] = verifier.stats()
    return results


def table(results: dict[str, Any]) -> str:
    lines = [
        "| scenario | loop lag p50 / p99 / max (ms) | target p99 | honest share | target | attack envelopes "
        "(admitted) | admission CPU s | top rejections |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        top = ", ".join(f"{k} {v}" for k, v in sorted(r["rejections"].items(), key=lambda kv: -kv[1])[:3])
        lines.append(
            f"| {name} | {r['loop_lag_p50_ms']:.1f} / {r['loop_lag_p99_ms']:.1f} / "
            f"{r['loop_lag_max_ms']:.1f} "
            f"| 50 | {r['honest_share']:.3f} ({r['honest_admitted']}/{r['honest_sent']}) | 0.95 | "
            f"{r['attack_envelopes']} ({r['attack_admitted']}) | {r['admission_cpu_s']:.1f} | {top or '-'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds per scenario")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    results = run_all(args.seconds)
    print(table(results))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
