"""Wire protocol v1: generated protobuf code, typed messages, signed envelopes, hard limits.

Owns: bytes <-> typed values, and the signing rule (protocol/SPEC.md is
normative). Must not: decide whether a peer's message is acceptable beyond its
form (that is ``swarmnode.admit``), read a clock, or do I/O.

``swarm_pb2.py`` / ``swarm_pb2.pyi`` are generated from ``swarm.proto`` (a copy of
protocol/swarm.proto) by ``python -m swarmnode.tools.generate_proto``; never edit them.
"""

from swarmnode.wire.envelope import (
    Envelope,
    Signer,
    decode_envelope,
    encode_envelope,
    seal,
    seal_payload,
    sign_manifest,
    signed_message,
    to_ms,
    verify_manifest,
)
from swarmnode.wire.kinds import MANIFEST_BODY_PREFIX, MAX_PAYLOAD_BYTES, Kind, Role, signing_prefix
from swarmnode.wire.messages import (
    Activate,
    Announce,
    Capabilities,
    ChunkData,
    ChunkHave,
    ChunkRequest,
    Completion,
    Deactivate,
    Heartbeat,
    Message,
    PeerRecord,
    Refusal,
    RolloutBatch,
    RolloutGroup,
    TensorEntry,
    WeightManifest,
    WeightManifestBody,
    decode_manifest_body,
    decode_payload,
    encode_manifest_body,
    encode_payload,
    kind_of,
    system_prompt_id,
)
from swarmnode.wire.reasons import WireError, WireReason

__all__ = [
    "MANIFEST_BODY_PREFIX",
    "MAX_PAYLOAD_BYTES",
    "Activate",
    "Announce",
    "Capabilities",
    "ChunkData",
    "ChunkHave",
    "ChunkRequest",
    "Completion",
    "Deactivate",
    "Envelope",
    "Heartbeat",
    "Kind",
    "Message",
    "PeerRecord",
    "Refusal",
    "Role",
    "RolloutBatch",
    "RolloutGroup",
    "Signer",
    "TensorEntry",
    "WeightManifest",
    "WeightManifestBody",
    "WireError",
    "WireReason",
    "decode_envelope",
    "decode_manifest_body",
    "decode_payload",
    "encode_envelope",
    "encode_manifest_body",
    "encode_payload",
    "kind_of",
    "seal",
    "seal_payload",
    "sign_manifest",
    "signed_message",
    "signing_prefix",
    "system_prompt_id",
    "to_ms",
    "verify_manifest",
]
