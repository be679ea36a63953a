"""``swarmnode protocol ...``: check one envelope, regenerate the test vectors.

Owns: the ``protocol`` subcommand (wired into ``swarmnode.cli`` with
``add_protocol_parser``) and the receiver a vectors manifest describes
(``pipeline_for_context``). Must not: hold protocol logic of its own; it only
drives ``swarmnode.admit`` and ``swarmnode.wire.vectors``.

    swarmnode protocol check FILE [--now T | --context protocol/vectors/manifest.json]
        exit 0 accepted, 1 rejected, 2 unreadable
    swarmnode protocol vectors --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from swarmnode.admit import STEPS, Accepted, AdmissionConfig, AdmissionPipeline, Verdict
from swarmnode.identity import KeyAllowlist
from swarmnode.verify import GroupScorer, VerifierPool, score_in_process
from swarmnode.wire.envelope import decode_envelope
from swarmnode.wire.messages import RolloutBatch, decode_payload
from swarmnode.wire.reasons import WireError

EXIT_ACCEPTED = 0
EXIT_REJECTED = 1
EXIT_UNREADABLE = 2

_STEP_OF = {reason: step for step, reasons in STEPS.items() for reason in reasons}


def pipeline_for_context(
    ctx: dict[str, Any], score_groups: GroupScorer = score_in_process
) -> AdmissionPipeline:
    """A fresh receiver in the state a vectors manifest's ``context`` describes."""
    allowed = ctx.get("allowed_tasks")
    publishers = ctx.get("trusted_publishers")
    allowlist = ctx.get("allowlist")
    config = AdmissionConfig(
        max_age_s=float(ctx["max_age_s"]),
        max_future_s=float(ctx["max_future_s"]),
        max_policy_lag=int(ctx["max_policy_lag"]),
        allowed_tasks=None if allowed is None else frozenset((str(a), str(b), str(c)) for a, b, c in allowed),
        trusted_publishers=None if publishers is None else frozenset(bytes.fromhex(k) for k in publishers),
        allowlist=None if allowlist is None else KeyAllowlist.from_keys(bytes.fromhex(k) for k in allowlist),
        local_peer_id=ctx.get("local_peer_id"),
        replay_quota=int(ctx.get("replay_quota", AdmissionConfig.replay_quota)),
    )
    pipeline = AdmissionPipeline(config, now=float(ctx["now"]), score_groups=score_groups)
    for model_id, version in ctx.get("policy_versions", {}).items():
        pipeline.set_policy_version(model_id, int(version))
    return pipeline


def describe(verdict: Verdict) -> str:
    """Human-readable verdict: first line ``accepted ...`` or ``rejected <reason>: <detail>``."""
    if isinstance(verdict, Accepted):
        env = verdict.envelope
        lines = [
            f"accepted {env.kind.label} from {verdict.sender} "
            f"(envelope id {verdict.envelope_id.hex()}, sent_at_ms {env.sent_at_ms})"
        ]
        for i, group in enumerate(verdict.groups):
            rewards = ", ".join(f"{r:g}" for r in group.rewards)
            lines.append(f"  groups[{i}] {group.task.id.key()}: local rewards [{rewards}]")
        return "\n".join(lines)
    line = f"rejected {verdict.reason.value} (step: {_STEP_OF[verdict.reason]}): {verdict.detail}"
    if verdict.sender is not None:
        line += f"\n  signer: {verdict.sender}"
    return line


