"""The ledger: a durable SQLite (WAL) record of rounds, bans and rejections that refuses foreign files."""

from __future__ import annotations

import math
import sqlite3
import threading
from pathlib import Path

import pytest

from swarmnode.errors import SwarmError
from swarmnode.store import Ledger, LedgerError, RoundRecord
from swarmnode.store.ledger import APPLICATION_ID, OTHER_PEERS, SCHEMA_VERSION


def record(round: int, **changes: object) -> RoundRecord:
    fields: dict[str, object] = {
        "round": round,
        "started_at": 1_700_000_000.25 + round,
        "seconds": 1.5,
        "mean_reward": 0.1 * round,
        "accuracy": 1 / 3,
        "tokens_generated": 1000 + round,
        "loss": -0.123456789012345,
        "policy_version": round,
        "extra": {"kl": 0.01, "clip_fraction": 0.2},
    }
    fields.update(changes)
    return RoundRecord(**fields)  # type: ignore[arg-type]


def raw(path: Path, sql: str) -> object:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchone()[0]
    finally:
        conn.close()


def test_ledger_file_is_in_wal_mode_and_marked_with_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    with Ledger(path):
        pass
    assert raw(path, "PRAGMA journal_mode") == "wal"
    assert raw(path, "PRAGMA user_version") == SCHEMA_VERSION
    assert raw(path, "PRAGMA application_id") == APPLICATION_ID


