"""`swarmnode protocol check|vectors`: verdict on stdout, exit 0 accepted / 1 rejected / 2 unreadable."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarmnode.tools.protocol_cli import EXIT_ACCEPTED, EXIT_REJECTED, EXIT_UNREADABLE, main

VECTORS = Path(__file__).resolve().parents[2] / "protocol" / "vectors"
CONTEXT = ["--context", str(VECTORS / "manifest.json")]


def test_check_accepts_a_valid_envelope_and_prints_local_rewards(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["protocol", "check", str(VECTORS / "rollout_batch.bin"), *CONTEXT])
    out = capsys.readouterr().out
    assert code == EXIT_ACCEPTED
    assert out.startswith("accepted rollout_batch from 6pasmonaqisra63yc36zktgumr74tspj")
    assert "local rewards [1, 0, 1, 0.5]" in out


def test_check_rejects_a_forged_envelope_naming_the_reason_and_step(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["protocol", "check", str(VECTORS / "wrong_key.bin"), *CONTEXT])
    out = capsys.readouterr().out
    assert code == EXIT_REJECTED
    assert out.startswith("rejected bad_signature (step: signature)")


def test_check_without_context_judges_at_the_current_time(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["protocol", "check", str(VECTORS / "heartbeat.bin")])
    assert code == EXIT_REJECTED
    assert capsys.readouterr().out.startswith("rejected too_old")
    code = main(["protocol", "check", str(VECTORS / "heartbeat.bin"), "--now", "1767225600"])
    assert code == EXIT_ACCEPTED


@pytest.mark.parametrize("target", ["missing.bin", "."])
def test_check_on_an_unreadable_file_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str
) -> None:
    code = main(["protocol", "check", str(tmp_path / target)])
    assert code == EXIT_UNREADABLE
    assert "unreadable" in capsys.readouterr().err


def test_check_with_a_bad_context_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "ctx.json").write_text("{}")
    code = main(
        ["protocol", "check", str(VECTORS / "heartbeat.bin"), "--context", str(tmp_path / "ctx.json")]
    )
    assert code == EXIT_UNREADABLE


def test_vectors_subcommand_writes_the_committed_vectors(tmp_path: Path) -> None:
    assert main(["protocol", "vectors", "--out", str(tmp_path / "v")]) == 0
    assert (tmp_path / "v" / "rollout_batch.bin").read_bytes() == (VECTORS / "rollout_batch.bin").read_bytes()


def test_add_protocol_parser_plugs_into_any_argparse_cli() -> None:
    import argparse

    from swarmnode.tools.protocol_cli import add_protocol_parser

    parser = argparse.ArgumentParser(prog="swarmnode")
    add_protocol_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["protocol", "check", "f.bin"])
    assert callable(args.func) and args.file == Path("f.bin")


def test_check_judges_a_vector_in_its_own_context_through_the_sandbox(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A copy of the vector (same bytes, another name) gets the vector's context: upstream's scorer
    runs, inside the sandbox, and its SystemExit is a verdict."""
    copy = tmp_path / "received.bin"
    copy.write_bytes((VECTORS / "scorer_raises_system_exit.bin").read_bytes())
    code = main(["protocol", "check", str(copy), *CONTEXT])
    out = capsys.readouterr().out
    assert code == EXIT_REJECTED
    assert out.startswith("rejected verifier_failed (step: rescore)")
    assert "judged as vector scorer_raises_system_exit.bin, in its own context" in out


