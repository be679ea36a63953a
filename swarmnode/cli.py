"""The ``swarmnode`` command.

    swarmnode init --home DIR             write a commented config and a fresh node key
    swarmnode run --home DIR [--solo]     join the swarm (or train alone); Ctrl-C stops cleanly
    swarmnode swarm                       a local swarm on loopback: bootstrap + N nodes (main job)
    swarmnode bootstrap --home DIR ...    a bootstrap peer for operators
    swarmnode status --home DIR           a running node's status
    swarmnode demo                        a short solo run on the tiny model
    swarmnode config show|reference       the effective config / the reference table
    swarmnode config large-swarm --nodes N  the [swarm] settings of a swarm of about N nodes
    swarmnode export --home DIR --out D   the node's current policy as a Hugging Face directory
    swarmnode evaluate --home DIR         held-out accuracy now vs the start model, greedy and sampled
    swarmnode protocol check|vectors      wire-protocol tools
    swarmnode simulate SCENARIO.toml      run a simulation scenario (see simulations/README.md)

Exit codes: 0 ok, 1 a runtime error, 2 a usage or configuration error.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from swarmnode import __version__
from swarmnode.config import (
    Config,
    large_swarm_settings,
    load_config,
    reference_markdown,
    render_commented_config,
    render_large_swarm,
)
from swarmnode.errors import ConfigError, SwarmError
from swarmnode.home import NodeHome

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2

Handler = Callable[[argparse.Namespace], int]


def parse_set(items: Sequence[str]) -> dict[str, Any]:
    """``--set learn.lr=3e-4`` pairs; values are TOML literals when they parse, else strings."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects KEY=VALUE (e.g. learn.lr=3e-4), got {item!r}")
        try:
            value: Any = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        out[key.strip()] = value
    return out


def _config_from_args(args: argparse.Namespace) -> Config:
    path: Path | None = None  # neither: the defaults (`config large-swarm` alone)
    if getattr(args, "config", None):
        path = Path(args.config)
        if not path.exists():
            raise ConfigError(f"config file {path} does not exist")
    elif getattr(args, "home", None):
        path = NodeHome(Path(args.home)).config_file
    overrides = parse_set(getattr(args, "set", None) or [])
    if getattr(args, "seed", None) is not None:
        overrides["node.seed"] = args.seed
    if getattr(args, "engine", None):
        overrides["model.engine"] = args.engine
    if getattr(args, "role", None):
        overrides["node.role"] = args.role
    if getattr(args, "learner", None):
        overrides["worker.learner"] = args.learner
    return load_config(path, overrides=overrides)


def _add_config_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--home", required=True, help="node home directory (see `swarmnode init`)")
    p.add_argument("--config", help="config file (default: HOME/swarmnode.toml)")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set learn.lr=3e-4 (repeatable)",
    )
    p.add_argument("--seed", type=int, help="shortcut for --set node.seed=N")


# ------------------------------------------------------------------------ commands


def cmd_init(args: argparse.Namespace) -> int:
    from swarmnode.identity import create_identity, load_identity

    home = NodeHome(Path(args.home)).ensure()
    if home.config_file.exists() and not args.force:
        print(f"{home.config_file} exists; keeping it (use --force to overwrite)", file=sys.stderr)
    else:
        from swarmnode.store.atomic import atomic_write_bytes

        atomic_write_bytes(home.config_file, render_commented_config().encode())
        print(f"wrote {home.config_file}")
    if home.identity_key.exists():
        identity = load_identity(home.identity_key)
        print(f"kept existing identity {home.identity_key}")
    else:
        identity = create_identity(home.identity_key)
        print(f"wrote {home.identity_key} (mode 0600)")
    print(f"peer id: {identity.peer_id}")
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    config = _config_from_args(args)
    if not getattr(args, "verbose", False):
        logging.getLogger().setLevel(config.node.log_level)
    home = NodeHome(Path(args.home))
    if args.solo and config.node.role != "trainer":
        raise ConfigError(f"--solo trains alone; node.role={config.node.role!r} needs the network")
    if not args.solo:
        if args.summary_json:
            raise ConfigError("--summary-json is for --solo runs; a swarm node's metrics are at /metrics")
        if config.node.role == "trainer":
            from swarmnode.roles.trainer import run_node

            run_node(config, home, max_rounds=args.max_rounds, max_seconds=args.max_seconds)
        else:
            from swarmnode.roles.run import run_role

            run_role(config, home, max_steps=args.max_rounds, max_seconds=args.max_seconds)
        return EXIT_OK
    from swarmnode.roles.solo import run_solo

    summary = Path(args.summary_json) if args.summary_json else None
    run_solo(config, home, max_rounds=args.max_rounds, max_seconds=args.max_seconds, summary_json=summary)
    print(_learning_png(home, summary.with_suffix(".png") if summary else home.root / "learning.png"))
    return EXIT_OK


