"""Adversarial peers against a live swarm: what got through, and what the attack cost honest nodes.

Question: under each attack, how many poisoned items do honest nodes accept (the reference is
0), and what share of their no-attack throughput (honest groups admitted per minute, both
nodes together) do they keep?

Setup, all real and on 127.0.0.1: a bootstrap peer, 2 honest ``swarmnode run`` processes
(tiny warm-started model, 2 s rounds, 4 groups of 4 a round, SAPO mixing) under
``swarmnode.testing.hooked_node``, which logs every admission verdict, and one attacker process
(``swarmnode/testing/attacker.py``) that runs one scenario per ``--window`` seconds, each with a
fresh libp2p identity (so a ban earned in one does not mask the next). The first window is the
baseline: no attacker. Scenarios and what "poisoned" means for each:
swarmnode/testing/attacker.py and swarmnode/testing/adversarial.py. Corrupt weight chunks are
not a scenario until the weight broadcast exists.

    python bench/adversarial.py                       # 30 s windows, every scenario (~7 min)
    python bench/adversarial.py --window 60 --json out.json
    python bench/adversarial.py --scenarios baseline,slow_loris,dht_spam
    python bench/adversarial.py --part intake         # floods against admission (bench/adversarial_intake.py)
    python bench/adversarial.py --part records        # DHT records, bootstrap memory, connection hoarding
    python bench/adversarial.py --part all            # all three

Throughput on a shared 2-core machine is noisy (one window per scenario, ~15 rounds): read the
share column as a rough figure; run the benchmark alone and repeat it for medians.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from common import base_parser, machine, print_table, write_json

from swarmnode.policy import WarmStartSettings, warm_start
from swarmnode.tasks import default_mixture
from swarmnode.testing import LocalSwarm
from swarmnode.testing.adversarial import measure, run_swarm
from swarmnode.testing.attacker import SCENARIOS

ROUND_SECONDS = 2.0
QUICK = WarmStartSettings(max_steps=120, eval_every=60, eval_tasks=64, heldout_tasks=64, target_accuracy=1.0)


def main() -> int:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=30.0, help="seconds per scenario")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--keep", type=Path, help="keep the swarm's homes and logs here")
    parser.add_argument(
        "--part",
        choices=["swarm", "intake", "records", "all"],
        default="swarm",
        help="swarm: the live-swarm scenarios (default); intake: loop lag and honest share under "
        "admission floods; records: DHT record, bootstrap memory and connection attacks",
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds per intake scenario")
    args = parser.parse_args()
    figures: dict[str, object] = {}
    if args.part in ("intake", "all"):
        import adversarial_intake

        figures["intake"] = adversarial_intake.run_all(args.seconds)
        print(adversarial_intake.table(figures["intake"]))  # type: ignore[arg-type]
    if args.part in ("records", "all"):
        import adversarial_net

        figures["records"] = adversarial_net.run_all(quick=True)
        print(adversarial_net.table(figures["records"]))  # type: ignore[arg-type]
    if args.part != "all" and args.part != "swarm":
        write_json(args.json, {"machine": machine(), **figures})
        return 0
    scenarios = args.scenarios.split(",")
    if scenarios[0] != "baseline":
        scenarios.insert(0, "baseline")
    torch.set_num_threads(1)
    root = args.keep or Path(tempfile.mkdtemp(prefix="swarmnode-adversarial-"))
    model = warm_start(root / "model", default_mixture(0), 0, settings=QUICK)
    swarm = LocalSwarm(root / "swarm", model, round_seconds=ROUND_SECONDS)
    began = time.time()
    try:
        timeline, logs, ids = run_swarm(
            swarm, window=args.window, scenarios=scenarios, timeout=len(scenarios) * (args.window + 60) + 120
        )
    finally:
        swarm.close()
    results = measure(timeline, logs, ids)
    rows = [
        [
            r.name,
            r.poisoned,
            0,
            r.accepted_from_attacker,
            sum(r.refused.values()),
            ", ".join(f"{k}={v}" for k, v in sorted(r.refused.items())) or "-",
            r.honest_per_min,
            "-" if r.share is None else f"{r.share:.2f}",
        ]
        for r in results
    ]
    print_table(
        f"adversarial peers: {len(results)} windows of {args.window:g} s, 2 honest nodes, rounds of "
        f"{ROUND_SECONDS:g} s ({machine()['cores']} cores)",
        [
            "scenario",
            "poisoned",
            "ref",
            "accepted*",
            "refused",
            "refusals",
            "honest groups/min",
            "share of baseline",
        ],
        rows,
        [
            "poisoned: attacker input accepted as such (inflated_reward: groups trained on claimed rewards);",
            "ref: the reference (nothing poisoned gets in). accepted*: attacker groups admitted as valid",
            "(inflated_reward only, with our verifier's rewards). Attacker side, per scenario: "
            + "; ".join(f"{r.name}: {r.sent}" for r in results if r.sent),
            f"total {time.time() - began:.0f} s; homes and logs under {root}",
        ],
    )
    write_json(
        args.json,
        {
            "machine": machine(),
            "window_s": args.window,
            "round_seconds": ROUND_SECONDS,
            "results": [r.as_dict() for r in results],
            **figures,
        },
    )
    return 0 if all(r.poisoned == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
