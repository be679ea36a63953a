"""``swarmnode`` with fault-injection hooks, for SIGKILL tests that must land inside a window.

Run as ``python -m swarmnode.testing.hooked_node run --home DIR`` (the same arguments as
``swarmnode``). Nothing in ``swarmnode`` changes: this module wraps a few functions before the
CLI starts, and with no ``SWARMNODE_FAULT_DIR`` set it behaves exactly like ``swarmnode``.

``SWARMNODE_FAULT_DIR=DIR``: on entering each phase below, create ``DIR/<phase>.<n>`` (n counts
from 1 per process), so the test knows the process is inside that window now.
``SWARMNODE_FAULT_PAUSE=phase=seconds,...``: sleep that long inside the phase, after its
marker, to hold the window open for a kill at a random instant in it.

Phases:

``generate``        ``Trainer.generate_groups`` starts (the round's rollouts, before publishing).
``train``           ``Trainer.train_round`` starts (the update; ledger commit and checkpoint follow).
``ckpt_partial``    a checkpoint's temporary directory holds the model file only (optimizer next).
``ckpt_unrenamed``  every checkpoint file and the manifest are written and synced, not yet renamed.
``ckpt_unpruned``   the new checkpoint is under its final name, the oldest not yet pruned.
``receive``         admission of a group pulled from a peer begins (``GossipDriver._admit``).
``receive_chunk``   a weight-broadcast chunk fetch begins (``broadcast.driver.BroadcastNode._fetch``;
                    worker mode). Marker only: the fetch runs on the event loop, so no pause.

``SWARMNODE_ADMIT_LOG=PATH``: append one JSON line per admission verdict (time, delivering
peer, accepted or the reason, and per admitted group its signer, our rewards and the claimed
ones), so a test can count what an attacker got through and the honest throughput.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

_DIR = os.environ.get("SWARMNODE_FAULT_DIR")
_PAUSES = {
    name: float(seconds)
    for name, seconds in (
        item.split("=", 1) for item in os.environ.get("SWARMNODE_FAULT_PAUSE", "").split(",") if item
    )
}
_SEEN: Counter[str] = Counter()


def enter(phase: str) -> None:
    """Mark that this process entered ``phase``; pause in it if asked to."""
    if _DIR is None:
        return
    _SEEN[phase] += 1
    marker = Path(_DIR) / f"{phase}.{_SEEN[phase]}"
    marker.write_text(f"{os.getpid()} {time.time()}\n")
    pause = _PAUSES.get(phase, 0.0)
    if pause > 0:
        time.sleep(pause)  # in a worker thread (torch work) or a sync step: blocks only that


def _wrap(owner: Any, attribute: str, phase: str, when: Callable[..., bool] = lambda *a, **k: True) -> None:
    original = getattr(owner, attribute)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if when(*args, **kwargs):
            enter(phase)
        return original(*args, **kwargs)

    setattr(owner, attribute, wrapped)


def log_admissions(path: Path) -> None:
    """Wrap ``AdmissionPipeline.admit`` to append each verdict to ``path`` (JSON lines)."""
    import json

    from swarmnode.admit import Accepted, AdmissionPipeline

    original = AdmissionPipeline.admit
    out = path.open("a", buffering=1)

    def admit(self: Any, data: bytes, now: float, **kwargs: Any) -> Any:
        verdict = original(self, data, now, **kwargs)
        record: dict[str, Any] = {"t": time.time(), "via": kwargs.get("via")}
        if isinstance(verdict, Accepted):
            record["verdict"] = "accepted"
            record["groups"] = [
                {
                    "sender": g.sender,
                    "rewards": list(g.rewards),
                    "claimed": [c.claimed_reward_informational for c in g.group.completions],
                }
                for g in verdict.groups
            ]
        else:
            record["verdict"] = verdict.reason.value
            record["sender"] = verdict.sender
        out.write(json.dumps(record) + "\n")
        return verdict

    AdmissionPipeline.admit = admit  # type: ignore[method-assign]


def install() -> None:
    from swarmnode.gossip import driver as exchange
    from swarmnode.store import checkpoint
    from swarmnode.train import trainer

    _wrap(trainer.Trainer, "generate_groups", "generate")
    _wrap(trainer.Trainer, "train_round", "train")
    # save(): model file, then _torch_save(optimizer), _torch_save(trainer state), manifest,
    # fsync_dir(tmp), rename, fsync_dir(parent), _prune().
    _wrap(checkpoint, "_torch_save", "ckpt_partial", lambda obj, path: path.name == checkpoint.OPTIMIZER_FILE)
    _wrap(checkpoint, "fsync_dir", "ckpt_unrenamed", lambda path: path.name.startswith(".tmp-"))
    _wrap(checkpoint.CheckpointStore, "_prune", "ckpt_unpruned")
    _wrap(exchange.GossipDriver, "_admit", "receive")
    try:
        from swarmnode.broadcast import driver as broadcast
    except ImportError:  # a checkout without the weight broadcast
        return
    original_fetch = broadcast.BroadcastNode._fetch

    def fetch(self: Any, action: Any) -> Any:
        if _DIR is not None:
            _SEEN["receive_chunk"] += 1
            marker = Path(_DIR) / f"receive_chunk.{_SEEN['receive_chunk']}"
            marker.write_text(f"{os.getpid()} {time.time()}\n")
        return original_fetch(self, action)

    broadcast.BroadcastNode._fetch = fetch  # type: ignore[method-assign]


def main() -> int:
    if _DIR is not None:
        Path(_DIR).mkdir(parents=True, exist_ok=True)
        install()
    if os.environ.get("SWARMNODE_ADMIT_LOG"):
        log_admissions(Path(os.environ["SWARMNODE_ADMIT_LOG"]))
    from swarmnode.cli import main as cli_main

    return cli_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
