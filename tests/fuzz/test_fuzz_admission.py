"""The admission pipeline, fed hostile input, returns a verdict and never raises.

Hostile input here: random bytes, mutations of the committed vectors, valid
signatures over hostile payloads (random, protobuf-shaped, wrong kind), and
structurally valid rollout groups with hostile field values, oversized fields
and real or forged prompts. The real task regenerator and verifier are used.
"""

from __future__ import annotations

import json
from datetime import timedelta

from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from swarmnode.admit import STEPS, Accepted, AdmissionPipeline, Rejected, RejectReason, Verdict
from swarmnode.identity import NodeIdentity
from swarmnode.tasks import TaskId, regenerate
from swarmnode.tools.protocol_cli import pipeline_for_context
from swarmnode.tools.vectors import ALLOWED_TASKS, MANIFEST, MODEL_ID, TASK_SEED
from swarmnode.wire import limits
from swarmnode.wire import swarm_pb2 as pb
from swarmnode.wire.envelope import Envelope, decode_envelope, encode_envelope, seal_payload
from swarmnode.wire.kinds import MAX_PAYLOAD_BYTES, Kind
from swarmnode.wire.messages import RolloutBatch, kind_of

from .strategies import DOUBLES, EDGE_INTS, VECTOR_BYTES, VECTORS, mutated_vector, proto_message

CONTEXT = json.loads((VECTORS / MANIFEST).read_text(encoding="utf-8"))["context"]
NOW = float(CONTEXT["now"])
SENT_AT_MS = int(NOW * 1000) - 1000
SIGNER = NodeIdentity.from_seed(b"\x42" * 32)
VALID_IDS = {e.envelope_id() for e in map(decode_envelope, VECTOR_BYTES.values()) if isinstance(e, Envelope)}
AFTER_SIGNATURE = {
    r for step in ("payload", "replay", "freshness", "rederive", "rescore") for r in STEPS[step]
}
AFTER_SIGNATURE.add(RejectReason.TOO_LARGE)  # a payload over its kind's cap

regenerate(
    next(
        iter(
            [
                __import__("swarmnode.tasks", fromlist=["TaskId"]).TaskId(
                    *ALLOWED_TASKS[0][:2], 0, 0, "compact"
                )
            ]
        )
    )
)


def bounded(examples: int) -> settings:
    """Bounded examples (default suite) and bounded time: one verdict over 2 s fails the property."""
    return settings(
        max_examples=examples,
        deadline=timedelta(seconds=2),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )


def receiver() -> AdmissionPipeline:
    return pipeline_for_context(CONTEXT)


def check_accepted_invariants(verdict: Verdict) -> None:
    if not isinstance(verdict, Accepted):
        return
    assert verdict.envelope.verify()
    assert kind_of(verdict.message) is verdict.envelope.kind
    if isinstance(verdict.message, RolloutBatch):
        assert len(verdict.groups) == len(verdict.message.groups)
        for admitted in verdict.groups:
            assert admitted.task.prompt == admitted.group.prompt == regenerate(admitted.group.task).prompt
            assert len(admitted.rewards) == len(admitted.group.completions)
            assert all(0.0 <= r <= 1.0 for r in admitted.rewards)


@bounded(300)
@given(st.binary(max_size=4096))
def test_random_bytes_get_a_rejection(data: bytes) -> None:
    verdict = receiver().admit(data, NOW, via="fuzzer")
    assert isinstance(verdict, Rejected)


@bounded(400)
@given(mutated_vector())
def test_mutated_vectors_never_raise_and_are_accepted_only_if_the_signed_content_is_unchanged(
    case: tuple[str, bytes],
) -> None:
    _, data = case
    verdict = receiver().admit(data, NOW, via="fuzzer")
    assert isinstance(verdict, Accepted | Rejected)
    event("accepted" if isinstance(verdict, Accepted) else verdict.reason.value)
    if isinstance(verdict, Accepted):
        assert verdict.envelope_id in VALID_IDS, "a mutation produced new content with a valid signature"
        check_accepted_invariants(verdict)


@bounded(300)
@given(st.sampled_from(list(Kind)), st.one_of(proto_message(), st.binary(max_size=1024)))
def test_valid_signatures_over_hostile_payloads_get_a_verdict_after_the_signature_step(
    kind: Kind, payload: bytes
) -> None:
    data = encode_envelope(seal_payload(SIGNER, kind, payload, SENT_AT_MS))
    verdict = receiver().admit(data, NOW, via="fuzzer")
    event("accepted" if isinstance(verdict, Accepted) else verdict.reason.value)
    if isinstance(verdict, Rejected):
        assert verdict.reason in AFTER_SIGNATURE, verdict
        assert verdict.reason is RejectReason.TOO_LARGE or verdict.sender == SIGNER.peer_id
    check_accepted_invariants(verdict)