def test_a_vectors_context_never_applies_to_other_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same attack signed again (other bytes): judged by the manifest's receiver, which does not
    train on the family, so no scorer runs and no switch of the vector applies."""
    from swarmnode.tasks import TaskId, regenerate
    from swarmnode.tools import vectors
    from swarmnode.wire.envelope import encode_envelope
    from swarmnode.wire.messages import RolloutBatch

    family = regenerate(TaskId(*vectors.BINARY_MATRIX[:2], vectors.TASK_SEED, 0, vectors.BINARY_MATRIX[2]))
    group = vectors.vector_group(family, ["<answer>exit(3)</answer>"], claimed=[1.0])
    resigned = vectors._envelope(RolloutBatch(groups=(group,)), sent_at_ms=vectors.SENT_AT_MS + 1)
    path = tmp_path / "received.bin"
    path.write_bytes(encode_envelope(resigned))
    code = main(["protocol", "check", str(path), *CONTEXT])
    out = capsys.readouterr().out
    assert code == EXIT_REJECTED
    assert out.startswith("rejected task_not_allowed") and "judged as vector" not in out


def test_a_manifest_cannot_switch_the_sandbox_on_for_every_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    manifest = json.loads((VECTORS / "manifest.json").read_text(encoding="utf-8"))
    manifest["context"]["sandbox_upstream"] = ["binary_matrix"]
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    code = main(
        ["protocol", "check", str(VECTORS / "heartbeat.bin"), "--context", str(tmp_path / "manifest.json")]
    )
    assert code == EXIT_UNREADABLE
    assert "sandbox_upstream" in capsys.readouterr().err


def test_a_strangers_manifest_cannot_switch_the_sandbox_on_for_its_own_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A manifest is an input too: one that names a stranger's file in a vector with
    ``sandbox_upstream`` would have upstream's eval scorer run that file's answers. Only the
    project's own two conformance vectors may be judged with the switch on."""
    import json

    from swarmnode.tasks import TaskId, regenerate
    from swarmnode.tools import vectors
    from swarmnode.wire.envelope import encode_envelope
    from swarmnode.wire.messages import RolloutBatch

    family = regenerate(TaskId(*vectors.BINARY_MATRIX[:2], vectors.TASK_SEED, 0, vectors.BINARY_MATRIX[2]))
    group = vectors.vector_group(family, ["<answer>open('pwned', 'w').write('x')</answer>"], claimed=[1.0])
    hostile = encode_envelope(vectors._envelope(RolloutBatch(groups=(group,)), sent_at_ms=vectors.SENT_AT_MS))
    (tmp_path / "hostile.bin").write_bytes(hostile)
    manifest = json.loads((VECTORS / "manifest.json").read_text(encoding="utf-8"))
    sandboxed = next(v for v in manifest["vectors"] if "sandbox_upstream" in v.get("context", {}))
    manifest["vectors"] = [{**sandboxed, "file": "hostile.bin"}]
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    code = main(
        ["protocol", "check", str(tmp_path / "hostile.bin"), "--context", str(tmp_path / "manifest.json")]
    )
    assert code == EXIT_UNREADABLE
    assert "only to the project's own conformance vectors" in capsys.readouterr().err
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()


def test_the_conformance_digests_are_those_of_the_committed_vectors() -> None:
    import hashlib

    from swarmnode.tools.protocol_cli import CONFORMANCE_SHA256

    for digest, name in CONFORMANCE_SHA256.items():
        assert hashlib.sha256((VECTORS / name).read_bytes()).hexdigest() == digest, name


def test_check_renders_with_the_builtin_tokenizer_a_vector_names(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["protocol", "check", str(VECTORS / "completion_over_max_new_tokens.bin"), *CONTEXT])
    out = capsys.readouterr().out
    assert code == EXIT_REJECTED
    assert out.startswith("rejected completion_too_long (step: rescore)")
    code = main(["protocol", "check", str(VECTORS / "completion_within_max_new_tokens.bin"), *CONTEXT])
    assert code == EXIT_ACCEPTED
    assert "local rewards [1, 1, 1, 0]" in capsys.readouterr().out


def test_check_judges_a_file_naming_a_family_the_audit_refuses(capsys: pytest.CaptureFixture[str]) -> None:
    """Red team: a file naming spiral_matrix (its upstream scorer eval()s the answer) made the
    verifier worker fail its warm-up, so the tool said 'unreadable' instead of judging the file."""
    code = main(["protocol", "check", str(VECTORS / "unsafe_scorer_family.bin"), *CONTEXT])
    out = capsys.readouterr().out
    assert code == EXIT_REJECTED
    assert out.startswith("rejected task_not_allowed") and "spiral_matrix" in out and "eval" in out