def _run_check(args: argparse.Namespace) -> int:
    try:
        data = Path(args.file).read_bytes()
    except OSError as exc:
        print(f"unreadable: cannot read {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_UNREADABLE
    # The file is a stranger's bytes: its completions are scored behind the verification boundary,
    # whose worker warms the families the file names before it locks itself in.
    families = families_named(data)
    if len(families) > MAX_CHECKED_FAMILIES:
        print(
            f"unreadable: the file names {len(families)} task families; this tool checks at most "
            f"{MAX_CHECKED_FAMILIES}",
            file=sys.stderr,
        )
        return EXIT_UNREADABLE
    _limit_cpu(CHECK_CPU_S)
    try:
        verifier = VerifierPool(workers=1, families=families)
        verifier.start()
    except RuntimeError as exc:
        print(
            f"unreadable: the verifier could not start for the file's task families: {exc}", file=sys.stderr
        )
        return EXIT_UNREADABLE
    try:
        return _check_with(args, data, verifier)
    finally:
        verifier.close()


MAX_CHECKED_FAMILIES = 16
#: The tool regenerates a stranger's tasks in its own process (with configs of the stranger's
#: choosing, unlike a node): past this much CPU it stops and says so instead of hanging.
CHECK_CPU_S = 120


def _limit_cpu(seconds: int) -> None:
    import resource
    import signal

    def give_up(signum: int, frame: object) -> None:
        print(f"unreadable: checking used more than {seconds} s of CPU", file=sys.stderr)
        os._exit(EXIT_UNREADABLE)

    signal.signal(signal.SIGXCPU, give_up)
    used = int(time.process_time()) + 1
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = used + seconds if hard == resource.RLIM_INFINITY else min(used + seconds, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def families_named(data: bytes) -> list[tuple[str, str, str]]:
    """The task families a rollout batch's groups name, or [] for anything else."""
    envelope = decode_envelope(data)
    if isinstance(envelope, WireError):
        return []
    message = decode_payload(envelope.kind, envelope.payload)
    if not isinstance(message, RolloutBatch):
        return []
    return sorted({(g.task.dataset, g.task.config, g.task.prompt_format) for g in message.groups})


def _check_with(args: argparse.Namespace, data: bytes, verifier: VerifierPool) -> int:
    if args.context is not None:
        try:
            ctx = json.loads(Path(args.context).read_text(encoding="utf-8"))["context"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(
                f"unreadable: {args.context} is not a vectors manifest with a context: {exc}", file=sys.stderr
            )
            return EXIT_UNREADABLE
        if args.now is not None:
            ctx = {**ctx, "now": args.now}
        pipeline = pipeline_for_context(ctx, verifier.score)
        now = float(ctx["now"])
    else:
        now = time.time() if args.now is None else float(args.now)
        # A local tool on a file the user chose: any task family (a node restricts them).
        pipeline = AdmissionPipeline(
            AdmissionConfig(allowed_tasks=None), now=now, score_groups=verifier.score
        )
    verdict = pipeline.admit(data, now)
    print(describe(verdict))
    return EXIT_ACCEPTED if verdict.accepted else EXIT_REJECTED


def _run_vectors(args: argparse.Namespace) -> int:
    from swarmnode.wire.vectors import write  # imports reasoning-gym tasks: only when asked

    files = write(Path(args.out))
    print(f"wrote {len(files)} files to {args.out}")
    return 0


def add_protocol_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``protocol`` to a CLI's subparsers; each leaf sets ``func(args) -> exit code``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "protocol", help="wire protocol tools: check an envelope, regenerate test vectors"
    )
    sub = parser.add_subparsers(dest="protocol_command", metavar="{check,vectors}", required=True)
    check = sub.add_parser(
        "check",
        help="run one envelope (raw bytes) through admission; exit 0 accepted, 1 rejected, 2 unreadable",
    )
    check.add_argument("file", type=Path, help="file holding one envelope's bytes")
    check.add_argument("--now", type=float, default=None, help="judge as of this Unix time (default: now)")
    check.add_argument(
        "--context",
        type=Path,
        default=None,
        help="a vectors manifest.json: judge as its receiver (its now, policy versions, allowed tasks)",
    )
    check.set_defaults(func=_run_check)
    vectors = sub.add_parser("vectors", help="regenerate the protocol test vectors into DIR")
    vectors.add_argument("--out", type=Path, required=True, metavar="DIR")
    vectors.set_defaults(func=_run_vectors)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m swarmnode.wire.cli_protocol")
    add_protocol_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
