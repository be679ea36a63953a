"""The training loop: rounds of sample -> generate -> score -> advantages -> update -> checkpoint.

Owns: turning groups into tensors, one round's update, checkpoint/ledger
bookkeeping and exact resume. Must not do networking: external groups arrive
as already-admitted ``ScoredGroup`` values from the caller.
"""

from swarmnode.train.batch import ScoredGroup, completion_logprobs
from swarmnode.train.trainer import RoundMetrics, Trainer

__all__ = ["RoundMetrics", "ScoredGroup", "Trainer", "completion_logprobs"]