def _learning_png(home: NodeHome, path: Path) -> str:
    """Draw the home's learning curves (its whole ledger) to ``path``; say where, or why not."""
    from swarmnode.sim.plots import plot_rounds
    from swarmnode.store import Ledger

    try:
        with Ledger(home.ledger) as ledger:
            rounds = ledger.rounds()
        plot_rounds(path, rounds, title=f"swarmnode run --solo ({home.root.name})")
    except (SwarmError, OSError, ValueError) as exc:
        return f"learning curves not drawn: {exc}"
    return f"learning curves (reward and held-out accuracy per round): {path}"


def cmd_demo(args: argparse.Namespace) -> int:
    from swarmnode.roles.solo import run_solo

    home = NodeHome(Path(args.home)).ensure()
    config = load_config(
        home.config_file if home.config_file.exists() else None, overrides={"node.seed": args.seed}
    )
    print(
        f"swarmnode demo: solo GRPO on the built-in tiny model for {args.minutes:g} min "
        f"(home {home.root}; Ctrl-C stops cleanly)",
        flush=True,
    )
    run_solo(
        config,
        home,
        max_seconds=args.minutes * 60,
        summary_json=home.root / "summary.json",
    )
    print(f"per-round metrics: {home.root / 'summary.json'}")
    print(_learning_png(home, home.root / "summary.png"))
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    from swarmnode.ops.status import print_status

    return print_status(NodeHome(Path(args.home)), as_json=args.json)


def cmd_swarm(args: argparse.Namespace) -> int:
    from swarmnode.tools.launch import SwarmDemo

    return SwarmDemo(
        Path(args.home),
        nodes=args.nodes,
        minutes=args.minutes,
        mixing=args.mixing,
        round_seconds=args.round_seconds,
        page_port=args.page_port,
        model=args.model,
    ).run()


def cmd_config(args: argparse.Namespace) -> int:
    if args.nodes is not None and args.action != "large-swarm":
        raise ConfigError(f"--nodes is for `swarmnode config large-swarm`, not `config {args.action}`")
    if args.action == "reference":
        print(reference_markdown())
        return EXIT_OK
    if args.action == "large-swarm":
        if args.nodes is None:
            raise ConfigError(
                "`swarmnode config large-swarm` needs --nodes N (about how many nodes the swarm has)"
            )
        print(render_large_swarm(large_swarm_settings(args.nodes, _config_from_args(args))))
        return EXIT_OK
    if not args.home:
        raise ConfigError("`swarmnode config show` needs --home DIR")
    print(render_commented_config(_config_from_args(args)))
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    from swarmnode.tools.export import export_policy

    done = export_policy(
        _config_from_args(args),
        NodeHome(Path(args.home)),
        Path(args.out),
        checkpoint=Path(args.checkpoint) if args.checkpoint else None,
        force=args.force,
        adapter=args.adapter,
    )
    what = "the LoRA adapter of " if args.adapter else ""
    print(
        f"exported {what}round {done.round} (policy version {done.policy_version}, "
        f"{done.parameters:,} parameters) from {done.checkpoint} to {done.out}"
    )
    if args.adapter:
        print(f"load it with PeftModel.from_pretrained(base_model, {str(done.out)!r})")
    else:
        print(
            f"load it with AutoModelForCausalLM.from_pretrained({str(done.out)!r}) and "
            f"AutoTokenizer.from_pretrained({str(done.out)!r})"
        )
    return EXIT_OK


