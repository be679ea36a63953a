from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    KIND_UNSPECIFIED: _ClassVar[Kind]
    KIND_PEER_RECORD: _ClassVar[Kind]
    KIND_ROLLOUT_BATCH: _ClassVar[Kind]
    KIND_ANNOUNCE: _ClassVar[Kind]
    KIND_WEIGHT_MANIFEST: _ClassVar[Kind]
    KIND_CHUNK_REQUEST: _ClassVar[Kind]
    KIND_CHUNK_DATA: _ClassVar[Kind]
    KIND_ACTIVATE: _ClassVar[Kind]
    KIND_DEACTIVATE: _ClassVar[Kind]
    KIND_HEARTBEAT: _ClassVar[Kind]
    KIND_CHUNK_HAVE: _ClassVar[Kind]
    KIND_REFUSAL: _ClassVar[Kind]

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNSPECIFIED: _ClassVar[Role]
    ROLE_TRAINER: _ClassVar[Role]
    ROLE_LEARNER: _ClassVar[Role]
    ROLE_WORKER: _ClassVar[Role]
    ROLE_BOOTSTRAP: _ClassVar[Role]
KIND_UNSPECIFIED: Kind
KIND_PEER_RECORD: Kind
KIND_ROLLOUT_BATCH: Kind
KIND_ANNOUNCE: Kind
KIND_WEIGHT_MANIFEST: Kind
KIND_CHUNK_REQUEST: Kind
KIND_CHUNK_DATA: Kind
KIND_ACTIVATE: Kind
KIND_DEACTIVATE: Kind
KIND_HEARTBEAT: Kind
KIND_CHUNK_HAVE: Kind
KIND_REFUSAL: Kind
ROLE_UNSPECIFIED: Role
ROLE_TRAINER: Role
ROLE_LEARNER: Role
ROLE_WORKER: Role
ROLE_BOOTSTRAP: Role

class Envelope(_message.Message):
    __slots__ = ("version", "kind", "sender_key", "sent_at_ms", "payload", "signature")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SENDER_KEY_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_MS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    version: int
    kind: Kind
    sender_key: bytes
    sent_at_ms: int
    payload: bytes
    signature: bytes
    def __init__(self, version: _Optional[int] = ..., kind: _Optional[_Union[Kind, str]] = ..., sender_key: _Optional[bytes] = ..., sent_at_ms: _Optional[int] = ..., payload: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class Capabilities(_message.Message):
    __slots__ = ("rollout_rate", "price", "hardware", "software_version")
    ROLLOUT_RATE_FIELD_NUMBER: _ClassVar[int]
    PRICE_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    SOFTWARE_VERSION_FIELD_NUMBER: _ClassVar[int]
    rollout_rate: float
    price: float
    hardware: str
    software_version: str
    def __init__(self, rollout_rate: _Optional[float] = ..., price: _Optional[float] = ..., hardware: _Optional[str] = ..., software_version: _Optional[str] = ...) -> None: ...

class PeerRecord(_message.Message):
    __slots__ = ("peer_id", "libp2p_peer_id", "addresses", "roles", "model_family", "model_id", "capabilities")
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    LIBP2P_PEER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    MODEL_FAMILY_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    peer_id: str
    libp2p_peer_id: str
    addresses: _containers.RepeatedScalarFieldContainer[str]
    roles: _containers.RepeatedScalarFieldContainer[Role]
    model_family: str
    model_id: str
    capabilities: Capabilities
    def __init__(self, peer_id: _Optional[str] = ..., libp2p_peer_id: _Optional[str] = ..., addresses: _Optional[_Iterable[str]] = ..., roles: _Optional[_Iterable[_Union[Role, str]]] = ..., model_family: _Optional[str] = ..., model_id: _Optional[str] = ..., capabilities: _Optional[_Union[Capabilities, _Mapping]] = ...) -> None: ...

class TaskId(_message.Message):
    __slots__ = ("dataset", "config", "seed", "index", "prompt_format")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FORMAT_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    config: str
    seed: int
    index: int
    prompt_format: str
    def __init__(self, dataset: _Optional[str] = ..., config: _Optional[str] = ..., seed: _Optional[int] = ..., index: _Optional[int] = ..., prompt_format: _Optional[str] = ...) -> None: ...

class Completion(_message.Message):
    __slots__ = ("text", "token_count", "mean_logprob", "claimed_reward_informational", "token_ids", "token_logprobs")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    MEAN_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_REWARD_INFORMATIONAL_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_count: int
    mean_logprob: float
    claimed_reward_informational: float
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    token_logprobs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, text: _Optional[str] = ..., token_count: _Optional[int] = ..., mean_logprob: _Optional[float] = ..., claimed_reward_informational: _Optional[float] = ..., token_ids: _Optional[_Iterable[int]] = ..., token_logprobs: _Optional[_Iterable[float]] = ...) -> None: ...

