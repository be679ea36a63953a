"""Builders for admission tests: signed envelopes at a fixed clock."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from swarmnode.admit import AdmissionConfig, AdmissionPipeline
from swarmnode.identity import NodeIdentity
from swarmnode.tools import vectors
from swarmnode.wire.envelope import encode_envelope, seal, to_ms
from swarmnode.wire.messages import Heartbeat, Message, RolloutBatch, RolloutGroup

T0 = vectors.NOW
FAMILIES = frozenset(vectors.ALLOWED_TASKS)
TASKS = [vectors.vector_task(i) for i in range(6)]


def make_group(index: int = 1, answers: tuple[str, ...] = ("84", "83"), **changes: Any) -> RolloutGroup:
    return replace(vectors.vector_group(TASKS[index], list(answers)), **changes)


def envelope(message: Message, who: NodeIdentity, at: float = T0) -> bytes:
    return encode_envelope(seal(who, message, to_ms(at)))


def batch(*groups: RolloutGroup) -> RolloutBatch:
    return RolloutBatch(groups=groups or (make_group(),))


def heartbeat(round: int = 1) -> Heartbeat:
    return Heartbeat(round=round, model_id="tiny", policy_version=0)


def identity(n: int) -> NodeIdentity:
    return NodeIdentity.from_seed(n.to_bytes(32, "big"))


@pytest.fixture
def config() -> AdmissionConfig:
    return AdmissionConfig(allowed_tasks=FAMILIES)


@pytest.fixture
def pipeline(config: AdmissionConfig) -> AdmissionPipeline:
    return AdmissionPipeline(config, now=T0)
