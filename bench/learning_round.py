"""Time per agent-round of the learning simulator (what every research run costs).

Question: how long does one agent-round take (generate 8 x 8 completions, score them, gossip
through the real core and admission, one update) on one thread, with the shared-prefix update
(``learn.shared_prefix``, the default) and without it? Runs the same two-agent SAPO 4/4
scenario (``swarmnode simulate``'s learning mode, tiny model, no warm start, 6 new tokens)
for ``--rounds`` rounds once per variant, alternating variants ``--repeats`` times, and reports
the median seconds per agent-round (wall, alone) and the CPU seconds per agent-round, rounds
only: the start policy (the simulator's default warm start) is built once into
``runs/sim-cache`` and reused. The reference is the unshared update on the same scenario in
the same run.
Run it alone: on 2 cores any other busy process distorts the figures.

    python bench/learning_round.py [--rounds 20] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import base_parser, machine, median, print_table, write_json

from swarmnode.sim.learning import run_learning

AGENTS = 2
CACHE = "runs/sim-cache"  # as the committed scenarios: the start policy is built on the first run only


def scenario(rounds: int, shared_prefix: bool) -> dict[str, Any]:
    return {
        "simulation": {"mode": "learning", "name": "bench-learning-round"},
        "learning": {
            "agents": AGENTS,
            "rounds": rounds,
            "seeds": [0],
            "mixing": "sapo",
            "local_groups": 4,
            "external_groups": 4,
            "prompts_per_round": 8,
            "group_size": 8,
            "max_new_tokens": 6,
            "heldout_size": 0,
            "threads": 1,
            "shared_prefix": shared_prefix,
            "cache_dir": CACHE,  # the policy it starts from is built once and reused
        },
    }


def one_run(rounds: int, shared_prefix: bool) -> tuple[float, float]:
    """(wall seconds, CPU seconds) per agent-round."""
    with tempfile.TemporaryDirectory() as tmp:
        result = run_learning(scenario(rounds, shared_prefix), Path(tmp))
    timing = result["timing"]["runs"][0]
    agent_rounds = AGENTS * rounds
    return sum(timing["round_seconds"]) / agent_rounds, timing["cpu_seconds"] / agent_rounds


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="rounds per run (2 agents each)")
    parser.set_defaults(repeats=3)
    args = parser.parse_args()
    runs: dict[str, list[tuple[float, float]]] = {"shared": [], "unshared": []}
    for _ in range(args.repeats):
        for name in runs:
            runs[name].append(one_run(args.rounds, name == "shared"))
    figures = {
        name: {
            "wall_s_per_agent_round": median([w for w, _ in values]),
            "cpu_s_per_agent_round": median([c for _, c in values]),
            "runs": values,
        }
        for name, values in runs.items()
    }
    speedup = figures["unshared"]["wall_s_per_agent_round"] / figures["shared"]["wall_s_per_agent_round"]
    info = machine()
    print_table(
        f"learning simulator, {AGENTS} agents, SAPO 4/4, 8 x 8 completions, 6 new tokens, 1 thread, "
        f"{args.rounds} rounds x {args.repeats} runs",
        ["update", "s / agent-round (wall)", "CPU s / agent-round", "vs unshared"],
        [
            [
                f"{name} prefix",
                f"{f['wall_s_per_agent_round']:.3f}",
                f"{f['cpu_s_per_agent_round']:.3f}",
                f"{figures['unshared']['wall_s_per_agent_round'] / f['wall_s_per_agent_round']:.2f}x",
            ]
            for name, f in figures.items()
        ],
        [f"machine: {info['cores']} cores, torch {info['torch']}; medians of {args.repeats} runs"],
    )
    write_json(
        args.json,
        {
            "bench": "learning_round",
            "settings": {"agents": AGENTS, "rounds": args.rounds, "repeats": args.repeats},
            "machine": info,
            "results": figures,
            "speedup": speedup,
        },
    )


if __name__ == "__main__":
    main()
