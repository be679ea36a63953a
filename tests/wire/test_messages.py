"""Payload codecs: every message round-trips, every limit is enforced at its boundary, nothing raises."""

from __future__ import annotations

import hashlib
import math
from dataclasses import FrozenInstanceError, replace

import pytest

from swarmnode.tasks import TaskId
from swarmnode.tools.vectors import KEYS, vector_group, vector_task
from swarmnode.wire import limits
from swarmnode.wire import swarm_pb2 as pb
from swarmnode.wire.kinds import MAX_PAYLOAD_BYTES, Kind, Role
from swarmnode.wire.messages import (
    Activate,
    Announce,
    Capabilities,
    ChunkData,
    ChunkRequest,
    Completion,
    Deactivate,
    Heartbeat,
    Message,
    PeerRecord,
    RolloutBatch,
    RolloutGroup,
    TensorEntry,
    WeightManifestBody,
    decode_manifest_body,
    decode_payload,
    encode_manifest_body,
    encode_payload,
    kind_of,
)
from swarmnode.wire.reasons import WireError, WireReason

TASK = vector_task(1)  # 58+26=


def group(**changes: object) -> RolloutGroup:
    return replace(vector_group(TASK, ["84", "83"]), **changes)  # type: ignore[arg-type]


def manifest_body(**changes: object) -> WeightManifestBody:
    body = WeightManifestBody(
        model_id="m",
        version=3,
        tensors=(TensorEntry("w", "BF16", (4, 8), 0, 64), TensorEntry("b", "F32", (8,), 64, 32)),
        chunk_size=1024,
        chunk_hashes=(hashlib.sha256(b"x").digest(),),
        total_bytes=96,
    )
    return replace(body, **changes)  # type: ignore[arg-type]


EXAMPLES: list[Message] = [
    PeerRecord(
        peer_id=KEYS["sender"].peer_id,
        libp2p_peer_id="12D3KooW",
        addresses=("10.0.0.1:4000", "[::1]:4001"),
        roles=(Role.LEARNER,),
        model_family="llama",
        model_id="tiny",
        capabilities=Capabilities(3.5, 0.25, "cpu:2", "swarmnode/0.1.0"),
    ),
    RolloutBatch(groups=(group(), group(round=7, batch_reward_mean=1.0))),
    Announce(round=3, rollout_digests=(bytes(32), b"\x01" * 32), manifest_digests=(b"\x02" * 32,)),
    ChunkRequest(b"\x03" * 32, 2, 1024, 4096),
    ChunkData(b"\x03" * 32, 2, 1024, b"weights"),
    Activate(KEYS["worker"].peer_id, "tiny", 9, 12.5, 60),
    Activate(KEYS["worker"].peer_id, "tiny", 9, 12.5, 60, sampling_seed=bytes(range(32))),
    Deactivate(KEYS["worker"].peer_id, "done"),
    Heartbeat(round=1, model_id="tiny", policy_version=2, rollout_rate=0.0),
]


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips_through_its_payload_bytes(message: Message) -> None:
    data = encode_payload(message)
    assert decode_payload(kind_of(message), data) == message


def test_manifest_body_round_trips_and_reports_chunk_lengths() -> None:
    body = manifest_body(
        total_bytes=2500, chunk_hashes=(bytes(32),) * 3, tensors=(TensorEntry("w", "U8", (2500,), 0, 2500),)
    )
    assert decode_manifest_body(encode_manifest_body(body)) == body
    assert [body.chunk_length(i) for i in range(3)] == [1024, 1024, 452]


def test_encode_refuses_what_a_receiver_would_refuse() -> None:
    with pytest.raises(ValueError, match="refusing to encode an invalid rollout_batch"):
        encode_payload(RolloutBatch(groups=()))
    with pytest.raises(ValueError, match="heartbeat"):
        encode_payload(Heartbeat(round=1, model_id="", policy_version=0))


def decode_group(g: pb.RolloutGroup) -> RolloutBatch | WireError:
    result = decode_payload(Kind.ROLLOUT_BATCH, pb.RolloutBatch(groups=[g]).SerializeToString())
    assert isinstance(result, RolloutBatch | WireError)
    return result


def raw_group() -> pb.RolloutGroup:
    msg = pb.RolloutBatch()
    msg.ParseFromString(encode_payload(RolloutBatch(groups=(group(),))))
    return msg.groups[0]


