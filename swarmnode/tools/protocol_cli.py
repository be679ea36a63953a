"""``swarmnode protocol ...``: check one envelope, regenerate the test vectors.

Owns: the ``protocol`` subcommand (wired into ``swarmnode.cli`` with
``add_protocol_parser``) and the receiver a vectors manifest describes
(``pipeline_for_context``). Must not: hold protocol logic of its own; it only
drives ``swarmnode.admit`` and ``swarmnode.tools.vectors``.

    swarmnode protocol check FILE [--now T | --context protocol/vectors/manifest.json]
        exit 0 accepted, 1 rejected, 2 unreadable; a FILE byte-identical to a vector of the
        manifest is judged in that vector's own context (SPEC.md §6), any other in the manifest's
    swarmnode protocol vectors --out DIR
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import os
import stat
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swarmnode.admit import (
    STEPS,
    Accepted,
    AdmissionConfig,
    AdmissionPipeline,
    RejectReason,
    Verdict,
    task_families,
)
from swarmnode.admit.verdict import TrainedText
from swarmnode.identity import KeyAllowlist
from swarmnode.verify import GroupScorer, VerifierLimits, VerifierPool, score_in_process
from swarmnode.wire.envelope import decode_envelope
from swarmnode.wire.limits import MAX_ENVELOPE_BYTES
from swarmnode.wire.messages import RolloutBatch, decode_payload
from swarmnode.wire.reasons import WireError

if TYPE_CHECKING:
    from swarmnode.policy import Policy

EXIT_ACCEPTED = 0
EXIT_REJECTED = 1
EXIT_UNREADABLE = 2

_STEP_OF = {reason: step for step, reasons in STEPS.items() for reason in reasons}


#: Context fields only a vector's or a sequence's own ``context`` may set (SPEC.md §6): a
#: conformance-test switch that scores a family with upstream's audit-flagged scorer inside the
#: sandbox. Refused in a manifest's top-level context, so no receiver description enables it.
SANDBOX_UPSTREAM = "sandbox_upstream"
#: The only bytes that switch may apply to: the project's own two conformance vectors (SHA-256 of
#: the files ``python -m swarmnode.tools.vectors`` writes; tests/wire checks these). A manifest is
#: an input like any other: a stranger's manifest naming a stranger's file must not get its code
#: run by upstream's ``eval`` scorer, sandbox or not (without root the sandbox has no chroot).
CONFORMANCE_SHA256 = {
    "691b0de2455a200cb4724d2235bc2eacfca31fe0dcf7bbd6d0dc52b78f5540e6": "scorer_raises_system_exit.bin",
    "3d2820f7bef96ec686c36dde5238969d1dd8564a16d19dfc9139905bbd1f5a81": "scorer_exceeds_cpu_limit.bin",
}
TOKENIZERS = ("builtin",)


def vector_context(manifest: dict[str, Any], entry: dict[str, Any] | None = None) -> dict[str, Any]:
    """The context a vector or sequence of ``manifest`` is judged in: the manifest's, with the
    entry's own ``context`` fields replacing it. Raises ``ValueError`` for a manifest whose own
    context sets ``sandbox_upstream``."""
    base = manifest["context"]
    if not isinstance(base, dict):
        raise ValueError("the manifest's context is not an object")
    if SANDBOX_UPSTREAM in base:
        raise ValueError(
            f"{SANDBOX_UPSTREAM} is a conformance-test switch of single vectors; a manifest's own "
            "context must not set it"
        )
    overrides = {} if entry is None else entry.get("context", {})
    if not isinstance(overrides, dict):
        raise ValueError("a vector's context is not an object")
    return {**base, **overrides}


def pipeline_for_context(
    ctx: dict[str, Any], score_groups: GroupScorer = score_in_process
) -> AdmissionPipeline:
    """A fresh receiver in the state a vectors manifest's ``context`` describes.

    Scoring is ``score_groups``'s; ``verifier_for_context`` gives the boundary a context asks for.
    Raises ``ValueError`` (or ``KeyError``/``TypeError``) for a context it cannot build."""
    publishers = ctx.get("trusted_publishers")
    allowlist = ctx.get("allowlist")
    config = AdmissionConfig(
        max_age_s=_finite_now(ctx["max_age_s"], "the context's max_age_s"),
        max_future_s=_finite_now(ctx["max_future_s"], "the context's max_future_s"),
        max_policy_lag=int(ctx["max_policy_lag"]),
        allowed_tasks=receiver_families(ctx),
        trusted_publishers=None if publishers is None else frozenset(bytes.fromhex(k) for k in publishers),
        allowlist=None if allowlist is None else KeyAllowlist.from_keys(bytes.fromhex(k) for k in allowlist),
        local_peer_id=ctx.get("local_peer_id"),
        replay_quota=int(ctx.get("replay_quota", AdmissionConfig.replay_quota)),
        cpu_initial=float(ctx.get("cpu_initial", AdmissionConfig.cpu_initial)),
        system_prompt_sha256=bytes.fromhex(str(ctx.get("system_prompt_sha256", ""))),
    )
    pipeline = AdmissionPipeline(
        config,
        now=_finite_now(ctx["now"], "the context's now"),
        score_groups=score_groups,
        render=_renderer(ctx),
    )
    for model_id, version in ctx.get("policy_versions", {}).items():
        pipeline.set_policy_version(model_id, int(version))
    return pipeline


def _renderer(ctx: dict[str, Any]) -> Callable[[Sequence[str]], Sequence[TrainedText | RejectReason]] | None:
    """How the context's receiver renders completions (its tokenizer and ``max_new_tokens``), or None:
    score them as received."""
    tokenizer, max_new = ctx.get("tokenizer"), ctx.get("max_new_tokens")
    if tokenizer is None and max_new is None:
        return None
    if tokenizer not in TOKENIZERS or not isinstance(max_new, int) or max_new < 1:
        raise ValueError(
            f"context tokenizer {tokenizer!r} / max_new_tokens {max_new!r}: expected one of {TOKENIZERS} "
            "and an integer >= 1, together"
        )
    # The node's own rendering, so the vectors check what a node trains. Imported here: it brings
    # torch and the node (seconds), and only contexts naming a tokenizer need it.
    from swarmnode.roles.convert import trained_texts

    policy = _builtin_policy()

    def render(texts: Sequence[str]) -> Sequence[TrainedText | RejectReason]:
        return trained_texts(policy, texts, max_new)

    return render


@functools.cache
def _builtin_policy() -> Policy:
    """The built-in tiny model's policy (deterministic), for its character tokenizer (SPEC.md §6)."""
    from swarmnode.policy import build_tiny_policy

    return build_tiny_policy(0)