def test_round_records_round_trip_exactly_after_reopen(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    written = [record(r) for r in (3, 1, 2)]
    with Ledger(path) as ledger:
        for rec in written:
            ledger.record_round(rec)
    with Ledger(path) as ledger:
        assert ledger.rounds() == sorted(written, key=lambda r: r.round)
        assert ledger.last_round() == 3


def test_empty_ledger_has_no_last_round(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        assert ledger.last_round() is None
        assert ledger.rounds() == []


def test_the_highest_policy_version_outlives_the_rounds_a_resume_forgets(tmp_path: Path) -> None:
    # A learner reads it before resuming (truncate_after), to number its versions past it.
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        assert ledger.highest_policy_version() is None
        for r in range(1, 6):
            ledger.record_round(record(r, policy_version=10 + r))
        assert ledger.highest_policy_version() == 15
        ledger.truncate_after(2)
        assert ledger.highest_policy_version() == 12


def test_recording_a_round_again_replaces_it(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        ledger.record_round(record(1, loss=5.0))
        ledger.record_round(record(1, loss=2.0))
        assert [r.loss for r in ledger.rounds()] == [2.0]


def test_non_finite_metrics_are_kept_not_rejected(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        ledger.record_round(record(1, loss=math.nan, mean_reward=math.inf, extra={"kl": math.nan}))
        (got,) = ledger.rounds()
    assert math.isnan(got.loss)
    assert got.mean_reward == math.inf
    assert math.isnan(got.extra["kl"])


def test_truncate_after_forgets_only_later_rounds(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        for r in range(1, 6):
            ledger.record_round(record(r))
        assert ledger.truncate_after(3) == 2
        assert [r.round for r in ledger.rounds()] == [1, 2, 3]


def test_bans_persist_across_reopen_and_expire(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as ledger:
        ledger.put_ban("peer-a", until=200.0, reason="bad signature")
        ledger.put_ban("peer-b", until=100.0, reason="replay")
    with Ledger(path) as ledger:
        assert ledger.active_bans(now=50.0) == {"peer-a": 200.0, "peer-b": 100.0}
        assert ledger.active_bans(now=100.0) == {"peer-a": 200.0}  # a ban ends at `until`
        assert ledger.active_bans(now=250.0) == {}


def test_putting_a_ban_again_replaces_its_end(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        ledger.put_ban("peer-a", until=200.0, reason="first")
        ledger.put_ban("peer-a", until=500.0, reason="second")
        assert ledger.active_bans(now=300.0) == {"peer-a": 500.0}


def test_forget_expired_bans_deletes_only_ended_bans(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        ledger.put_ban("old", until=10.0, reason="x")
        ledger.put_ban("current", until=1000.0, reason="x")
        assert ledger.forget_expired_bans(now=10.0) == 1
        assert ledger.active_bans(now=0.0) == {"current": 1000.0}


def test_rejection_counters_count_per_reason_and_peer_and_persist(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as ledger:
        for _ in range(3):
            ledger.count_rejection("peer-a", "bad_signature")
        ledger.count_rejection("peer-b", "bad_signature")
        ledger.count_rejection("peer-b", "stale")
    with Ledger(path) as ledger:
        assert ledger.rejection_counts() == {"bad_signature": 4, "stale": 1}
        assert ledger.rejection_counts("peer-b") == {"bad_signature": 1, "stale": 1}
        assert ledger.rejection_counts("peer-c") == {}
        assert ledger.rejection_counts_by_peer() == {"peer-a": 3, "peer-b": 2}


def test_the_pages_rejection_read_is_bounded_and_keeps_every_shown_peers_record(tmp_path: Path) -> None:
    # Red team (dashboard): 64 fresh ids out-rejected the attacker, whose record left its row.
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        for _ in range(5):
            ledger.count_rejection("attacker", "from_future")
        for i in range(70):
            for _ in range(50):
                ledger.count_rejection(f"flood-{i:02d}", "malformed")
        top = ledger.rejections_by_peer_and_reason(64)
        assert len(top) == 64 and "attacker" not in top
        shown = ledger.rejections_by_peer_and_reason(64, ["attacker", "never-rejected"])
        assert shown["attacker"] == {"from_future": 5} and "never-rejected" not in shown
        assert len(shown) == 65


def test_past_its_bound_the_peers_with_fewest_rejections_fold_into_one_row_and_totals_stay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Red team rt61 F3: free delivering ids each added a row, without end, and every page read
    # grouped the whole table.
    monkeypatch.setattr("swarmnode.store.ledger.MAX_REJECTION_PEERS", 3)
    monkeypatch.setattr("swarmnode.store.ledger.REJECTION_PRUNE_EVERY", 5)
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        for _ in range(4):
            ledger.count_rejection("persistent", "bad_signature")
        for i in range(11):
            ledger.count_rejection(f"fresh-{i:02d}", "malformed")
        # 15 counted: two checks; at the second, 12 peers, the 3 with most kept (ties by id)
        assert ledger.rejection_counts_by_peer() == {
            "persistent": 4,
            "fresh-00": 1,
            "fresh-01": 1,
            OTHER_PEERS: 9,
        }
        assert ledger.rejection_counts() == {"bad_signature": 4, "malformed": 11}
        for i in range(11, 16):
            ledger.count_rejection(f"fresh-{i:02d}", "stale")
        assert ledger.rejection_counts() == {"bad_signature": 4, "malformed": 11, "stale": 5}
        assert len(ledger.rejection_counts_by_peer()) == 4


def test_ledger_can_be_written_from_several_threads(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.sqlite") as ledger:

        def work(i: int) -> None:
            for _ in range(25):
                ledger.count_rejection(f"peer-{i}", "stale")

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert ledger.rejection_counts() == {"stale": 100}


def test_file_that_is_not_sqlite_is_refused_with_its_path_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    content = b"my precious notes, definitely not a database\n" * 100
    path.write_bytes(content)
    with pytest.raises(LedgerError, match="not a swarmnode ledger") as info:
        Ledger(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, SwarmError)
    assert path.read_bytes() == content


def test_sqlite_file_of_another_application_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "other.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE contacts (name TEXT)")
    conn.execute("INSERT INTO contacts VALUES ('ada')")
    conn.commit()
    conn.close()
    content = path.read_bytes()
    with pytest.raises(LedgerError, match="not a swarmnode ledger") as info:
        Ledger(path)
    assert str(path) in str(info.value)
    assert path.read_bytes() == content


def test_corrupt_ledger_is_refused_with_its_path_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as ledger:
        for r in range(1, 200):
            ledger.record_round(record(r, extra={f"metric_{i}": float(i) for i in range(20)}))
    page_size = int(raw(path, "PRAGMA page_size"))  # type: ignore[call-overload]
    data = bytearray(path.read_bytes())
    assert len(data) > 4 * page_size
    # Scribble over the second page (the first b-tree page after the schema page).
    data[page_size : page_size + 64] = b"\xa5" * 64
    path.write_bytes(bytes(data))
    with pytest.raises(LedgerError, match="corrupt") as info:
        Ledger(path)
    assert str(path) in str(info.value)
    assert path.read_bytes() == bytes(data)


def test_ledger_from_a_newer_swarmnode_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    Ledger(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(LedgerError, match="newer"):
        Ledger(path)


def test_ledger_path_that_is_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(LedgerError, match=str(tmp_path)):
        Ledger(tmp_path)


def test_empty_file_becomes_a_new_ledger(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    path.touch()
    with Ledger(path) as ledger:
        ledger.record_round(record(1))
    with Ledger(path) as ledger:
        assert ledger.last_round() == 1


def test_peer_standing_is_replaced_whole_and_read_back_after_reopen(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as ledger:
        ledger.save_standing([("peer-a", 3), ("peer-b", 12)])
        ledger.save_standing([("peer-b", 13), ("peer-c", 1)])
    with Ledger(path) as ledger:
        assert ledger.standing() == [("peer-b", 13), ("peer-c", 1)]


def test_a_ledger_of_the_first_schema_gains_the_standing_table_and_keeps_its_rounds(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as ledger:
        ledger.record_round(record(1))
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE standing")
    conn.execute("PRAGMA user_version = 1")
    conn.close()
    with Ledger(path) as ledger:
        assert ledger.standing() == [] and [r.round for r in ledger.rounds()] == [1]
        ledger.save_standing([("peer-a", 2)])
    assert raw(path, "PRAGMA user_version") == SCHEMA_VERSION == 2
