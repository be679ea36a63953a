"""`swarmnode run --solo` and `swarmnode demo` draw the home's learning curves beside their summary."""

from __future__ import annotations

from pathlib import Path

from swarmnode.cli import _learning_png
from swarmnode.home import NodeHome
from swarmnode.store import Ledger, RoundRecord


def record(r: int) -> RoundRecord:
    extra = {"groups_used": 4.0, "external_used": 0.0}
    if r % 10 == 0:
        extra |= {"heldout_accuracy": r / 100, "heldout/add": r / 50, "heldout/mul": 0.1}
    return RoundRecord(r, 0.0, 0.1, r / 60, r / 60, 100, 0.0, r, extra)


def test_the_curves_of_the_whole_ledger_are_drawn_where_the_run_says(tmp_path: Path) -> None:
    home = NodeHome(tmp_path / "home").ensure()
    with Ledger(home.ledger) as ledger:
        for r in range(1, 41):
            ledger.record_round(record(r))
    path = tmp_path / "out" / "summary.png"
    said = _learning_png(home, path)
    assert said.endswith(str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_a_ledger_without_rounds_says_why_no_picture_was_drawn(tmp_path: Path) -> None:
    home = NodeHome(tmp_path / "home").ensure()
    Ledger(home.ledger).close()
    said = _learning_png(home, tmp_path / "summary.png")
    assert said == "learning curves not drawn: the ledger has no rounds yet"
    assert not (tmp_path / "summary.png").exists()