def verifier_for_context(ctx: dict[str, Any], families: Iterable[tuple[str, str, str]]) -> VerifierPool:
    """The verification boundary (not started) a context's receiver scores with: one worker, the
    context's CPU limits, and upstream's scorer for its ``sandbox_upstream`` families (inside the
    sandbox). Only ``vector_context`` lets a vector's own context set those."""
    defaults = VerifierLimits()
    limits = VerifierLimits(
        completion_cpu_s=float(ctx.get("completion_cpu_s", defaults.completion_cpu_s)),
        batch_cpu_s=float(ctx.get("batch_cpu_s", defaults.batch_cpu_s)),
    )
    upstream = ctx.get(SANDBOX_UPSTREAM, [])
    if not isinstance(upstream, list) or not all(isinstance(name, str) for name in upstream):
        raise ValueError(f"{SANDBOX_UPSTREAM} must be a list of task family names")
    return VerifierPool(limits, workers=1, families=families, unsafe_upstream=upstream)


def vector_with_bytes(manifest: dict[str, Any], directory: Path, data: bytes) -> dict[str, Any] | None:
    """The vector of ``manifest`` (its files in ``directory``) whose own context applies to ``data``:
    one whose file holds exactly these bytes. Matching the bytes, never a name, keeps a vector's
    switches (``sandbox_upstream``) off any file but the committed vector itself."""
    read: set[str] = set()  # each file once (red team: 60,000 entries naming one file took 18 s)
    for entry in manifest.get("vectors", []):
        if not isinstance(entry, dict) or "context" not in entry or not isinstance(entry.get("file"), str):
            continue
        name = Path(entry["file"]).name
        if name in read:
            continue
        read.add(name)
        try:
            if read_envelope_file(directory / name) == data:
                return entry
        except OSError:
            continue
    return None


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


