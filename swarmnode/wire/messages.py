"""Typed, validated payload messages and their codecs.

Owns: the frozen dataclasses the rest of swarmnode uses (``RolloutGroup``,
``PeerRecord``, ...), ``decode_payload`` (bytes -> message or ``WireError``)
and ``encode_payload`` (message -> bytes). Must not: verify signatures, read a
clock, or trust any field's meaning (a decoded ``RolloutGroup`` is well-formed,
not true: admission re-derives and re-scores it).

Decoding order, per protocol/SPEC.md "Decoding": the caller has already capped
the payload's byte size (``kinds.MAX_PAYLOAD_BYTES``), so parsing is bounded;
after parsing, repeated-field counts are checked before any element is
converted, and each string's UTF-8 length before it is used.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, TypeAlias

from google.protobuf.message import DecodeError

from swarmnode.errors import TaskError
from swarmnode.tasks.ids import PROMPT_FORMATS, TaskId
from swarmnode.wire import limits
from swarmnode.wire import swarm_pb2 as pb
from swarmnode.wire.kinds import MAX_PAYLOAD_BYTES, Kind, Role
from swarmnode.wire.reasons import WireError, WireReason, clip


class _Invalid(Exception):
    """Internal: raised inside the decoders, turned into a ``WireError`` at the boundary."""

    def __init__(self, reason: WireReason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def _utf8_len(text: str) -> int:
    # A str of n chars is n..4n UTF-8 bytes; encode only when the bound is unclear.
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def _text(value: str, limit: int, name: str, *, required: bool = False) -> str:
    if len(value) > limit or _utf8_len(value) > limit:
        raise _Invalid(WireReason.LIMIT_EXCEEDED, f"{name} is over {limit} UTF-8 bytes")
    if required and not value:
        raise _Invalid(WireReason.INVALID_PAYLOAD, f"{name} is empty")
    return value


def _count(items: Sequence[Any], limit: int, name: str, *, minimum: int = 0) -> None:
    if len(items) > limit:
        raise _Invalid(WireReason.LIMIT_EXCEEDED, f"{name} has {len(items)} entries; the limit is {limit}")
    if len(items) < minimum:
        raise _Invalid(
            WireReason.INVALID_PAYLOAD, f"{name} has {len(items)} entries; at least {minimum} needed"
        )


def _digest(value: bytes, name: str) -> bytes:
    if len(value) != limits.DIGEST_BYTES:
        raise _Invalid(
            WireReason.INVALID_PAYLOAD, f"{name} is {len(value)} bytes; must be {limits.DIGEST_BYTES}"
        )
    return value


def _finite(value: float, name: str, *, low: float = -math.inf, high: float = math.inf) -> float:
    if not math.isfinite(value) or not low <= value <= high:
        raise _Invalid(
            WireReason.INVALID_PAYLOAD, f"{name}={clip(value)} must be finite and in [{low}, {high}]"
        )
    return value


def _int_range(value: int, name: str, low: int, high: int) -> int:
    if not low <= value <= high:
        raise _Invalid(WireReason.LIMIT_EXCEEDED, f"{name}={value} is outside [{low}, {high}]")
    return value


# --------------------------------------------------------------------------- peers


@dataclass(frozen=True, slots=True)
class Capabilities:
    rollout_rate: float = 0.0
    price: float = 0.0
    hardware: str = ""
    software_version: str = ""


@dataclass(frozen=True, slots=True)
class PeerRecord:
    peer_id: str
    libp2p_peer_id: str = ""
    addresses: tuple[str, ...] = ()
    roles: tuple[Role, ...] = ()
    model_family: str = ""
    model_id: str = ""
    capabilities: Capabilities = field(default_factory=Capabilities)


def _peer_record_from(msg: pb.PeerRecord) -> PeerRecord:
    _count(msg.addresses, limits.MAX_ADDRESSES, "addresses")
    _count(msg.roles, limits.MAX_ROLES, "roles")
    roles: list[Role] = []
    for value in msg.roles:
        # Unknown roles come from newer peers: skip them (SPEC.md "Compatibility").
        if value in Role._value2member_map_ and Role(value) not in roles:
            roles.append(Role(value))
    caps = msg.capabilities
    return PeerRecord(
        peer_id=_text(msg.peer_id, limits.MAX_PEER_ID_BYTES, "peer_id", required=True),
        libp2p_peer_id=_text(msg.libp2p_peer_id, limits.MAX_LIBP2P_ID_BYTES, "libp2p_peer_id"),
        addresses=tuple(_text(a, limits.MAX_ADDRESS_BYTES, "address", required=True) for a in msg.addresses),
        roles=tuple(roles),
        model_family=_text(msg.model_family, limits.MAX_MODEL_FAMILY_BYTES, "model_family"),
        model_id=_text(msg.model_id, limits.MAX_MODEL_ID_BYTES, "model_id"),
        capabilities=Capabilities(
            rollout_rate=_finite(caps.rollout_rate, "rollout_rate", low=0.0, high=limits.MAX_RATE),
            price=_finite(caps.price, "price", low=0.0),
            hardware=_text(caps.hardware, limits.MAX_HARDWARE_BYTES, "hardware"),
            software_version=_text(
                caps.software_version, limits.MAX_SOFTWARE_VERSION_BYTES, "software_version"
            ),
        ),
    )


def _peer_record_to(m: PeerRecord) -> pb.PeerRecord:
    c = m.capabilities
    return pb.PeerRecord(
        peer_id=m.peer_id,
        libp2p_peer_id=m.libp2p_peer_id,
        addresses=list(m.addresses),
        roles=[int(r) for r in m.roles],  # type: ignore[misc]
        model_family=m.model_family,
        model_id=m.model_id,
        capabilities=pb.Capabilities(
            rollout_rate=c.rollout_rate,
            price=c.price,
            hardware=c.hardware,
            software_version=c.software_version,
        ),
    )


# --------------------------------------------------------------------------- rollouts


@dataclass(frozen=True, slots=True)
class Completion:
    text: str
    token_count: int
    mean_logprob: float
    #: The sender's own reward for this completion. Informational only: admission
    #: never reads it (ALGORITHMS.md §8), rewards come from local re-scoring.
    claimed_reward_informational: float = 0.0
    #: Worker -> learner only: token ids and per-token log-probs (both empty in gossip).
    token_ids: tuple[int, ...] = ()
    token_logprobs: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class RolloutGroup:
    task: TaskId
    prompt: str
    completions: tuple[Completion, ...]
    model_id: str
    policy_version: int
    round: int
    batch_reward_mean: float
    #: Empty for a bare question prompt; for a chat prompt, ``system_prompt_id`` of the system
    #: turn the sender's prompts carried (SPEC.md 1.3): receivers admit only their own.
    system_prompt_sha256: bytes = b""

    def content_digest(self) -> bytes:
        """SHA-256 over the task's entry key (``TaskId.entry_key``) and the completion texts
        (length-prefixed).

        Two groups with the same digest train the same way, whatever else differs;
        admission uses it to refuse the same rollouts twice from one sender. The entry key,
        not the id: an id renamed to (seed + k, index - k) regenerates the same task (red team
        rt61 F4).
        """
        h = hashlib.sha256()
        for part in (self.task.entry_key(), *(c.text for c in self.completions)):
            data = part.encode("utf-8")
            h.update(len(data).to_bytes(4, "big"))
            h.update(data)
        return h.digest()


#: Domain of ``system_prompt_id`` (SPEC.md 1.3).
SYSTEM_PROMPT_DOMAIN = b"swarmnode/system-prompt/v1\x00"


def system_prompt_id(system_prompt: str) -> bytes:
    """What a RolloutGroup of chat prompts names its system turn by (SPEC.md 1.3):
    ``SHA-256("swarmnode/system-prompt/v1" || 0x00 || UTF-8(system_prompt))``; an empty system
    prompt (no system turn) has an id too, distinct from a bare prompt's empty field."""
    return hashlib.sha256(SYSTEM_PROMPT_DOMAIN + system_prompt.encode("utf-8")).digest()


