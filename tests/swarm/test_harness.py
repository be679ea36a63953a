"""The process harness (``swarmnode.testing``): waits end on a predicate, and fail naming the
process and quoting its log; a stop is SIGINT first, SIGKILL only after the grace period."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from swarmnode.testing import HarnessError, ProcessExited, WaitTimedOut, spawn, wait_until

IGNORES_SIGINT = (
    "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "print('up', flush=True); time.sleep(60)"
)


def test_a_wait_returns_the_predicates_first_true_value() -> None:
    calls: list[int] = []

    def third_time() -> int | None:
        calls.append(1)
        return len(calls) if len(calls) >= 3 else None

    assert wait_until(third_time, 5.0, "the third call", interval=0.01) == 3


def test_a_wait_that_times_out_names_what_it_waited_for() -> None:
    with pytest.raises(WaitTimedOut, match="waiting for the impossible"):
        wait_until(lambda: False, 0.05, "the impossible", interval=0.01)


def test_a_child_that_exits_meanwhile_fails_the_wait_with_its_name_and_log(tmp_path: Path) -> None:
    proc = spawn("crasher", ["-c", "print('the reason it died'); raise SystemExit(3)"], tmp_path / "log")
    with pytest.raises(ProcessExited, match="crasher exited with 3") as caught:
        wait_until(lambda: None, 30.0, "something", procs=[proc], interval=0.01)
    assert "the reason it died" in str(caught.value)
    # Harness errors are assertion failures in a test, and SwarmErrors for the launcher.
    assert isinstance(caught.value, AssertionError) and isinstance(caught.value, HarnessError)


def test_a_ready_file_is_awaited_and_read(tmp_path: Path) -> None:
    ready = tmp_path / "ready.json"
    ready.write_text('{"stale": true}')  # left by an earlier run: must not count
    code = f"import json, time; time.sleep(0.2); open({str(ready)!r}, 'w').write(json.dumps({{'pid': 1}}))"
    proc = spawn("writer", ["-c", code + "; time.sleep(30)"], tmp_path / "log", ready_file=ready)
    try:
        assert proc.wait_ready(30.0) == {"pid": 1}
    finally:
        proc.stop(5.0)


def test_a_stop_is_sigint_then_sigkill_after_the_grace_period(tmp_path: Path) -> None:
    polite = spawn("polite", ["-c", "import time; time.sleep(60)"], tmp_path / "polite.log")
    stubborn = spawn("stubborn", ["-c", IGNORES_SIGINT], tmp_path / "stubborn.log")
    wait_until(lambda: "up" in stubborn.tail(), 30.0, "the stubborn child", procs=[stubborn], interval=0.02)
    assert polite.stop(10.0) != -signal.SIGKILL and not polite.killed
    began = time.monotonic()
    assert stubborn.stop(0.5) == -signal.SIGKILL and stubborn.killed
    assert time.monotonic() - began < 10.0
