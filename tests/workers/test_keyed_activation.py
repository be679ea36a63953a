"""A worker takes its keyed-sampling seed only from its learner's newest Activate (red team of #20:
the data plane is plain TCP, so an old Activate of the learner's, replayed, set an old seed or none,
and the worker's next batches failed the learner's token checks)."""

from __future__ import annotations

import asyncio
import time

from swarmnode.identity import NodeIdentity
from swarmnode.ops.metrics import Metrics
from swarmnode.roles.worker import WorkerNode
from swarmnode.wire import Activate, seal, to_ms

LEARNER = NodeIdentity.from_seed(bytes([1]) * 32)
ME = NodeIdentity.from_seed(bytes([2]) * 32)
MALLORY = NodeIdentity.from_seed(bytes([3]) * 32)


def worker() -> WorkerNode:
    """The real handler with just the state it reads (no model, no network)."""
    w = WorkerNode.__new__(WorkerNode)
    w.learner_id, w.identity, w.metrics = LEARNER.peer_id, ME, Metrics()
    w.wake, w.sampling_seed, w.activate_sent_ms = asyncio.Event(), None, -1
    w.lease_until, w.target_rate, w.deactivated_reason = 0.0, 0.0, ""
    w._learner_at = lambda version: None  # type: ignore[method-assign]
    w._heartbeat = lambda: None  # type: ignore[method-assign,assignment,return-value]
    return w


def activate(w: WorkerNode, signer: NodeIdentity, seed: bytes, sent_at_ms: int) -> None:
    message = Activate(ME.peer_id, "tiny", 0, 1.0, 60, seed)
    asyncio.run(w._on_activate(signer.peer_id, seal(signer, message, sent_at_ms), message))


def test_only_the_learners_newest_activate_sets_the_seed() -> None:
    w, now = worker(), to_ms(time.time())
    activate(w, LEARNER, b"\x11" * 32, now)
    assert w.sampling_seed == b"\x11" * 32 and w.lease_until > time.time()
    activate(w, MALLORY, b"\x66" * 32, now + 1)  # a third party's: refused
    activate(w, LEARNER, b"\x22" * 32, 0)  # an old one of the learner's, replayed
    activate(w, LEARNER, b"", now - 3_600_000)  # an hour old, keyed sampling off
    activate(w, LEARNER, b"\x33" * 32, now)  # the same instant again: not newer
    assert w.sampling_seed == b"\x11" * 32
    assert w.metrics.value("control_refused") == 4
    activate(w, LEARNER, b"\x44" * 32, now + 5)  # the next activation
    assert w.sampling_seed == b"\x44" * 32