@dataclass(frozen=True, slots=True)
class RolloutBatch:
    groups: tuple[RolloutGroup, ...]


def _task_from(msg: pb.TaskId) -> TaskId:
    dataset = _text(msg.dataset, limits.MAX_TASK_DATASET_BYTES, "task.dataset", required=True)
    config = _text(msg.config, limits.MAX_TASK_CONFIG_BYTES, "task.config")
    if msg.prompt_format not in PROMPT_FORMATS:
        raise _Invalid(WireReason.INVALID_PAYLOAD, f"task.prompt_format {clip(msg.prompt_format)} is unknown")
    _int_range(msg.index, "task.index", 0, limits.MAX_TASK_INDEX)
    try:
        return TaskId(dataset, config, msg.seed, msg.index, msg.prompt_format)
    except TaskError as exc:
        raise _Invalid(WireReason.INVALID_PAYLOAD, f"task id: {exc}") from exc


# Admission decodes every completion a peer sends (64 x 64 per batch at most), so this path is
# written out by hand: the checks are _int_range, _finite and _text's, inlined (the helper calls
# cost more than the checks), and a Completion is built through its slot descriptors, skipping
# the frozen dataclass's __setattr__ guard, which is what makes frozen construction slow. The
# result is the same frozen, equal object; tests/wire pins the two paths to the same verdicts.
_new_completion = object.__new__
_COMPLETION_FIELDS = (
    "text",
    "token_count",
    "mean_logprob",
    "claimed_reward_informational",
    "token_ids",
    "token_logprobs",
)
if tuple(f.name for f in fields(Completion)) != _COMPLETION_FIELDS:  # a field added without its setter
    raise RuntimeError(f"_completion_from sets {_COMPLETION_FIELDS}; Completion has {fields(Completion)}")