def read_regular_file(path: Path, limit: int) -> bytes:
    """At most ``limit + 1`` bytes of ``path``, which must be a regular file; raises ``OSError``
    naming what is wrong. One byte over the limit tells the caller the file is longer.

    Red team: the whole file was read first (an 8-GiB file: 35 s and 8.4 GB of memory before
    ``too_large``; ``/dev/zero`` was killed, a FIFO without a writer hung; the same through a
    ``--context`` symlink)."""
    # O_NONBLOCK: opening a FIFO without a writer must not wait, nor a read of a /proc file that
    # blocks; regular files ignore it.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as file:
            return file.read(limit + 1)
    finally:
        os.close(fd)


def read_envelope_file(path: Path) -> bytes:
    """One envelope's worth of ``path``: a longer file is judged ``too_large`` by admission."""
    return read_regular_file(path, MAX_ENVELOPE_BYTES)


#: A vectors manifest is a few hundred KiB; a context file beyond this is refused unread.
MAX_CONTEXT_BYTES = 4 * 1024 * 1024


def read_context(path: Path) -> dict[str, Any]:
    data = read_regular_file(path, MAX_CONTEXT_BYTES)
    if len(data) > MAX_CONTEXT_BYTES:
        raise ValueError(f"over {MAX_CONTEXT_BYTES // (1024 * 1024)} MiB")
    manifest = json.loads(data.decode("utf-8"))
    if not isinstance(manifest, dict):
        raise ValueError("not a JSON object")
    return manifest


#: Bounds on a context's clock and time windows, in seconds: NaN, infinity or 1e308 would turn
#: freshness off (red team).
MAX_CONTEXT_SECONDS = 1e11


def _finite_now(value: Any, where: str) -> float:
    """A context's clock or time window as a float in [0, MAX_CONTEXT_SECONDS]."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{where} must be a number of seconds, not {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number) or not 0 <= number <= MAX_CONTEXT_SECONDS:
        raise ValueError(f"{where} must be a finite number of seconds in [0, 1e11], not {value!r}")
    return number


def _run_check(args: argparse.Namespace) -> int:
    try:
        data = read_envelope_file(Path(args.file))
    except OSError as exc:
        print(f"unreadable: cannot read {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_UNREADABLE
    if args.now is not None and not math.isfinite(args.now):
        print(f"unreadable: --now must be a finite Unix time, not {args.now}", file=sys.stderr)
        return EXIT_UNREADABLE
    ctx: dict[str, Any] | None = None
    vector: dict[str, Any] | None = None
    if args.context is not None:
        try:
            manifest = read_context(Path(args.context))
            vector = vector_with_bytes(manifest, Path(args.context).parent, data)
            ctx = vector_context(manifest, vector)
            for key in ("now", "max_age_s", "max_future_s"):
                _finite_now(ctx[key], f"the context's {key}")
            receiver_families(ctx)  # its allowed_tasks must be a list of [dataset, config, format]
            if SANDBOX_UPSTREAM in ctx and hashlib.sha256(data).hexdigest() not in CONFORMANCE_SHA256:
                raise ValueError(
                    f"{SANDBOX_UPSTREAM} applies only to the project's own conformance vectors "
                    f"({', '.join(sorted(CONFORMANCE_SHA256.values()))}), not to these bytes"
                )
        except (OSError, ValueError, KeyError, TypeError, OverflowError, RecursionError) as exc:
            # RecursionError: JSON nested 200,000 deep; OverflowError: a 400-digit number as a float.
            print(
                f"unreadable: {args.context} is not a vectors manifest with a context: {exc}", file=sys.stderr
            )
            return EXIT_UNREADABLE
        if args.now is not None:
            ctx = {**ctx, "now": args.now}
    # The file is a stranger's bytes: its completions are scored behind the verification boundary,
    # whose worker warms, before it locks itself in, the families the file names that this receiver
    # accepts (red team: warming a family with the file's own config, 1,000-digit numbers, stalled
    # the tool for 60 s; a receiver refuses such a task before regenerating it).
    allowed = receiver_families(ctx)
    families = [f for f in families_named(data) if allowed is None or f in allowed]
    if len(families) > MAX_CHECKED_FAMILIES:
        print(
            f"unreadable: the file names {len(families)} task families; this tool checks at most "
            f"{MAX_CHECKED_FAMILIES}",
            file=sys.stderr,
        )
        return EXIT_UNREADABLE
    _limit_cpu(CHECK_CPU_S)
    try:
        verifier = (
            VerifierPool(workers=1, families=families) if ctx is None else verifier_for_context(ctx, families)
        )
        verifier.start()
    except (RuntimeError, ValueError, TypeError) as exc:
        print(
            f"unreadable: the verifier could not start for the file's task families: {exc}", file=sys.stderr
        )
        return EXIT_UNREADABLE
    try:
        return _check_with(args, data, verifier, ctx, vector)
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


def receiver_families(ctx: dict[str, Any] | None) -> frozenset[tuple[str, str, str]] | None:
    """The task families the receiver accepts: the context's (None there: any), else those of the
    built-in task mixtures (the default one and ``sapo``), as a node set up by default accepts."""
    if ctx is not None:
        allowed = ctx.get("allowed_tasks")
        return None if allowed is None else frozenset((str(a), str(b), str(c)) for a, b, c in allowed)
    from swarmnode.tasks import default_mixture, sapo_mixture

    return task_families(default_mixture(0)) | task_families(sapo_mixture(0))


def families_named(data: bytes) -> list[tuple[str, str, str]]:
    """The task families a rollout batch's groups name, or [] for anything else."""
    envelope = decode_envelope(data)
    if isinstance(envelope, WireError):
        return []
    message = decode_payload(envelope.kind, envelope.payload)
    if not isinstance(message, RolloutBatch):
        return []
    return sorted({(g.task.dataset, g.task.config, g.task.prompt_format) for g in message.groups})


