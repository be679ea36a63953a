"""The ``swarmnode`` command.

    swarmnode init --home DIR             write a commented config and a fresh node key
    swarmnode run --home DIR --solo       train alone (live progress, Ctrl-C stops cleanly)
    swarmnode demo                        the README's main job
    swarmnode config show|reference       the effective config / the reference table
    swarmnode protocol check|vectors      wire-protocol tools

Exit codes: 0 ok, 1 a runtime error, 2 a usage or configuration error.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from swarmnode import __version__
from swarmnode.config import Config, load_config, reference_markdown, render_commented_config
from swarmnode.errors import ConfigError, SwarmError
from swarmnode.home import NodeHome

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2

Handler = Callable[[argparse.Namespace], int]


def _parse_set(items: Sequence[str]) -> dict[str, Any]:
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
    home = NodeHome(Path(args.home))
    path = Path(args.config) if getattr(args, "config", None) else home.config_file
    if getattr(args, "config", None) and not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    overrides = _parse_set(getattr(args, "set", None) or [])
    if getattr(args, "seed", None) is not None:
        overrides["node.seed"] = args.seed
    if getattr(args, "engine", None):
        overrides["model.engine"] = args.engine
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
    logging.getLogger().setLevel(config.node.log_level)
    home = NodeHome(Path(args.home))
    if not args.solo:
        raise ConfigError("swarm mode is not available in this build yet: run with --solo to train alone")
    from swarmnode.solo import run_solo

    run_solo(
        config,
        home,
        max_rounds=args.max_rounds,
        max_seconds=args.max_seconds,
        summary_json=Path(args.summary_json) if args.summary_json else None,
    )
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from swarmnode.solo import run_solo

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
    return EXIT_OK


def cmd_config(args: argparse.Namespace) -> int:
    if args.action == "reference":
        print(reference_markdown())
        return EXIT_OK
    if not args.home:
        raise ConfigError("`swarmnode config show` needs --home DIR")
    print(render_commented_config(_config_from_args(args)))
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
    p.add_argument("--max-rounds", type=int, help="stop after N rounds")
    p.add_argument("--max-seconds", type=float, help="stop after S seconds")
    p.add_argument("--summary-json", help="write per-round metrics here when the run ends")
    p.set_defaults(handler=cmd_run)

    p = sub.add_parser("demo", help="the main job: a short run on the built-in tiny model")
    p.add_argument("--home", default="runs/demo", help="home directory (default runs/demo)")
    p.add_argument("--minutes", type=float, default=3.0, help="how long to train (default 3)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(handler=cmd_demo)

    p = sub.add_parser("config", help="show the effective config or the reference of every key")
    p.add_argument("action", choices=["show", "reference"])
    p.add_argument("--home", help="node home (for show)")
    p.add_argument("--config")
    p.add_argument("--set", action="append", metavar="KEY=VALUE")
    p.set_defaults(handler=cmd_config)

    try:
        from swarmnode.wire.cli_protocol import add_protocol_parser
    except ImportError:  # only while the wire package is being built
        pass
    else:
        add_protocol_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    handler: Handler = args.handler
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
