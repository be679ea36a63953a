"""What admission returns: ``Accepted`` or ``Rejected``, never an exception.

Owns: the verdict types. Must not: hold anything mutable (verdicts are logged,
queued and compared in tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

from swarmnode.admit.reasons import RejectReason
from swarmnode.tasks import Task
from swarmnode.wire.envelope import Envelope
from swarmnode.wire.messages import Message, RolloutGroup


@dataclass(frozen=True, slots=True)
class TrainedText:
    """A received completion as this node will train it: the token ids, and the text they decode
    to (what admission scores)."""

    text: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class AdmittedGroup:
    """A rollout group that passed every check, with rewards from *our* verifier."""

    group: RolloutGroup
    task: Task  # regenerated locally from group.task
    rewards: tuple[float, ...]  # one per completion, from the verification boundary
    sender: str  # peer id of the signer
    #: The texts that were scored: each completion as this node will train it (the pipeline's
    #: ``render``), or as received where no renderer was given. ``rewards[i]`` is their score.
    texts: tuple[str, ...] = ()
    #: The ids this node trains for each completion (the renderer's), or () where none was given.
    token_ids: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True, slots=True)
class Accepted:
    envelope: Envelope
    sender: str  # authenticated peer id
    message: Message
    groups: tuple[AdmittedGroup, ...] = ()  # rollout batches only
    accepted: Literal[True] = True

    @property
    def envelope_id(self) -> bytes:
        return self.envelope.envelope_id()


@dataclass(frozen=True, slots=True)
class Rejected:
    reason: RejectReason
    detail: str
    sender: str | None = None  # authenticated signer, when the signature was checked and valid
    charged: str | None = None  # whose score this rejection lowered, if anyone's
    accepted: Literal[False] = False


Verdict: TypeAlias = Accepted | Rejected