def test_64_completions_pass_and_65_exceed_the_limit() -> None:
    g = raw_group()
    del g.completions[:]
    g.completions.extend(pb.Completion(text="1", token_count=1, mean_logprob=-1.0) for _ in range(64))
    assert isinstance(decode_group(g), RolloutBatch)
    g.completions.append(pb.Completion(text="1", token_count=1, mean_logprob=-1.0))
    result = decode_group(g)
    assert isinstance(result, WireError) and result.reason is WireReason.LIMIT_EXCEEDED


def test_64_groups_pass_and_65_exceed_the_limit() -> None:
    g = raw_group()
    ok = decode_payload(Kind.ROLLOUT_BATCH, pb.RolloutBatch(groups=[g] * 64).SerializeToString())
    assert isinstance(ok, RolloutBatch)
    over = decode_payload(Kind.ROLLOUT_BATCH, pb.RolloutBatch(groups=[g] * 65).SerializeToString())
    assert isinstance(over, WireError) and over.reason is WireReason.LIMIT_EXCEEDED


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("9" * limits.MAX_COMPLETION_BYTES, True),
        ("9" * (limits.MAX_COMPLETION_BYTES + 1), False),
        ("é" * (limits.MAX_COMPLETION_BYTES // 2), True),  # 2 bytes each: exactly at the limit
        ("é" * (limits.MAX_COMPLETION_BYTES // 2) + "x", False),  # 4,097 chars, 8,193 bytes
        ("😀" * (limits.MAX_COMPLETION_BYTES // 4 + 1), False),  # 2,049 chars, 8,196 bytes
    ],
)
def test_text_limits_count_utf8_bytes_not_characters(text: str, ok: bool) -> None:
    g = raw_group()
    g.completions[0].text = text
    result = decode_group(g)
    assert isinstance(result, RolloutBatch) == ok
    if not ok:
        assert isinstance(result, WireError) and result.reason is WireReason.LIMIT_EXCEEDED


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("token_count", limits.MAX_COMPLETION_TOKENS + 1, WireReason.LIMIT_EXCEEDED),
        ("mean_logprob", 1e-9, WireReason.INVALID_PAYLOAD),
        ("mean_logprob", math.nan, WireReason.INVALID_PAYLOAD),
        ("mean_logprob", -math.inf, WireReason.INVALID_PAYLOAD),
        ("claimed_reward_informational", math.inf, WireReason.INVALID_PAYLOAD),
        ("claimed_reward_informational", math.nan, WireReason.INVALID_PAYLOAD),
    ],
)
def test_completion_numbers_must_be_finite_and_in_range(field: str, value: float, reason: WireReason) -> None:
    g = raw_group()
    setattr(g.completions[0], field, value)
    result = decode_group(g)
    assert isinstance(result, WireError) and result.reason is reason


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda g: g.ClearField("task"), WireReason.INVALID_PAYLOAD),
        (lambda g: setattr(g, "prompt", ""), WireReason.INVALID_PAYLOAD),
        (lambda g: setattr(g, "prompt", "x" * (limits.MAX_PROMPT_BYTES + 1)), WireReason.LIMIT_EXCEEDED),
        (lambda g: setattr(g, "model_id", ""), WireReason.INVALID_PAYLOAD),
        (lambda g: setattr(g, "batch_reward_mean", -0.1), WireReason.INVALID_PAYLOAD),
        (lambda g: setattr(g.task, "dataset", ""), WireReason.INVALID_PAYLOAD),
        (lambda g: setattr(g.task, "dataset", "d" * 65), WireReason.LIMIT_EXCEEDED),
        (lambda g: setattr(g.task, "config", "{" * 1025), WireReason.LIMIT_EXCEEDED),
        (lambda g: setattr(g.task, "prompt_format", "verbose"), WireReason.INVALID_PAYLOAD),
        (lambda g: setattr(g.task, "index", limits.MAX_TASK_INDEX + 1), WireReason.LIMIT_EXCEEDED),
        (lambda g: g.ClearField("completions"), WireReason.INVALID_PAYLOAD),
    ],
)
def test_group_field_rules(mutate: object, reason: WireReason) -> None:
    g = raw_group()
    mutate(g)  # type: ignore[operator]
    result = decode_group(g)
    assert isinstance(result, WireError) and result.reason is reason, result


def test_decoded_task_id_is_the_tasks_module_type() -> None:
    result = decode_group(raw_group())
    assert isinstance(result, RolloutBatch)
    assert isinstance(result.groups[0].task, TaskId)
    assert result.groups[0].task == TASK.id