VALID_PAYLOADS = sorted(
    {e.payload for e in map(decode_envelope, VECTOR_BYTES.values()) if isinstance(e, Envelope)}
)


@bounded(150)
@given(st.sampled_from(VALID_PAYLOADS), st.sampled_from(list(Kind)))
def test_valid_payloads_signed_as_the_wrong_kind_never_raise(payload: bytes, kind: Kind) -> None:
    assume(len(payload) <= MAX_PAYLOAD_BYTES[kind])
    verdict = receiver().admit(encode_envelope(seal_payload(SIGNER, kind, payload, SENT_AT_MS)), NOW)
    assert isinstance(verdict, Accepted | Rejected)
    event("accepted" if isinstance(verdict, Accepted) else verdict.reason.value)
    check_accepted_invariants(verdict)


TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=40)


@st.composite
def sized_text(draw: st.DrawFn, limit: int) -> str:
    """Short text, or text right around a byte limit (ASCII or multi-byte)."""
    if draw(st.booleans()):
        return draw(TEXT)
    char = draw(st.sampled_from(["9", "é", "😀"]))
    size = len(char.encode())
    n = draw(st.sampled_from([limit // size - 1, limit // size, limit // size + 1]))
    return char * max(n, 0)


@st.composite
def hostile_group(draw: st.DrawFn) -> pb.RolloutGroup:
    """A rollout group where each field is hostile with some probability, so every step gets reached."""

    def hostile() -> bool:
        return draw(st.integers(0, 7)) == 0

    family = draw(st.sampled_from(ALLOWED_TASKS))
    if hostile():
        family = draw(
            st.sampled_from(
                [
                    ("basic_arithmetic", "{}", "question"),
                    (draw(TEXT), draw(TEXT), draw(st.sampled_from(["x", ""]))),
                ]
            )
        )
    seed = draw(EDGE_INTS) if hostile() else TASK_SEED
    index = draw(EDGE_INTS) if hostile() else draw(st.integers(0, 200))
    prompt = "1+1="
    if family in ALLOWED_TASKS and index <= limits.MAX_TASK_INDEX:
        prompt = regenerate(TaskId(family[0], family[1], seed, index, family[2])).prompt
    if hostile():
        prompt = draw(st.one_of(sized_text(limits.MAX_PROMPT_BYTES), st.just(prompt + " ")))
    completions = [
        pb.Completion(
            text=draw(sized_text(limits.MAX_COMPLETION_BYTES)) if hostile() else draw(TEXT),
            token_count=draw(st.sampled_from([8192, 8193, 2**32 - 1]))
            if hostile()
            else draw(st.integers(0, 20)),
            mean_logprob=draw(DOUBLES) if hostile() else draw(st.floats(-50, 0)),
            claimed_reward_informational=draw(DOUBLES) if hostile() else 1.0,
        )
        for _ in range(draw(st.sampled_from([0, 64, 65])) if hostile() else draw(st.integers(1, 8)))
    ]
    return pb.RolloutGroup(
        task=pb.TaskId(dataset=family[0], config=family[1], seed=seed, index=index, prompt_format=family[2]),
        prompt=prompt,
        completions=completions,
        model_id=draw(sized_text(limits.MAX_MODEL_ID_BYTES)) if hostile() else MODEL_ID,
        policy_version=draw(EDGE_INTS) if hostile() else draw(st.integers(2, 10)),
        round=draw(EDGE_INTS),
        batch_reward_mean=draw(DOUBLES) if hostile() else draw(st.floats(0, 1)),
    )


@bounded(200)
@given(st.lists(hostile_group(), min_size=0, max_size=3), st.integers(-400_000, 40_000))
def test_hostile_rollout_groups_with_valid_signatures_get_a_verdict(
    groups: list[pb.RolloutGroup], skew_ms: int
) -> None:
    payload = pb.RolloutBatch(groups=groups).SerializeToString()
    data = encode_envelope(
        seal_payload(
            SIGNER, Kind.ROLLOUT_BATCH, payload[: MAX_PAYLOAD_BYTES[Kind.ROLLOUT_BATCH]], SENT_AT_MS + skew_ms
        )
    )
    pipeline = receiver()
    verdict = pipeline.admit(data, NOW, via="fuzzer")
    assert isinstance(verdict, Accepted | Rejected)
    event("accepted" if verdict.accepted else verdict.reason.value)  # type: ignore[union-attr]
    check_accepted_invariants(verdict)
    assert sum(pipeline.counts().values()) == 1, "every verdict is counted exactly once"