_COMPLETION_SLOTS = tuple(Completion.__dict__[name].__set__ for name in _COMPLETION_FIELDS)
_MAX_COMPLETION_TOKENS = limits.MAX_COMPLETION_TOKENS
_MAX_COMPLETION_BYTES = limits.MAX_COMPLETION_BYTES
_INF = math.inf


def _completion_from(c: pb.Completion) -> Completion:
    token_count = c.token_count
    if not 0 <= token_count <= _MAX_COMPLETION_TOKENS:
        raise _Invalid(
            WireReason.LIMIT_EXCEEDED, f"token_count={token_count} is outside [0, {_MAX_COMPLETION_TOKENS}]"
        )
    token_ids: tuple[int, ...] = ()
    token_logprobs: tuple[float, ...] = ()
    if c.token_ids or c.token_logprobs:
        if len(c.token_ids) != token_count or len(c.token_logprobs) != token_count:
            raise _Invalid(
                WireReason.INVALID_PAYLOAD,
                f"token_ids ({len(c.token_ids)}) and token_logprobs ({len(c.token_logprobs)}) "
                f"must both have token_count={token_count} entries",
            )
        token_ids = tuple(c.token_ids)
        token_logprobs = tuple(c.token_logprobs)
        # -inf < v <= 0 is false for NaN, -inf and anything positive.
        if not all(-_INF < v <= 0.0 for v in token_logprobs):
            raise _Invalid(WireReason.INVALID_PAYLOAD, "token_logprobs must be finite and <= 0")
    text = c.text
    if len(text) > _MAX_COMPLETION_BYTES or (
        not text.isascii() and len(text.encode("utf-8")) > _MAX_COMPLETION_BYTES
    ):
        raise _Invalid(WireReason.LIMIT_EXCEEDED, f"text is over {_MAX_COMPLETION_BYTES} UTF-8 bytes")
    mean_logprob = c.mean_logprob
    if not -_INF < mean_logprob <= 0.0:
        _finite(mean_logprob, "mean_logprob", high=0.0)  # raises, with the usual message
    claimed = c.claimed_reward_informational
    if not -_INF < claimed < _INF:
        _finite(claimed, "claimed_reward_informational")
    completion = _new_completion(Completion)
    set_text, set_count, set_mean, set_claimed, set_ids, set_logprobs = _COMPLETION_SLOTS
    set_text(completion, text)
    set_count(completion, token_count)
    set_mean(completion, mean_logprob)
    set_claimed(completion, claimed)
    set_ids(completion, token_ids)
    set_logprobs(completion, token_logprobs)
    return completion


