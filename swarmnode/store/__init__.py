"""Durable state of one node: the SQLite ledger, training checkpoints, crash-safe file writes.

Owns what is on disk and how it survives a kill at any instant. It must not decide when to
write (the trainer does) nor interpret what it stores beyond checking it is intact.

Crash invariant (ledger first, checkpoint second). For a round r the trainer

1. commits ``ledger.record_round(record_r)`` (one durable transaction), and only then
2. writes ``checkpoints.save(state_r)`` when r is a checkpoint round.

Hence after a crash at any instant, with c the round of the newest checkpoint that verifies
(0 when there is none) and N the checkpoint interval::

    c <= ledger.last_round() <= c + N          (ledger.last_round() None counts as 0)

The ledger never lacks a round the model already contains. Restart is then always the
same: load the checkpoint (``load_latest``), call ``ledger.truncate_after(c)`` (those rounds'
results died with the process), and continue with round c + 1. Because the checkpoint
holds the RNG state, redoing those rounds reproduces them, and ``record_round`` replaces a
round's row, so redoing is idempotent even without the truncate.
"""

from __future__ import annotations

from swarmnode.store.atomic import atomic_write_bytes, atomic_write_text, fsync_dir, fsync_file
from swarmnode.store.checkpoint import (
    CheckpointState,
    CheckpointStore,
    capture_rng_state,
    restore_rng_state,
)
from swarmnode.store.ledger import Ledger, LedgerError, RoundRecord

__all__ = [
    "CheckpointState",
    "CheckpointStore",
    "Ledger",
    "LedgerError",
    "RoundRecord",
    "atomic_write_bytes",
    "atomic_write_text",
    "capture_rng_state",
    "fsync_dir",
    "fsync_file",
    "restore_rng_state",
]
