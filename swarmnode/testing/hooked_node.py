"""``swarmnode`` with an admission log, for tests that count what an attacker got through.

Run as ``python -m swarmnode.testing.hooked_node run --home DIR`` (the same arguments as
``swarmnode``). The SIGKILL windows are the node's own fault points (``swarmnode.ops.faults``:
``SWARMNODE_FAULT_DIR`` and ``SWARMNODE_FAULT_PAUSE`` work with plain ``swarmnode`` too); this
module only adds, with ``SWARMNODE_ADMIT_LOG=PATH``, one JSON line per admission verdict (time,
delivering peer, accepted or the reason, and per admitted group its signer, our rewards and the
claimed ones), written by a wrapper of the public ``AdmissionPipeline.admit``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any


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


def main() -> int:
    if os.environ.get("SWARMNODE_ADMIT_LOG"):
        log_admissions(Path(os.environ["SWARMNODE_ADMIT_LOG"]))
    from swarmnode.cli import main as cli_main

    return cli_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