def cmd_evaluate(args: argparse.Namespace) -> int:
    from swarmnode.tools.evaluate import evaluate_node, render

    result = evaluate_node(
        _config_from_args(args),
        NodeHome(Path(args.home)),
        checkpoint=Path(args.checkpoint) if args.checkpoint else None,
        tasks=args.tasks,
        samples=args.samples,
        seed=args.sample_seed,
    )
    print(json.dumps(result.as_dict(), indent=2) if args.json else render(result))
    return EXIT_OK


def cmd_tasks_audit(args: argparse.Namespace) -> int:
    from swarmnode.tasks.audit import all_families, table
    from swarmnode.tasks.mixture import SAPO_DATASETS, default_mixture

    if args.all:
        families = all_families()
    else:
        families = sorted({*SAPO_DATASETS, *(spec.name for spec in default_mixture().specs)})
    print(table(families))
    return EXIT_OK


# ------------------------------------------------------------------------ parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="swarmnode", description="Decentralized peer-to-peer swarm RL training node."
    )
    parser.add_argument("--version", action="version", version=f"swarmnode {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("init", help="write a commented config and a fresh Ed25519 node key")
    p.add_argument("--home", required=True, help="node home directory to create")
    p.add_argument("--force", action="store_true", help="overwrite an existing config (never the key)")
    p.set_defaults(handler=cmd_init)

    p = sub.add_parser("run", help="run the node")
    _add_config_flags(p)
    p.add_argument("--solo", action="store_true", help="train alone, no network")
    p.add_argument("--engine", choices=["torch", "hf", "vllm"], help="rollout engine")
    p.add_argument(
        "--role",
        choices=["trainer", "learner", "worker"],
        help="trainer (default): swarm member; learner: trains on recruited workers' rollouts; "
        "worker: generates for --learner",
    )
    p.add_argument("--learner", metavar="PEER_ID", help="the learner a worker works for (worker.learner)")
    p.add_argument("--max-rounds", type=int, help="stop after N rounds (a learner: N steps)")
    p.add_argument("--max-seconds", type=float, help="stop after S seconds")
    p.add_argument("--summary-json", help="write per-round metrics here when the run ends")
    p.set_defaults(handler=cmd_run)

    p = sub.add_parser("demo", help="a short solo run on the built-in tiny model")
    p.add_argument("--home", default="runs/demo", help="home directory (default runs/demo)")
    p.add_argument("--minutes", type=float, default=3.0, help="how long to train (default 3)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(handler=cmd_demo)

    p = sub.add_parser(
        "bootstrap",
        help="run a DHT-only bootstrap peer (operators); `swarmnode bootstrap -h` for its flags",
        add_help=False,
    )
    p.add_argument("bootstrap_args", nargs=argparse.REMAINDER)  # main() hands these on

    p = sub.add_parser("status", help="print a running node's status (from its local API)")
    p.add_argument("--home", required=True, help="the node's home directory")
    p.add_argument("--json", action="store_true", help="print the raw JSON")
    p.set_defaults(handler=cmd_status)

    p = sub.add_parser("swarm", help="run a local swarm on loopback: a bootstrap peer and N nodes")
    p.add_argument("--home", default="runs/swarm", help="directory for all homes (default runs/swarm)")
    p.add_argument("--nodes", type=int, default=3, help="number of nodes (default 3)")
    p.add_argument(
        "--minutes",
        type=float,
        default=8.0,
        help="how long the nodes train (default 8; the first run also warm-starts the specialists, ~1 min)",
    )
    p.add_argument(
        "--mixing",
        choices=[
            "none",
            "sapo",
            "hacpo",
            "joint",
            "receiver_baseline",
            "positive_only",
            "anchored",
            "replay",
        ],
        default="replay",
        help="how nodes use each other's groups (swarm.mixing; default replay, the best rule of "
        "simulations/specialists.py); none: the control, every node ignores its peers' groups",
    )
    p.add_argument(
        "--round-seconds",
        type=float,
        default=1.0,
        help="swarm round length (default 1: on loopback a round of the tiny model takes well under "
        "a second; at 0.5 half the peers' groups arrive too late to be used)",
    )
    p.add_argument(
        "--model",
        choices=["tiny", "chat"],
        default="tiny",
        help="the built-in model the specialists start from (model.builtin; default tiny): chat is the "
        "Qwen2-architecture model with a BPE tokenizer and chat template (its warm starts take 3-9 "
        "min each on 2 cores, cached)",
    )
    p.add_argument(
        "--page-port",
        type=int,
        default=0,
        help="port of the swarm's page on 127.0.0.1 (default 0: a free port; its address is printed)",
    )
    p.set_defaults(handler=cmd_swarm)

    p = sub.add_parser(
        "config",
        help="show the effective config, the reference of every key, or a large swarm's settings",
        description="show: the effective config (--home) as commented TOML; reference: the table of every "
        "key (README, Configuration); large-swarm: the [swarm] settings of a swarm of about --nodes N "
        "nodes (swarm.round_demand from the effective config, swarm.announce_buckets, which must be the "
        'same on every node, and swarm.read_buckets; README, "In a large swarm") as commented TOML.',
    )
    p.add_argument(
        "action", choices=["show", "reference", "large-swarm"], help="show, reference or large-swarm"
    )
    p.add_argument("--home", help="node home (show; large-swarm: its config file)")
    p.add_argument(
        "--config",
        help="config file (default: HOME/swarmnode.toml; large-swarm without --home: the defaults)",
    )
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    p.add_argument(
        "--nodes",
        type=int,
        metavar="N",
        help="large-swarm: about how many nodes the swarm has (announce_buckets = ceil(N / 64))",
    )
    p.set_defaults(handler=cmd_config)

    p = sub.add_parser(
        "export", help="write the node's current policy (newest checkpoint) as a Hugging Face model directory"
    )
    _add_config_flags(p)
    p.add_argument("--out", required=True, help="directory to write (must not exist or be empty)")
    p.add_argument("--checkpoint", help="a checkpoint directory (default: the newest that verifies)")
    p.add_argument("--force", action="store_true", help="replace a non-empty --out")
    p.add_argument(
        "--adapter",
        action="store_true",
        help="write the LoRA adapter alone, in peft's format (a node with learn.lora_rank > 0); "
        "default: the whole model, adapters merged",
    )
    p.set_defaults(handler=cmd_export)

    p = sub.add_parser(
        "evaluate",
        help="held-out accuracy of the node's policy (newest checkpoint) against the model it started "
        "from, per family, greedy and sampled",
    )
    _add_config_flags(p)
    p.add_argument("--checkpoint", help="a checkpoint directory (default: the newest that verifies)")
    p.add_argument(
        "--tasks", type=int, default=200, help="held-out tasks, split evenly over the families (default 200)"
    )
    p.add_argument(
        "--samples",
        type=int,
        default=8,
        help="sampled completions a task at rollout.temperature (default 8; 0: greedy only)",
    )
    p.add_argument("--sample-seed", type=int, default=0, help="seed of the sampled draws (default 0)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(handler=cmd_evaluate)

    p = sub.add_parser("tasks", help="task families: audit which reasoning-gym scorers are safe on peer text")
    tasks_sub = p.add_subparsers(dest="tasks_command", required=True)
    p = tasks_sub.add_parser("audit", help="print the scorer audit (family, unsafe constructs, what we do)")
    p.add_argument("--all", action="store_true", help="every reasoning-gym family, not only the mixtures'")
    p.set_defaults(handler=cmd_tasks_audit)

    from swarmnode.tools.protocol_cli import add_protocol_parser

    add_protocol_parser(sub)

    from swarmnode.sim.cli import add_simulate_parser

    add_simulate_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "bootstrap" in argv:  # its flags are the bootstrap module's own (global flags may precede it)
        at = argv.index("bootstrap")
        if all(a.startswith("-") for a in argv[:at]):
            from swarmnode.roles.bootstrap import main as bootstrap_main

            return bootstrap_main(argv[at + 1 :])
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    handler: Handler = getattr(args, "handler", None) or args.func  # `protocol` leaves set `func`
    try:
        return handler(args)
    except ConfigError as exc:
        print(f"swarmnode: configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SwarmError as exc:
        print(f"swarmnode: {exc}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