def _group_from(msg: pb.RolloutGroup, where: str) -> RolloutGroup:
    _count(msg.completions, limits.MAX_COMPLETIONS_PER_GROUP, f"{where}.completions", minimum=1)
    if not msg.HasField("task"):
        raise _Invalid(WireReason.INVALID_PAYLOAD, f"{where}.task is missing")
    completions = []
    for i, c in enumerate(msg.completions):
        try:
            completions.append(_completion_from(c))
        except _Invalid as invalid:  # add the location only on failure: the hot path builds no strings
            raise _Invalid(invalid.reason, f"{where}.completions[{i}].{invalid.detail}") from None
    return RolloutGroup(
        task=_task_from(msg.task),
        prompt=_text(msg.prompt, limits.MAX_PROMPT_BYTES, f"{where}.prompt", required=True),
        completions=tuple(completions),
        model_id=_text(msg.model_id, limits.MAX_MODEL_ID_BYTES, f"{where}.model_id", required=True),
        policy_version=msg.policy_version,
        round=msg.round,
        batch_reward_mean=_finite(msg.batch_reward_mean, f"{where}.batch_reward_mean", low=0.0, high=1.0),
        system_prompt_sha256=_system_prompt_sha256(msg.system_prompt_sha256, where),
    )


def _system_prompt_sha256(value: bytes, where: str) -> bytes:
    if len(value) not in (0, limits.SYSTEM_PROMPT_SHA256_BYTES):
        raise _Invalid(
            WireReason.INVALID_PAYLOAD,
            f"{where}.system_prompt_sha256 must be empty or {limits.SYSTEM_PROMPT_SHA256_BYTES} bytes, "
            f"got {len(value)}",
        )
    return bytes(value)


def _rollout_batch_from(msg: pb.RolloutBatch) -> RolloutBatch:
    _count(msg.groups, limits.MAX_GROUPS_PER_BATCH, "groups", minimum=1)
    return RolloutBatch(groups=tuple(_group_from(g, f"groups[{i}]") for i, g in enumerate(msg.groups)))


def _group_to(g: RolloutGroup) -> pb.RolloutGroup:
    return pb.RolloutGroup(
        task=pb.TaskId(
            dataset=g.task.dataset,
            config=g.task.config,
            seed=g.task.seed,
            index=g.task.index,
            prompt_format=g.task.prompt_format,
        ),
        prompt=g.prompt,
        completions=[
            pb.Completion(
                text=c.text,
                token_count=c.token_count,
                mean_logprob=c.mean_logprob,
                claimed_reward_informational=c.claimed_reward_informational,
                token_ids=list(c.token_ids),
                token_logprobs=list(c.token_logprobs),
            )
            for c in g.completions
        ],
        model_id=g.model_id,
        policy_version=g.policy_version,
        round=g.round,
        batch_reward_mean=g.batch_reward_mean,
        system_prompt_sha256=g.system_prompt_sha256,
    )


def _rollout_batch_to(m: RolloutBatch) -> pb.RolloutBatch:
    return pb.RolloutBatch(groups=[_group_to(g) for g in m.groups])


# --------------------------------------------------------------------------- announce


@dataclass(frozen=True, slots=True)
class Announce:
    round: int
    rollout_digests: tuple[bytes, ...] = ()
    manifest_digests: tuple[bytes, ...] = ()


def _announce_from(msg: pb.Announce) -> Announce:
    _count(msg.rollout_digests, limits.MAX_ROLLOUT_DIGESTS, "rollout_digests")
    _count(msg.manifest_digests, limits.MAX_MANIFEST_DIGESTS, "manifest_digests")
    return Announce(
        round=msg.round,
        rollout_digests=tuple(_digest(d, "rollout_digests[]") for d in msg.rollout_digests),
        manifest_digests=tuple(_digest(d, "manifest_digests[]") for d in msg.manifest_digests),
    )


def _announce_to(m: Announce) -> pb.Announce:
    return pb.Announce(
        round=m.round, rollout_digests=list(m.rollout_digests), manifest_digests=list(m.manifest_digests)
    )


# --------------------------------------------------------------------------- weights


