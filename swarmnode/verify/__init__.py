"""The verification boundary: every completion a node scores is scored here, in sandboxed processes.

Owns: the pool of verifier worker processes (start, supervise, replace), their
limits (CPU per completion and per batch, address space, no file writes, no
inherited descriptors, clean environment, no network where the node is root),
and turning a worker's death, timeout or refusal into a value. Must not: trust
a worker's answer beyond its shape, unpickle anything a worker sends, or let a
verifier's exception reach the caller.

    pool = VerifierPool(VerifierLimits(), workers=2)
    pool.start()
    outcome = pool.score([(task, ["84", "<answer>85</answer>"])])   # Scored | VerifierFailure
    pool.close()

``score_in_process`` is the same contract without the processes, for tests,
the simulator and tools over a node's own rollouts.
"""

from swarmnode.verify.limits import VerifierLimits
from swarmnode.verify.outcome import (
    GroupScorer,
    Scored,
    VerifierFailure,
    VerifierReason,
    score_in_process,
)
from swarmnode.verify.pool import VerifierPool

__all__ = [
    "GroupScorer",
    "Scored",
    "VerifierFailure",
    "VerifierLimits",
    "VerifierPool",
    "VerifierReason",
    "score_in_process",
]
