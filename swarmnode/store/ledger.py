"""The node's durable ledger: one SQLite file (WAL mode) holding rounds, bans and rejection counts.

Owns the schema (versioned with ``PRAGMA user_version``, marked as ours with
``PRAGMA application_id``), its migrations, and every read and write of that file. It must
not decide anything: what a round measured, whom to ban and why are the callers' business.
It never deletes or rewrites a file it does not recognise as a swarmnode ledger.

Durability: round records and bans are committed with ``synchronous=FULL`` (fsync at each
commit), so a committed round survives a power cut. Rejection counters are statistics
about hostile or broken peers; they are committed with ``synchronous=NORMAL`` so that a
flood of bad input can never become a flood of fsyncs. In WAL mode NORMAL still survives a
killed process; only an OS crash or power cut can lose the last few counter updates.

Threads: a ``Ledger`` holds one connection guarded by a lock, so it may be called from any
thread (the event loop and the training worker both write to it); calls are serialised.
Each call is one short transaction, but a FULL commit costs an fsync (milliseconds), so
callers on the event loop should prefer ``asyncio.to_thread`` for ``record_round``.

Crash invariant shared with ``checkpoint.py`` (see ``swarmnode.store``): the trainer
commits round r to the ledger *before* it writes the checkpoint of round r.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from swarmnode.errors import SwarmError

__all__ = ["APPLICATION_ID", "SCHEMA_VERSION", "Ledger", "LedgerError", "RoundRecord"]

# "SWNL" in ASCII: marks a SQLite file as a swarmnode ledger (PRAGMA application_id).
APPLICATION_ID = 0x53574E4C
SCHEMA_VERSION = 2
# Seconds a statement waits for another connection's lock (e.g. `swarmnode status` reading).
_BUSY_TIMEOUT_S = 10.0
#: Peers whose rejections are kept apart. Failures before a signature is checked are charged to
#: the delivering peer, whose id is free: the table grew by a row a fresh id, without end, and
#: every dashboard read grouped all of it (1 M rows: 51 MiB, 0.46 s a read; red team rt61 F3).
#: Past the bound, the peers with the fewest rejections are folded into ``OTHER_PEERS``: 10,000
#: free ids with more rejections each fold a peer's few into it too (red team rt62 F4: statistics
#: only; totals stay exact and bans are kept apart).
MAX_REJECTION_PEERS = 10_000
#: ... checked once in this many counted rejections (a prune groups the table once).
REJECTION_PRUNE_EVERY = 1_000
#: The row that holds the folded peers' counts, per reason (totals stay exact).
OTHER_PEERS = "(other peers)"


class LedgerError(SwarmError):
    """The ledger file cannot be opened, is not a swarmnode ledger, is corrupt, or a write failed."""


@dataclass(frozen=True)
class RoundRecord:
    """What one training round measured. ``extra`` holds further named metrics."""

    round: int
    started_at: float
    seconds: float
    mean_reward: float
    accuracy: float
    tokens_generated: int
    loss: float
    policy_version: int
    extra: dict[str, float] = field(default_factory=dict)


def _migrate_0_to_1(conn: sqlite3.Connection) -> None:
    # REAL columns are nullable on purpose: SQLite stores NaN as NULL, and a diverged loss
    # (NaN) is a fact worth recording, not a reason to lose the round.
    conn.execute(
        """
        CREATE TABLE rounds (
            round INTEGER PRIMARY KEY,
            started_at REAL,
            seconds REAL,
            mean_reward REAL,
            accuracy REAL,
            tokens_generated INTEGER NOT NULL,
            loss REAL,
            policy_version INTEGER NOT NULL,
            extra TEXT NOT NULL
        )
        """
    )
    conn.execute("CREATE TABLE bans (peer_id TEXT PRIMARY KEY, until REAL NOT NULL, reason TEXT NOT NULL)")
    conn.execute(
        """
        CREATE TABLE rejections (
            peer_id TEXT NOT NULL,
            reason TEXT NOT NULL,
            count INTEGER NOT NULL,
            PRIMARY KEY (peer_id, reason)
        ) WITHOUT ROWID
        """
    )


def _migrate_1_to_2(conn: sqlite3.Connection) -> None:
    # The gossip core's proven peers (GossipCore.standing): kept across restarts.
    conn.execute("CREATE TABLE standing (peer_id TEXT PRIMARY KEY, score INTEGER NOT NULL) WITHOUT ROWID")


# _MIGRATIONS[v] upgrades a ledger from schema version v to v + 1.
_MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_migrate_0_to_1, _migrate_1_to_2]
assert len(_MIGRATIONS) == SCHEMA_VERSION


def _float_or_nan(value: float | None) -> float:
    return math.nan if value is None else float(value)


class Ledger:
    """A swarmnode ledger at ``path`` (created if missing). Use as a context manager or call close()."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._rejections_unpruned = 0  # rejections counted since the last check of the bound
        if self.path.is_dir():
            raise LedgerError(f"ledger path {self.path} is a directory; point it at a file")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.path.exists():
            # Created here with mode 0600 (SQLite gives its -wal/-shm files the database's mode);
            # an empty file is a valid empty SQLite database.
            with contextlib.suppress(FileExistsError):
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        try:
            self._conn = sqlite3.connect(
                self.path, timeout=_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot open ledger {self.path}: {exc}") from exc
        try:
            self._open()
        except BaseException:
            self._conn.close()
            raise

    # -- opening -----------------------------------------------------------------------------

    def _open(self) -> None:
        # Everything up to the version check only reads, so a foreign or corrupt file is
        # reported without a single byte of it being changed.
        try:
            app_id = self._conn.execute("PRAGMA application_id").fetchone()[0]
            version = self._conn.execute("PRAGMA user_version").fetchone()[0]
            n_objects = self._conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            raise LedgerError(
                f"{self.path} is not a swarmnode ledger or is corrupt ({exc}); "
                "move it aside (it was left untouched) or point the node at another file"
            ) from exc
        fresh = app_id == 0 and version == 0 and n_objects == 0
        if not fresh and app_id != APPLICATION_ID:
            raise LedgerError(
                f"{self.path} is an SQLite file that is not a swarmnode ledger "
                f"(application_id {app_id:#x}, expected {APPLICATION_ID:#x}); it was left untouched, "
                "point the node at another file"
            )
        if version > SCHEMA_VERSION:
            raise LedgerError(
                f"ledger {self.path} has schema version {version}, newer than this swarmnode "
                f"supports ({SCHEMA_VERSION}); upgrade swarmnode"
            )
        if not fresh:
            self._check_integrity()
        try:
            self._conn.execute(f"PRAGMA busy_timeout = {int(_BUSY_TIMEOUT_S * 1000)}")
            mode = self._conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise LedgerError(f"ledger {self.path}: SQLite refused WAL mode (got {mode!r})")
            self._conn.execute("PRAGMA synchronous = FULL")
            self._migrate(version)
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot open ledger {self.path}: {exc}") from exc

    def _check_integrity(self) -> None:
        try:
            rows = self._conn.execute("PRAGMA quick_check").fetchall()
        except sqlite3.DatabaseError as exc:
            raise LedgerError(
                f"ledger {self.path} is corrupt ({exc}); it was left untouched: restore it from a "
                "backup or move it aside to start a new ledger"
            ) from exc
        problems = [str(row[0]) for row in rows if row[0] != "ok"]
        if problems:
            raise LedgerError(
                f"ledger {self.path} is corrupt ({'; '.join(problems[:3])}); it was left untouched: "
                "restore it from a backup or move it aside to start a new ledger"
            )

    def _migrate(self, version: int) -> None:
        for v in range(version, SCHEMA_VERSION):
            with self._transaction():
                if v == 0:
                    self._conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                _MIGRATIONS[v](self._conn)
                # PRAGMA values cannot be bound as parameters; v is our own int.
                self._conn.execute(f"PRAGMA user_version = {v + 1}")

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        # BEGIN IMMEDIATE takes the write lock up front, so a transaction never fails
        # half-way through on a lock upgrade.
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    @contextlib.contextmanager
    def _op(self, what: str) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                yield self._conn
            except sqlite3.ProgrammingError:
                raise  # misuse (e.g. after close()): a bug, not a user-facing condition
            except sqlite3.Error as exc:
                raise LedgerError(f"ledger {self.path}: cannot {what}: {exc}") from exc

    # -- rounds ------------------------------------------------------------------------------

    def record_round(self, record: RoundRecord) -> None:
        """Commit one round durably (one transaction). Recording a round again replaces it."""
        extra = json.dumps({str(k): float(v) for k, v in record.extra.items()}, sort_keys=True)
        row = (
            int(record.round),
            float(record.started_at),
            float(record.seconds),
            float(record.mean_reward),
            float(record.accuracy),
            int(record.tokens_generated),
            float(record.loss),
            int(record.policy_version),
            extra,
        )
        with self._op(f"record round {record.round}") as conn, self._transaction():
            conn.execute(
                "INSERT OR REPLACE INTO rounds (round, started_at, seconds, mean_reward, accuracy, "
                "tokens_generated, loss, policy_version, extra) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                row,
            )

    def rounds(self, after: int | None = None) -> list[RoundRecord]:
        """Every recorded round (only those after round ``after`` when given), in round order."""
        with self._op("read rounds") as conn:
            rows = conn.execute(
                "SELECT round, started_at, seconds, mean_reward, accuracy, tokens_generated, loss, "
                "policy_version, extra FROM rounds WHERE round > ? ORDER BY round",
                (-(2**63) if after is None else int(after),),
            ).fetchall()
        return [
            RoundRecord(
                round=r[0],
                started_at=_float_or_nan(r[1]),
                seconds=_float_or_nan(r[2]),
                mean_reward=_float_or_nan(r[3]),
                accuracy=_float_or_nan(r[4]),
                tokens_generated=r[5],
                loss=_float_or_nan(r[6]),
                policy_version=r[7],
                extra={k: float(v) for k, v in json.loads(r[8]).items()},
            )
            for r in rows
        ]

    def last_round(self) -> int | None:
        """The highest recorded round, or None if no round was recorded."""
        with self._op("read the last round") as conn:
            value = conn.execute("SELECT max(round) FROM rounds").fetchone()[0]
        return None if value is None else int(value)

    def highest_policy_version(self) -> int | None:
        """The highest policy version any recorded round ended at (None: no round recorded)."""
        with self._op("read the highest policy version") as conn:
            value = conn.execute("SELECT max(policy_version) FROM rounds").fetchone()[0]
        return None if value is None else int(value)

    def truncate_after(self, round: int) -> int:
        """Forget rounds after ``round``; return how many were forgotten.

        The trainer calls this when it resumes from the checkpoint of ``round``: rounds
        recorded after it describe work whose results were lost with the process, and they
        are about to be done again.
        """
        with self._op(f"forget rounds after {round}") as conn, self._transaction():
            cursor = conn.execute("DELETE FROM rounds WHERE round > ?", (int(round),))
        return cursor.rowcount

    # -- bans --------------------------------------------------------------------------------

    def put_ban(self, peer_id: str, until: float, reason: str) -> None:
        """Ban ``peer_id`` until time ``until`` (replaces any earlier ban of that peer)."""
        with self._op(f"ban peer {peer_id}") as conn, self._transaction():
            conn.execute(
                "INSERT OR REPLACE INTO bans (peer_id, until, reason) VALUES (?, ?, ?)",
                (peer_id, float(until), reason),
            )

    def active_bans(self, now: float) -> dict[str, float]:
        """Peers banned at time ``now``, with the time each ban ends (a ban ends at ``until``)."""
        with self._op("read bans") as conn:
            rows = conn.execute("SELECT peer_id, until FROM bans WHERE until > ?", (float(now),)).fetchall()
        return {peer: until for peer, until in rows}

    def forget_expired_bans(self, now: float) -> int:
        """Delete bans that ended at or before ``now``; return how many."""
        with self._op("forget expired bans") as conn, self._transaction():
            cursor = conn.execute("DELETE FROM bans WHERE until <= ?", (float(now),))
        return cursor.rowcount

    # -- standing ----------------------------------------------------------------------------

    def save_standing(self, entries: list[tuple[str, int]]) -> None:
        """Replace the peers proven to the gossip core (peer id, score) with ``entries``."""
        with self._op("save peer standing") as conn, self._transaction():
            conn.execute("DELETE FROM standing")
            conn.executemany("INSERT OR REPLACE INTO standing (peer_id, score) VALUES (?, ?)", entries)

    def standing(self) -> list[tuple[str, int]]:
        """The peers proven to the gossip core when it was last saved (``save_standing``)."""
        with self._op("read peer standing") as conn:
            rows = conn.execute("SELECT peer_id, score FROM standing ORDER BY peer_id").fetchall()
        return [(str(peer), int(score)) for peer, score in rows]

    # -- rejections --------------------------------------------------------------------------

    def count_rejection(self, peer_id: str, reason: str) -> None:
        """Add one to the count of ``peer_id``'s input rejected for ``reason``."""
        with self._op(f"count a rejection of {peer_id}") as conn:
            # Statistics, not state: skip the commit fsync (see the module docstring).
            conn.execute("PRAGMA synchronous = NORMAL")
            try:
                with self._transaction():
                    conn.execute(
                        "INSERT INTO rejections (peer_id, reason, count) VALUES (?, ?, 1) "
                        "ON CONFLICT (peer_id, reason) DO UPDATE SET count = count + 1",
                        (peer_id, reason),
                    )
                self._rejections_unpruned += 1
                if self._rejections_unpruned >= REJECTION_PRUNE_EVERY:
                    self._rejections_unpruned = 0
                    with self._transaction():
                        self._fold_rejections(conn)
            finally:
                conn.execute("PRAGMA synchronous = FULL")

    @staticmethod
    def _fold_rejections(conn: sqlite3.Connection) -> None:
        """Past ``MAX_REJECTION_PEERS`` peers, fold all but those with the most rejections into
        ``OTHER_PEERS``'s row (in the caller's transaction)."""
        (peers,) = conn.execute(
            "SELECT count(DISTINCT peer_id) FROM rejections WHERE peer_id != ?", (OTHER_PEERS,)
        ).fetchone()
        if peers <= MAX_REJECTION_PEERS:
            return
        conn.execute("CREATE TEMP TABLE IF NOT EXISTS kept_peers (peer_id TEXT PRIMARY KEY)")
        conn.execute("DELETE FROM kept_peers")
        conn.execute(
            "INSERT INTO kept_peers SELECT peer_id FROM rejections WHERE peer_id != ? "
            "GROUP BY peer_id ORDER BY sum(count) DESC, peer_id LIMIT ?",
            (OTHER_PEERS, MAX_REJECTION_PEERS),
        )
        folded = "peer_id != ? AND peer_id NOT IN (SELECT peer_id FROM kept_peers)"
        conn.execute(
            "INSERT INTO rejections (peer_id, reason, count) "
            f"SELECT ?, reason, sum(count) FROM rejections WHERE {folded} GROUP BY reason "
            "ON CONFLICT (peer_id, reason) DO UPDATE SET count = count + excluded.count",
            (OTHER_PEERS, OTHER_PEERS),
        )
        conn.execute(f"DELETE FROM rejections WHERE {folded}", (OTHER_PEERS,))

    def rejection_counts(self, peer_id: str | None = None) -> dict[str, int]:
        """Rejections per reason, over all peers or only ``peer_id``'s."""
        with self._op("read rejection counts") as conn:
            if peer_id is None:
                rows = conn.execute("SELECT reason, sum(count) FROM rejections GROUP BY reason").fetchall()
            else:
                rows = conn.execute(
                    "SELECT reason, count FROM rejections WHERE peer_id = ?", (peer_id,)
                ).fetchall()
        return {reason: int(count) for reason, count in rows}

    def rejection_counts_by_peer(self) -> dict[str, int]:
        """Total rejections per peer, over all reasons."""
        with self._op("read rejection counts") as conn:
            rows = conn.execute("SELECT peer_id, sum(count) FROM rejections GROUP BY peer_id").fetchall()
        return {peer: int(count) for peer, count in rows}

    def rejections_by_peer_and_reason(
        self, limit: int, include: Sequence[str] = ()
    ) -> dict[str, dict[str, int]]:
        """Rejections per reason of the ``limit`` peers with the most rejections, and of every peer
        in ``include`` (a bounded read: free identities can fill the table, not the page that shows
        it, nor push the record of a peer the page shows out of it)."""
        with self._op("read rejection counts") as conn:
            rows = conn.execute(
                "SELECT r.peer_id, r.reason, r.count FROM rejections r JOIN ("
                "  SELECT peer_id FROM rejections GROUP BY peer_id ORDER BY sum(count) DESC LIMIT ?"
                ") top ON r.peer_id = top.peer_id",
                (int(limit),),
            ).fetchall()
            named = list(dict.fromkeys(include))
            for start in range(0, len(named), 500):
                chunk = named[start : start + 500]
                marks = ",".join("?" * len(chunk))
                query = f"SELECT peer_id, reason, count FROM rejections WHERE peer_id IN ({marks})"
                rows += conn.execute(query, chunk).fetchall()
        out: dict[str, dict[str, int]] = {}
        for peer, reason, count in rows:
            out.setdefault(peer, {})[reason] = int(count)
        return out

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection (idempotent). Committed data is already durable."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