@dataclass(frozen=True, slots=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class WeightManifestBody:
    model_id: str
    version: int
    tensors: tuple[TensorEntry, ...]
    chunk_size: int
    chunk_hashes: tuple[bytes, ...]
    total_bytes: int
    # Empty: the blob is the whole model. Else the SHA-256 ``weights_hash`` of the base model the
    # blob's LoRA adapter is added to, each adapted weight becoming ``W + adapter_scale * (B @ A)``
    # (``swarmnode.broadcast.adapter``).
    base_hash: bytes = b""
    adapter_scale: float = 0.0

    @property
    def is_adapter(self) -> bool:
        return bool(self.base_hash)

    def chunk_length(self, index: int) -> int:
        """Bytes in chunk ``index`` (the last one may be short)."""
        return min(self.chunk_size, self.total_bytes - index * self.chunk_size)


@dataclass(frozen=True, slots=True)
class WeightManifest:
    """A manifest with its publisher's signature over the exact ``body_bytes``."""

    body: WeightManifestBody
    body_bytes: bytes
    publisher_key: bytes
    signature: bytes


def _tensor_from(msg: pb.TensorEntry, total_bytes: int, where: str) -> TensorEntry:
    name = _text(msg.name, limits.MAX_TENSOR_NAME_BYTES, f"{where}.name", required=True)
    _count(msg.shape, limits.MAX_TENSOR_DIMS, f"{where}.shape")
    size = limits.DTYPE_SIZES.get(msg.dtype)
    if size is None:
        raise _Invalid(
            WireReason.INVALID_PAYLOAD, f"{where}.dtype {clip(msg.dtype)} is not a safetensors dtype"
        )
    shape = tuple(msg.shape)
    expected = size * math.prod(shape)
    if msg.nbytes != expected:
        raise _Invalid(
            WireReason.INVALID_PAYLOAD, f"{where}.nbytes={msg.nbytes}; shape and dtype say {expected}"
        )
    if msg.offset + msg.nbytes > total_bytes:
        raise _Invalid(WireReason.INVALID_PAYLOAD, f"{where} ends past total_bytes={total_bytes}")
    return TensorEntry(name=name, dtype=msg.dtype, shape=shape, offset=msg.offset, nbytes=msg.nbytes)


def _manifest_body_from(msg: pb.WeightManifestBody) -> WeightManifestBody:
    _count(msg.tensors, limits.MAX_TENSORS, "tensors", minimum=1)
    _count(msg.chunk_hashes, limits.MAX_CHUNKS, "chunk_hashes", minimum=1)
    chunk_size = _int_range(msg.chunk_size, "chunk_size", limits.MIN_CHUNK_SIZE, limits.MAX_CHUNK_SIZE)
    total = msg.total_bytes
    if total < 1:
        raise _Invalid(WireReason.INVALID_PAYLOAD, "total_bytes is 0")
    chunks = -(-total // chunk_size)
    if chunks != len(msg.chunk_hashes):
        raise _Invalid(
            WireReason.INVALID_PAYLOAD,
            f"{len(msg.chunk_hashes)} chunk hashes for {total} bytes "
            f"in chunks of {chunk_size} (need {chunks})",
        )
    tensors = tuple(_tensor_from(t, total, f"tensors[{i}]") for i, t in enumerate(msg.tensors))
    if len({t.name for t in tensors}) != len(tensors):
        raise _Invalid(WireReason.INVALID_PAYLOAD, "tensor names are not unique")
    end = 0
    for t in sorted(tensors, key=lambda t: t.offset):
        if t.offset < end:
            raise _Invalid(WireReason.INVALID_PAYLOAD, f"tensor {clip(t.name)} overlaps the one before it")
        end = t.offset + t.nbytes
    if msg.base_hash:
        base_hash = _digest(msg.base_hash, "base_hash")
        scale = _finite(msg.adapter_scale, "adapter_scale", high=limits.MAX_ADAPTER_SCALE)
        if scale <= 0:
            raise _Invalid(WireReason.INVALID_PAYLOAD, f"adapter_scale={scale}; an adapter's must be > 0")
    elif msg.adapter_scale != 0:
        raise _Invalid(
            WireReason.INVALID_PAYLOAD, "adapter_scale without base_hash (whole weights have none)"
        )
    else:
        base_hash, scale = b"", 0.0
    return WeightManifestBody(
        model_id=_text(msg.model_id, limits.MAX_MODEL_ID_BYTES, "model_id", required=True),
        version=msg.version,
        tensors=tensors,
        chunk_size=chunk_size,
        chunk_hashes=tuple(_digest(h, "chunk_hashes[]") for h in msg.chunk_hashes),
        total_bytes=total,
        base_hash=base_hash,
        adapter_scale=scale,
    )


def _manifest_body_to(m: WeightManifestBody) -> pb.WeightManifestBody:
    return pb.WeightManifestBody(
        model_id=m.model_id,
        version=m.version,
        tensors=[
            pb.TensorEntry(name=t.name, dtype=t.dtype, shape=list(t.shape), offset=t.offset, nbytes=t.nbytes)
            for t in m.tensors
        ],
        chunk_size=m.chunk_size,
        chunk_hashes=list(m.chunk_hashes),
        total_bytes=m.total_bytes,
        base_hash=m.base_hash,
        adapter_scale=m.adapter_scale,
    )


def _manifest_from(msg: pb.WeightManifest) -> WeightManifest:
    if len(msg.publisher_key) != limits.PUBLIC_KEY_BYTES:
        raise _Invalid(
            WireReason.INVALID_PAYLOAD, f"publisher_key is {len(msg.publisher_key)} bytes; must be 32"
        )
    if len(msg.signature) != limits.SIGNATURE_BYTES:
        raise _Invalid(
            WireReason.INVALID_PAYLOAD, f"manifest signature is {len(msg.signature)} bytes; must be 64"
        )
    body = _parse(pb.WeightManifestBody, msg.body, "manifest body")
    return WeightManifest(
        body=_manifest_body_from(body),
        body_bytes=msg.body,
        publisher_key=msg.publisher_key,
        signature=msg.signature,
    )


def _manifest_to(m: WeightManifest) -> pb.WeightManifest:
    return pb.WeightManifest(body=m.body_bytes, publisher_key=m.publisher_key, signature=m.signature)


def encode_manifest_body(body: WeightManifestBody) -> bytes:
    """The bytes a publisher signs (see ``envelope.sign_manifest``)."""
    data = _manifest_body_to(body).SerializeToString(deterministic=True)
    checked = _decode(pb.WeightManifestBody, _manifest_body_from, data)
    if isinstance(checked, WireError):
        raise ValueError(f"refusing to encode an invalid manifest body: {checked.reason}: {checked.detail}")
    return data


# --------------------------------------------------------------------------- chunks


@dataclass(frozen=True, slots=True)
class ChunkRequest:
    manifest_digest: bytes
    chunk_index: int
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class ChunkData:
    manifest_digest: bytes
    chunk_index: int
    offset: int
    data: bytes


def _chunk_request_from(msg: pb.ChunkRequest) -> ChunkRequest:
    return ChunkRequest(
        manifest_digest=_digest(msg.manifest_digest, "manifest_digest"),
        chunk_index=_int_range(msg.chunk_index, "chunk_index", 0, limits.MAX_CHUNKS - 1),
        offset=_int_range(msg.offset, "offset", 0, limits.MAX_CHUNK_SIZE - 1),
        length=_int_range(msg.length, "length", 1, limits.MAX_CHUNK_SLICE),
    )


def _chunk_data_from(msg: pb.ChunkData) -> ChunkData:
    if not 1 <= len(msg.data) <= limits.MAX_CHUNK_SLICE:
        raise _Invalid(
            WireReason.LIMIT_EXCEEDED,
            f"chunk data is {len(msg.data)} bytes; allowed 1..{limits.MAX_CHUNK_SLICE}",
        )
    return ChunkData(
        manifest_digest=_digest(msg.manifest_digest, "manifest_digest"),
        chunk_index=_int_range(msg.chunk_index, "chunk_index", 0, limits.MAX_CHUNKS - 1),
        offset=_int_range(msg.offset, "offset", 0, limits.MAX_CHUNK_SIZE - 1),
        data=msg.data,
    )


@dataclass(frozen=True, slots=True)
class ChunkHave:
    manifest_digest: bytes
    chunk_indices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Refusal:
    reason: str
    detail: str = ""


def _chunk_have_from(msg: pb.ChunkHave) -> ChunkHave:
    _count(msg.chunk_indices, limits.MAX_CHUNKS, "chunk_indices")
    indices = tuple(msg.chunk_indices)
    if any(i >= limits.MAX_CHUNKS for i in indices):
        raise _Invalid(WireReason.LIMIT_EXCEEDED, f"chunk_indices must be < {limits.MAX_CHUNKS}")
    if len(set(indices)) != len(indices):
        raise _Invalid(WireReason.INVALID_PAYLOAD, "chunk_indices has duplicates")
    return ChunkHave(manifest_digest=_digest(msg.manifest_digest, "manifest_digest"), chunk_indices=indices)


def _refusal_from(msg: pb.Refusal) -> Refusal:
    return Refusal(
        reason=_text(msg.reason, limits.MAX_REFUSAL_REASON_BYTES, "reason", required=True),
        detail=_text(msg.detail, limits.MAX_REASON_BYTES, "detail"),
    )


# --------------------------------------------------------------------------- control


@dataclass(frozen=True, slots=True)
class Activate:
    worker_peer_id: str
    model_id: str
    policy_version: int
    target_rate: float
    lease_seconds: int
    #: empty, or the 32-byte seed of keyed sampling for this activation (protocol/SPEC.md 1.8)
    sampling_seed: bytes = b""


@dataclass(frozen=True, slots=True)
class Deactivate:
    worker_peer_id: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Heartbeat:
    round: int
    model_id: str
    policy_version: int
    rollout_rate: float = 0.0


def _activate_from(msg: pb.Activate) -> Activate:
    rate = _finite(msg.target_rate, "target_rate", low=0.0, high=limits.MAX_RATE)
    if rate == 0.0:
        raise _Invalid(WireReason.INVALID_PAYLOAD, "target_rate must be > 0")
    return Activate(
        worker_peer_id=_text(msg.worker_peer_id, limits.MAX_PEER_ID_BYTES, "worker_peer_id", required=True),
        model_id=_text(msg.model_id, limits.MAX_MODEL_ID_BYTES, "model_id", required=True),
        policy_version=msg.policy_version,
        target_rate=rate,
        lease_seconds=_int_range(msg.lease_seconds, "lease_seconds", 1, limits.MAX_LEASE_SECONDS),
        sampling_seed=_sampling_seed(msg.sampling_seed),
    )


def _sampling_seed(seed: bytes) -> bytes:
    if len(seed) not in (0, limits.SAMPLING_SEED_BYTES):
        raise _Invalid(
            WireReason.INVALID_PAYLOAD,
            f"sampling_seed must be empty or {limits.SAMPLING_SEED_BYTES} bytes, got {len(seed)}",
        )
    return bytes(seed)


def _deactivate_from(msg: pb.Deactivate) -> Deactivate:
    return Deactivate(
        worker_peer_id=_text(msg.worker_peer_id, limits.MAX_PEER_ID_BYTES, "worker_peer_id", required=True),
        reason=_text(msg.reason, limits.MAX_REASON_BYTES, "reason"),
    )


def _heartbeat_from(msg: pb.Heartbeat) -> Heartbeat:
    return Heartbeat(
        round=msg.round,
        model_id=_text(msg.model_id, limits.MAX_MODEL_ID_BYTES, "model_id", required=True),
        policy_version=msg.policy_version,
        rollout_rate=_finite(msg.rollout_rate, "rollout_rate", low=0.0, high=limits.MAX_RATE),
    )


# --------------------------------------------------------------------------- codecs

Message: TypeAlias = (
    PeerRecord
    | RolloutBatch
    | Announce
    | WeightManifest
    | ChunkRequest
    | ChunkData
    | Activate
    | Deactivate
    | Heartbeat
    | ChunkHave
    | Refusal
)


@dataclass(frozen=True)
class _Codec:
    proto: type[Any]
    from_proto: Callable[[Any], Any]
    to_proto: Callable[[Any], Any]
    message_type: type


_CODECS: dict[Kind, _Codec] = {
    Kind.PEER_RECORD: _Codec(pb.PeerRecord, _peer_record_from, _peer_record_to, PeerRecord),
    Kind.ROLLOUT_BATCH: _Codec(pb.RolloutBatch, _rollout_batch_from, _rollout_batch_to, RolloutBatch),
    Kind.ANNOUNCE: _Codec(pb.Announce, _announce_from, _announce_to, Announce),
    Kind.WEIGHT_MANIFEST: _Codec(pb.WeightManifest, _manifest_from, _manifest_to, WeightManifest),
    Kind.CHUNK_REQUEST: _Codec(
        pb.ChunkRequest,
        _chunk_request_from,
        lambda m: pb.ChunkRequest(
            manifest_digest=m.manifest_digest, chunk_index=m.chunk_index, offset=m.offset, length=m.length
        ),
        ChunkRequest,
    ),
    Kind.CHUNK_DATA: _Codec(
        pb.ChunkData,
        _chunk_data_from,
        lambda m: pb.ChunkData(
            manifest_digest=m.manifest_digest, chunk_index=m.chunk_index, offset=m.offset, data=m.data
        ),
        ChunkData,
    ),
    Kind.ACTIVATE: _Codec(
        pb.Activate,
        _activate_from,
        lambda m: pb.Activate(
            worker_peer_id=m.worker_peer_id,
            model_id=m.model_id,
            policy_version=m.policy_version,
            target_rate=m.target_rate,
            lease_seconds=m.lease_seconds,
            sampling_seed=m.sampling_seed,
        ),
        Activate,
    ),
    Kind.DEACTIVATE: _Codec(
        pb.Deactivate,
        _deactivate_from,
        lambda m: pb.Deactivate(worker_peer_id=m.worker_peer_id, reason=m.reason),
        Deactivate,
    ),
    Kind.HEARTBEAT: _Codec(
        pb.Heartbeat,
        _heartbeat_from,
        lambda m: pb.Heartbeat(
            round=m.round, model_id=m.model_id, policy_version=m.policy_version, rollout_rate=m.rollout_rate
        ),
        Heartbeat,
    ),
}

_CODECS[Kind.CHUNK_HAVE] = _Codec(
    pb.ChunkHave,
    _chunk_have_from,
    lambda m: pb.ChunkHave(manifest_digest=m.manifest_digest, chunk_indices=list(m.chunk_indices)),
    ChunkHave,
)
_CODECS[Kind.REFUSAL] = _Codec(
    pb.Refusal, _refusal_from, lambda m: pb.Refusal(reason=m.reason, detail=m.detail), Refusal
)

_KIND_OF: dict[type, Kind] = {codec.message_type: kind for kind, codec in _CODECS.items()}


def kind_of(message: Message) -> Kind:
    """The envelope kind that carries ``message``."""
    return _KIND_OF[type(message)]


def _parse(proto: type[Any], data: bytes, what: str) -> Any:
    msg = proto()
    try:
        msg.ParseFromString(data)
    except DecodeError as exc:
        raise _Invalid(WireReason.INVALID_PAYLOAD, f"{what} does not parse: {exc}") from exc
    return msg


def _decode(proto: type[Any], from_proto: Callable[[Any], Any], data: bytes) -> Any:
    try:
        return from_proto(_parse(proto, data, proto.DESCRIPTOR.name))
    except _Invalid as invalid:
        return WireError(invalid.reason, invalid.detail)


def decode_payload(kind: Kind, data: bytes) -> Message | WireError:
    """Bytes of an envelope's payload -> validated message of ``kind``, or why not.

    Never raises for any ``data``. The caller must have capped ``len(data)``
    (``decode_envelope`` does, with ``kinds.MAX_PAYLOAD_BYTES``); this function
    re-checks the cap so it is safe to call on its own.
    """
    if len(data) > MAX_PAYLOAD_BYTES[kind]:
        return WireError(WireReason.TOO_LARGE, f"{kind.label} payload is {len(data)} bytes")
    codec = _CODECS[kind]
    result: Message | WireError = _decode(codec.proto, codec.from_proto, data)
    return result


def decode_manifest_body(data: bytes) -> WeightManifestBody | WireError:
    """Bytes a publisher signed -> validated manifest body, or why not. Never raises."""
    result: WeightManifestBody | WireError = _decode(pb.WeightManifestBody, _manifest_body_from, data)
    return result


def encode_payload(message: Message) -> bytes:
    """Serialize ``message``; raises ``ValueError`` if a receiver would refuse it.

    Encoding is deterministic for this implementation, but receivers never rely
    on that: signatures cover the bytes as sent.
    """
    kind = kind_of(message)
    codec = _CODECS[kind]
    data: bytes = codec.to_proto(message).SerializeToString(deterministic=True)
    checked = decode_payload(kind, data)
    if isinstance(checked, WireError):
        raise ValueError(f"refusing to encode an invalid {kind.label}: {checked.reason}: {checked.detail}")
    return data
