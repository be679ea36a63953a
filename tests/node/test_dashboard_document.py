"""The page's document (``ops.dashboard``): bounded whatever the ledger's length or the number of
peers, valid JSON whatever the figures, and drawn from the ledger incrementally."""

from __future__ import annotations

import json
import math
from pathlib import Path

from swarmnode.ops.dashboard import (
    MAX_POINTS,
    Chart,
    CounterHistory,
    Dashboard,
    LedgerRounds,
    PeerRow,
    Section,
    Series,
    downsample,
    peers_table,
)
from swarmnode.store import Ledger, RoundRecord


def record(r: int, **extra: float) -> RoundRecord:
    return RoundRecord(r, 0.0, 0.1, r / 10, 0.0, 10, 0.0, r, {"groups_used": 4.0, **extra})


def test_a_long_series_is_averaged_into_at_most_max_points_buckets() -> None:
    points = [(float(i), float(i % 2)) for i in range(10_000)]
    out = downsample(points)
    assert len(out) == MAX_POINTS
    assert out[0][0] < out[-1][0] and all(abs(y - 0.5) < 0.02 for _, y in out)  # the trend, not the noise
    assert downsample(points[:5]) == points[:5]


def test_the_ledger_is_read_incrementally_and_charts_redrawn_only_for_new_rounds(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        for r in range(1, 21):
            ledger.record_round(
                record(r, **({"heldout_accuracy": 0.5, "heldout/add": 0.4} if r % 10 == 0 else {}))
            )
        source = LedgerRounds(ledger)
        first = source.charts()
        assert source.charts() is first  # nothing new: the same charts
        reward, heldout, used = first
        assert len(reward.series[0].points) == 20 and used.series[0].points[0] == (1.0, 4.0)
        assert [s.name for s in heldout.series] == ["mean", "add"] and len(heldout.series[0].points) == 2
        ledger.record_round(record(21))
        again = source.charts()
        assert again is not first and len(again[0].series[0].points) == 21
        assert [x for x, _ in again[0].series[0].points] == [float(r) for r in range(1, 22)]  # each once


def test_the_peers_table_puts_banned_peers_first_and_never_grows_past_its_cap() -> None:
    rows = [PeerRow(f"peer-{i}", admitted=i, used=i // 2, replayed=3 * i) for i in range(100)]
    rows.append(PeerRow("attacker", rejections={"bad_signature": 3}, banned_until=1_000.0))
    table = peers_table(rows, now=400.0, max_rows=10)
    assert len(table.rows) == 10 and table.note == "91 more peers not shown"
    assert table.row_classes[0] == "banned" and table.rows[0][0] == "attacker"
    assert table.rows[0][6] == "bad_signature 3" and table.rows[0][7] == "banned, 10 min left"
    assert [r[0] for r in table.rows[1:3]] == ["peer-99", "peer-98"]  # then by groups admitted
    assert table.rows[1][3:6] == ["99", "49", "297"]  # admitted, used, replayed (rt60 L4)


def test_nan_and_infinity_become_gaps_so_the_document_is_always_json() -> None:
    doc = Dashboard(
        "t", "trainer", sections=[Section("s", charts=[Chart("c", "c", [Series("x", [(1.0, math.nan)])])])]
    )
    doc.cards.append(("loss", "-"))
    text = json.dumps(doc.as_json(), allow_nan=False)
    assert json.loads(text)["sections"][0]["charts"][0]["series"][0]["points"] == [[1.0, None]]


def test_a_counter_history_keeps_a_bounded_number_of_samples() -> None:
    history = CounterHistory(keep=50)
    for r in range(500):
        history.add(r, {"accepted": r, "replay": 1})
    chart = history.chart("v", "verdicts")
    assert len(history) == 50
    assert {s.name: s.points[-1] for s in chart.series} == {
        "accepted": (499.0, 499.0),
        "replay": (499.0, 1.0),
    }


def test_banned_throwaway_identities_cannot_push_the_peers_we_train_on_out_of_view() -> None:
    # Red team: 64 identities banned in a minute (the new-identity budget) took all 64 rows.
    rows = [PeerRow(f"sybil-{i}", rejections={"prompt_mismatch": 1}, banned_until=1_000.0) for i in range(64)]
    rows += [PeerRow(f"honest-{i}", admitted=3) for i in range(5)] + [PeerRow("active", admitted=5)]
    table = peers_table(rows, now=400.0)
    shown = [r[0] for r in table.rows]
    assert "active" in shown and all(f"honest-{i}" in shown for i in range(5))
    assert table.row_classes[0] == "banned" and "of them banned" in table.note
