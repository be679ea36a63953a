"""`swarmnode protocol check|vectors`: verdict on stdout, exit 0 accepted / 1 rejected / 2 unreadable."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarmnode.wire.cli_protocol import EXIT_ACCEPTED, EXIT_REJECTED, EXIT_UNREADABLE, main

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

    from swarmnode.wire.cli_protocol import add_protocol_parser

    parser = argparse.ArgumentParser(prog="swarmnode")
    add_protocol_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["protocol", "check", "f.bin"])
    assert callable(args.func) and args.file == Path("f.bin")