def test_content_digest_covers_task_and_completion_texts_only() -> None:
    base = group()
    assert base.content_digest() == replace(base, round=99, policy_version=1).content_digest()
    assert base.content_digest() != replace(base, completions=base.completions[:1]).content_digest()
    texts_shifted = replace(
        base, completions=(replace(base.completions[0], text="8"), replace(base.completions[1], text="483"))
    )
    assert base.content_digest() != texts_shifted.content_digest(), "length-prefixed: no ambiguity"


def test_unknown_roles_are_dropped_and_duplicates_collapsed() -> None:
    raw = pb.PeerRecord(peer_id="p", roles=[1, 99, 1, 0, 3]).SerializeToString()  # type: ignore[list-item]
    result = decode_payload(Kind.PEER_RECORD, raw)
    assert isinstance(result, PeerRecord) and result.roles == (Role.TRAINER, Role.WORKER)


def test_unknown_payload_fields_are_ignored() -> None:
    data = encode_payload(EXAMPLES[-1]) + b"\xa8\x06\x07"  # field 101, varint 7
    assert decode_payload(Kind.HEARTBEAT, data) == EXAMPLES[-1]


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"chunk_hashes": (bytes(32), bytes(32))}, "chunk hashes"),
        ({"chunk_hashes": (bytes(31),)}, "chunk_hashes"),
        ({"chunk_size": 512}, "chunk_size"),
        ({"tensors": (TensorEntry("w", "F32", (4, 8), 0, 64),)}, "nbytes"),
        ({"tensors": (TensorEntry("w", "F17", (4,), 0, 8),)}, "dtype"),
        ({"tensors": (TensorEntry("w", "U8", (97,), 0, 97),)}, "past total_bytes"),
        ({"tensors": (TensorEntry("w", "U8", (8,), 0, 8), TensorEntry("w", "U8", (8,), 8, 8))}, "unique"),
        ({"tensors": (TensorEntry("a", "U8", (8,), 0, 8), TensorEntry("b", "U8", (8,), 4, 8))}, "overlaps"),
        ({"tensors": ()}, "tensors"),
        ({"model_id": ""}, "model_id"),
    ],
)
def test_manifest_body_consistency_rules(changes: dict[str, object], fragment: str) -> None:
    raw = pb.WeightManifestBody()
    raw.ParseFromString(encode_manifest_body(manifest_body()))
    body = manifest_body(**changes)
    raw = pb.WeightManifestBody(
        model_id=body.model_id,
        version=body.version,
        tensors=[
            pb.TensorEntry(name=t.name, dtype=t.dtype, shape=t.shape, offset=t.offset, nbytes=t.nbytes)
            for t in body.tensors
        ],
        chunk_size=body.chunk_size,
        chunk_hashes=body.chunk_hashes,
        total_bytes=body.total_bytes,
    )
    result = decode_manifest_body(raw.SerializeToString())
    assert isinstance(result, WireError) and fragment in result.detail