def _check_with(
    args: argparse.Namespace,
    data: bytes,
    verifier: VerifierPool,
    ctx: dict[str, Any] | None,
    vector: dict[str, Any] | None,
) -> int:
    if ctx is not None:
        try:
            pipeline = pipeline_for_context(ctx, verifier.score)
        except (ValueError, KeyError, TypeError, OverflowError) as exc:
            print(f"unreadable: {args.context}: cannot build its receiver: {exc}", file=sys.stderr)
            return EXIT_UNREADABLE
        now = float(ctx["now"])
    else:
        now = time.time() if args.now is None else float(args.now)
        # Judged as a node with the default settings would: the built-in mixtures' families only.
        # A stranger's file must not choose what this process regenerates (a config of 10**6-digit
        # numbers costs what its author wants it to).
        pipeline = AdmissionPipeline(
            AdmissionConfig(allowed_tasks=receiver_families(None)), now=now, score_groups=verifier.score
        )
    verdict = pipeline.admit(data, now)
    print(describe(verdict))
    if vector is not None:
        fields = ", ".join(sorted(vector["context"]))
        print(f"  judged as vector {vector['file']}, in its own context ({fields})")
    return EXIT_ACCEPTED if verdict.accepted else EXIT_REJECTED


def _run_vectors(args: argparse.Namespace) -> int:
    from swarmnode.tools.vectors import write  # imports reasoning-gym tasks: only when asked

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
        help="a vectors manifest.json: judge as its receiver (its now, policy versions, allowed tasks); "
        "a file holding exactly the bytes of one of its vectors is judged in that vector's own context; "
        "without it, as a node with default settings (the built-in mixtures' task families)",
    )
    check.set_defaults(func=_run_check)
    vectors = sub.add_parser("vectors", help="regenerate the protocol test vectors into DIR")
    vectors.add_argument("--out", type=Path, required=True, metavar="DIR")
    vectors.set_defaults(func=_run_vectors)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m swarmnode.tools.protocol_cli")
    add_protocol_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