class RolloutGroup(_message.Message):
    __slots__ = ("task", "prompt", "completions", "model_id", "policy_version", "round", "batch_reward_mean", "system_prompt_sha256")
    TASK_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    BATCH_REWARD_MEAN_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_PROMPT_SHA256_FIELD_NUMBER: _ClassVar[int]
    task: TaskId
    prompt: str
    completions: _containers.RepeatedCompositeFieldContainer[Completion]
    model_id: str
    policy_version: int
    round: int
    batch_reward_mean: float
    system_prompt_sha256: bytes
    def __init__(self, task: _Optional[_Union[TaskId, _Mapping]] = ..., prompt: _Optional[str] = ..., completions: _Optional[_Iterable[_Union[Completion, _Mapping]]] = ..., model_id: _Optional[str] = ..., policy_version: _Optional[int] = ..., round: _Optional[int] = ..., batch_reward_mean: _Optional[float] = ..., system_prompt_sha256: _Optional[bytes] = ...) -> None: ...

class RolloutBatch(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[RolloutGroup]
    def __init__(self, groups: _Optional[_Iterable[_Union[RolloutGroup, _Mapping]]] = ...) -> None: ...

class Announce(_message.Message):
    __slots__ = ("round", "rollout_digests", "manifest_digests")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_DIGESTS_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_DIGESTS_FIELD_NUMBER: _ClassVar[int]
    round: int
    rollout_digests: _containers.RepeatedScalarFieldContainer[bytes]
    manifest_digests: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, round: _Optional[int] = ..., rollout_digests: _Optional[_Iterable[bytes]] = ..., manifest_digests: _Optional[_Iterable[bytes]] = ...) -> None: ...

class TensorEntry(_message.Message):
    __slots__ = ("name", "dtype", "shape", "offset", "nbytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    offset: int
    nbytes: int
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., offset: _Optional[int] = ..., nbytes: _Optional[int] = ...) -> None: ...

class WeightManifestBody(_message.Message):
    __slots__ = ("model_id", "version", "tensors", "chunk_size", "chunk_hashes", "total_bytes", "base_hash", "adapter_scale")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_HASHES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    BASE_HASH_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_SCALE_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    version: int
    tensors: _containers.RepeatedCompositeFieldContainer[TensorEntry]
    chunk_size: int
    chunk_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    total_bytes: int
    base_hash: bytes
    adapter_scale: float
    def __init__(self, model_id: _Optional[str] = ..., version: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[TensorEntry, _Mapping]]] = ..., chunk_size: _Optional[int] = ..., chunk_hashes: _Optional[_Iterable[bytes]] = ..., total_bytes: _Optional[int] = ..., base_hash: _Optional[bytes] = ..., adapter_scale: _Optional[float] = ...) -> None: ...

class WeightManifest(_message.Message):
    __slots__ = ("body", "publisher_key", "signature")
    BODY_FIELD_NUMBER: _ClassVar[int]
    PUBLISHER_KEY_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    body: bytes
    publisher_key: bytes
    signature: bytes
    def __init__(self, body: _Optional[bytes] = ..., publisher_key: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class ChunkRequest(_message.Message):
    __slots__ = ("manifest_digest", "chunk_index", "offset", "length")
    MANIFEST_DIGEST_FIELD_NUMBER: _ClassVar[int]
    CHUNK_INDEX_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    manifest_digest: bytes
    chunk_index: int
    offset: int
    length: int
    def __init__(self, manifest_digest: _Optional[bytes] = ..., chunk_index: _Optional[int] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class ChunkData(_message.Message):
    __slots__ = ("manifest_digest", "chunk_index", "offset", "data")
    MANIFEST_DIGEST_FIELD_NUMBER: _ClassVar[int]
    CHUNK_INDEX_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    manifest_digest: bytes
    chunk_index: int
    offset: int
    data: bytes
    def __init__(self, manifest_digest: _Optional[bytes] = ..., chunk_index: _Optional[int] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class Activate(_message.Message):
    __slots__ = ("worker_peer_id", "model_id", "policy_version", "target_rate", "lease_seconds", "sampling_seed")
    WORKER_PEER_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    TARGET_RATE_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_SEED_FIELD_NUMBER: _ClassVar[int]
    worker_peer_id: str
    model_id: str
    policy_version: int
    target_rate: float
    lease_seconds: int
    sampling_seed: bytes
    def __init__(self, worker_peer_id: _Optional[str] = ..., model_id: _Optional[str] = ..., policy_version: _Optional[int] = ..., target_rate: _Optional[float] = ..., lease_seconds: _Optional[int] = ..., sampling_seed: _Optional[bytes] = ...) -> None: ...

class Deactivate(_message.Message):
    __slots__ = ("worker_peer_id", "reason")
    WORKER_PEER_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    worker_peer_id: str
    reason: str
    def __init__(self, worker_peer_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("round", "model_id", "policy_version", "rollout_rate")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_RATE_FIELD_NUMBER: _ClassVar[int]
    round: int
    model_id: str
    policy_version: int
    rollout_rate: float
    def __init__(self, round: _Optional[int] = ..., model_id: _Optional[str] = ..., policy_version: _Optional[int] = ..., rollout_rate: _Optional[float] = ...) -> None: ...

class ChunkHave(_message.Message):
    __slots__ = ("manifest_digest", "chunk_indices")
    MANIFEST_DIGEST_FIELD_NUMBER: _ClassVar[int]
    CHUNK_INDICES_FIELD_NUMBER: _ClassVar[int]
    manifest_digest: bytes
    chunk_indices: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, manifest_digest: _Optional[bytes] = ..., chunk_indices: _Optional[_Iterable[int]] = ...) -> None: ...

class Refusal(_message.Message):
    __slots__ = ("reason", "detail")
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    reason: str
    detail: str
    def __init__(self, reason: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...