@pytest.mark.parametrize(
    ("kind", "raw"),
    [
        (Kind.ANNOUNCE, pb.Announce(rollout_digests=[bytes(32)] * (limits.MAX_ROLLOUT_DIGESTS + 1))),
        (Kind.ANNOUNCE, pb.Announce(rollout_digests=[bytes(31)])),
        (Kind.CHUNK_REQUEST, pb.ChunkRequest(manifest_digest=bytes(32), length=0)),
        (Kind.CHUNK_REQUEST, pb.ChunkRequest(manifest_digest=bytes(32), length=limits.MAX_CHUNK_SLICE + 1)),
        (Kind.CHUNK_DATA, pb.ChunkData(manifest_digest=bytes(32), data=b"")),
        (Kind.CHUNK_DATA, pb.ChunkData(manifest_digest=bytes(32), chunk_index=limits.MAX_CHUNKS, data=b"x")),
        (Kind.ACTIVATE, pb.Activate(worker_peer_id="w", model_id="m", target_rate=0.0, lease_seconds=5)),
        (Kind.ACTIVATE, pb.Activate(worker_peer_id="w", model_id="m", target_rate=1.0, lease_seconds=0)),
        (Kind.ACTIVATE, pb.Activate(worker_peer_id="w", model_id="m", target_rate=math.nan, lease_seconds=5)),
        (
            Kind.ACTIVATE,
            pb.Activate(
                worker_peer_id="w", model_id="m", target_rate=1.0, lease_seconds=5, sampling_seed=bytes(31)
            ),
        ),
        (
            Kind.ACTIVATE,
            pb.Activate(
                worker_peer_id="w", model_id="m", target_rate=1.0, lease_seconds=5, sampling_seed=bytes(33)
            ),
        ),
        (Kind.DEACTIVATE, pb.Deactivate(worker_peer_id="", reason="x")),
        (Kind.HEARTBEAT, pb.Heartbeat(model_id="m", rollout_rate=-1.0)),
        (Kind.PEER_RECORD, pb.PeerRecord(peer_id="")),
        (Kind.PEER_RECORD, pb.PeerRecord(peer_id="p", addresses=["a:1"] * (limits.MAX_ADDRESSES + 1))),
        (Kind.PEER_RECORD, pb.PeerRecord(peer_id="p", capabilities=pb.Capabilities(price=-1.0))),
        (Kind.WEIGHT_MANIFEST, pb.WeightManifest(body=b"", publisher_key=bytes(32), signature=bytes(64))),
        (Kind.WEIGHT_MANIFEST, pb.WeightManifest(body=b"", publisher_key=bytes(31), signature=bytes(64))),
    ],
)
def test_each_kind_refuses_out_of_range_fields_as_a_value(kind: Kind, raw: object) -> None:
    result = decode_payload(kind, raw.SerializeToString())  # type: ignore[attr-defined]
    assert isinstance(result, WireError)
    assert result.reason in (WireReason.INVALID_PAYLOAD, WireReason.LIMIT_EXCEEDED, WireReason.TOO_LARGE)


@pytest.mark.parametrize("kind", list(Kind))
def test_a_payload_over_its_kinds_cap_is_too_large_without_parsing(kind: Kind) -> None:
    result = decode_payload(kind, b"\xff" * (MAX_PAYLOAD_BYTES[kind] + 1))  # would not parse either
    assert isinstance(result, WireError) and result.reason is WireReason.TOO_LARGE


def test_error_details_are_bounded_whatever_the_input() -> None:
    g = raw_group()
    g.task.prompt_format = "p" * 5000
    result = decode_group(g)
    assert isinstance(result, WireError) and len(result.detail) < 300


def test_completion_dataclass_keeps_claimed_reward_marked_informational() -> None:
    c = Completion(text="1", token_count=1, mean_logprob=-0.1, claimed_reward_informational=1.0)
    assert c.claimed_reward_informational == 1.0
    assert not hasattr(c, "reward")


@pytest.mark.parametrize(
    ("ids", "logprobs", "ok"),
    [
        ([5, 6], [-0.5, 0.0], True),
        ([5, 6], [-0.5], False),  # one log-prob short
        ([5], [-0.5, -0.1], False),  # ids and token_count disagree
        ([5, 6], [-0.5, 1e-9], False),  # a probability above 1
        ([5, 6], [-0.5, math.nan], False),
        ([5, 6], [-math.inf, -0.1], False),
    ],
)
def test_token_ids_and_logprobs_travel_together_finite_and_non_positive(
    ids: list[int], logprobs: list[float], ok: bool
) -> None:
    g = raw_group()
    g.completions[0].token_count = 2
    g.completions[0].token_ids.extend(ids)
    g.completions[0].token_logprobs.extend(logprobs)
    result = decode_group(g)
    if ok:
        assert isinstance(result, RolloutBatch)
        completion = result.groups[0].completions[0]
        assert completion.token_ids == (5, 6) and completion.token_logprobs == (-0.5, 0.0)
    else:
        assert isinstance(result, WireError) and result.reason is WireReason.INVALID_PAYLOAD, result


def test_a_decoded_completion_equals_the_one_encoded_and_stays_frozen() -> None:
    # The decoder builds completions through their slots (the hot path of admission): the result
    # must be the same immutable value the dataclass constructor makes.
    sent = Completion(
        text="42",
        token_count=2,
        mean_logprob=-0.25,
        claimed_reward_informational=1.0,
        token_ids=(7, 8),
        token_logprobs=(-0.5, -0.125),  # float32 on the wire: exact values
    )
    batch = decode_payload(
        Kind.ROLLOUT_BATCH, encode_payload(RolloutBatch(groups=(replace(group(), completions=(sent,)),)))
    )
    assert isinstance(batch, RolloutBatch)
    received = batch.groups[0].completions[0]
    assert received == sent and hash(received) == hash(sent)
    with pytest.raises(FrozenInstanceError):
        received.text = "0"  # type: ignore[misc]