@pytest.mark.parametrize("kind", ["fifo", "device", "oversized"])
def test_check_reads_at_most_one_envelope_from_a_regular_file(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Red team: the whole file was read first (8 GiB: 35 s, 8.4 GB of memory); /dev/zero was
    killed; a FIFO without a writer hung."""
    import os

    if kind == "fifo":
        target = tmp_path / "pipe"
        os.mkfifo(target)
        assert main(["protocol", "check", str(target)]) == EXIT_UNREADABLE
        assert "not a regular file" in capsys.readouterr().err
    elif kind == "device":
        assert main(["protocol", "check", "/dev/zero"]) == EXIT_UNREADABLE
        assert "not a regular file" in capsys.readouterr().err
    else:
        target = tmp_path / "huge.bin"
        with target.open("wb") as file:
            file.truncate(8 * 1024**3)  # sparse: 8 GiB of zeros, no disk used
        assert main(["protocol", "check", str(target)]) == EXIT_REJECTED
        assert capsys.readouterr().out.startswith("rejected too_large")


def test_check_refuses_a_clock_that_is_not_a_number(capsys: pytest.CaptureFixture[str]) -> None:
    """Red team: --now nan turned freshness off (every comparison with NaN is false)."""
    assert main(["protocol", "check", str(VECTORS / "heartbeat.bin"), "--now", "nan"]) == EXIT_UNREADABLE
    assert "finite" in capsys.readouterr().err


def test_check_never_regenerates_a_task_config_its_receiver_would_refuse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Red team: chain_sum with 1,000-digit numbers stalled the tool 60 s in the verifier's warm-up,
    then said 'unreadable'; without --context it ran into the CPU limit. Both are task_not_allowed."""
    import time
    from dataclasses import replace

    from swarmnode.tasks import TaskId
    from swarmnode.tools import vectors
    from swarmnode.wire.envelope import encode_envelope, seal
    from swarmnode.wire.messages import RolloutBatch

    group = vectors.vector_group(vectors.vector_task(1), ["84"])
    hostile = TaskId("chain_sum", '{"max_digits":' + "9" * 1000 + "}", 7, 0, "compact")
    target = tmp_path / "bigint.bin"
    sealed = seal(
        vectors.KEYS["sender"], RolloutBatch(groups=(replace(group, task=hostile),)), vectors.SENT_AT_MS
    )
    target.write_bytes(encode_envelope(sealed))
    for extra in ([], CONTEXT):
        started = time.monotonic()
        code = main(["protocol", "check", str(target), "--now", "1767225600", *extra])
        out = capsys.readouterr().out
        assert code == EXIT_REJECTED and out.startswith("rejected task_not_allowed"), out
        assert time.monotonic() - started < 30


def test_a_context_is_read_from_a_bounded_regular_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Red team round 4: --context through a symlink to /dev/zero reached 7.2 GB in 15 s; a FIFO hung."""
    link = tmp_path / "manifest.json"
    link.symlink_to("/dev/zero")
    code = main(["protocol", "check", str(VECTORS / "heartbeat.bin"), "--context", str(link)])
    assert code == EXIT_UNREADABLE and "not a regular file" in capsys.readouterr().err
    huge = tmp_path / "huge.json"
    with huge.open("wb") as file:
        file.truncate(64 * 1024 * 1024)
    assert (
        main(["protocol", "check", str(VECTORS / "heartbeat.bin"), "--context", str(huge)]) == EXIT_UNREADABLE
    )
    assert "MiB" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("key", "value"),
    [("max_age_s", "NaN"), ("max_future_s", "NaN"), ("max_age_s", "Infinity"), ("max_age_s", "1e308")],
)
def test_a_context_whose_time_window_is_not_a_number_is_refused(
    key: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Red team round 4: max_age_s NaN accepted too_old.bin, max_future_s NaN accepted from_future.bin."""
    import json

    manifest = json.loads((VECTORS / "manifest.json").read_text(encoding="utf-8"))
    manifest["context"][key] = float(value)
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(manifest), encoding="utf-8")  # json writes NaN / Infinity as such
    for vector in ("too_old.bin", "from_future.bin"):
        code = main(["protocol", "check", str(VECTORS / vector), "--context", str(path)])
        assert code == EXIT_UNREADABLE and "finite" in capsys.readouterr().err


@pytest.mark.parametrize("case", ["deep_nesting", "huge_integer", "allowed_tasks_not_triples"])
def test_a_malformed_context_is_unreadable_not_a_crash(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Red team round 5: these raised RecursionError, OverflowError and TypeError out of the tool
    (exit 1, the code for "rejected")."""
    import json

    path = tmp_path / "manifest.json"
    if case == "deep_nesting":
        path.write_text("[" * 200_000, encoding="utf-8")
    else:
        manifest = json.loads((VECTORS / "manifest.json").read_text(encoding="utf-8"))
        if case == "huge_integer":
            manifest["context"]["max_age_s"] = 10**400
        else:
            manifest["context"]["allowed_tasks"] = [["chain_sum", "{}", "compact"], 5]
        path.write_text(json.dumps(manifest), encoding="utf-8")
    assert (
        main(["protocol", "check", str(VECTORS / "heartbeat.bin"), "--context", str(path)]) == EXIT_UNREADABLE
    )
    assert "unreadable" in capsys.readouterr().err
