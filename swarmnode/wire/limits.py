"""Hard limits of protocol version 1 (protocol/SPEC.md "Limits" is the normative table).

Owns: every number a decoder enforces. Must not: change a value without
updating SPEC.md and regenerating the vectors (tests/wire/test_vectors.py
compares the committed vectors byte for byte and will say so).

Text limits count UTF-8 bytes, not characters, so every language measures
them the same way.
"""

from __future__ import annotations

from swarmnode.tasks.ids import MAX_CONFIG_JSON, MAX_DATASET_NAME

PROTOCOL_VERSION = 1

KIB = 1024
MIB = 1024 * KIB

#: Raw envelope bytes; checked before the envelope is parsed at all.
MAX_ENVELOPE_BYTES = 2 * MIB

#: Top-level fields in an envelope (six defined; a few unknown ones tolerated). Checked by a
#: scan before parsing, as is the absence of group-encoded fields.
MAX_ENVELOPE_FIELDS = 16

#: Envelope bytes beyond the canonical encoding of its fields (unknown fields, repeated or
#: mistyped known fields, over-long varints). The envelope id does not cover them, so without a
#: cap anyone could serve an honest envelope padded to 2 MiB under its id (red team rt24 F3).
MAX_ENVELOPE_EXTRA_BYTES = 1 * KIB

PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64
DIGEST_BYTES = 32

# Rollouts
MAX_GROUPS_PER_BATCH = 64
MAX_COMPLETIONS_PER_GROUP = 64
MAX_PROMPT_BYTES = 8 * KIB
MAX_COMPLETION_BYTES = 8 * KIB
MAX_COMPLETION_TOKENS = 8192
MAX_TASK_DATASET_BYTES = MAX_DATASET_NAME
MAX_TASK_CONFIG_BYTES = MAX_CONFIG_JSON
MAX_TASK_INDEX = 999_999_999  # swarmnode.tasks.source.MAX_TASK_INDEX - 1

# Short identifiers and free text
MAX_PEER_ID_BYTES = 64
MAX_LIBP2P_ID_BYTES = 128
MAX_MODEL_ID_BYTES = 128
MAX_MODEL_FAMILY_BYTES = 64
MAX_ADDRESSES = 16
MAX_ADDRESS_BYTES = 256
MAX_ROLES = 8
MAX_HARDWARE_BYTES = 128
MAX_SOFTWARE_VERSION_BYTES = 128
MAX_REASON_BYTES = 256

# Announcements
MAX_ROLLOUT_DIGESTS = 256
MAX_MANIFEST_DIGESTS = 16

# Weights
MAX_TENSORS = 16_384
MAX_TENSOR_NAME_BYTES = 256
MAX_TENSOR_DIMS = 8
MIN_CHUNK_SIZE = 1 * KIB
MAX_CHUNK_SIZE = 1024 * MIB
MAX_CHUNKS = 16_384
MAX_CHUNK_SLICE = 1 * MIB
MAX_REFUSAL_REASON_BYTES = 32
MAX_ADAPTER_SCALE = 65_536.0  # WeightManifestBody.adapter_scale (alpha / r) when base_hash is set

# Worker control
MAX_LEASE_SECONDS = 86_400
SAMPLING_SEED_BYTES = 32  # Activate.sampling_seed: keyed sampling (SPEC.md 1.8)
SYSTEM_PROMPT_SHA256_BYTES = 32  # RolloutGroup.system_prompt_sha256 when not empty (SPEC.md 1.3)
MAX_RATE = 1e9  # completions per second; anything above is nonsense, not a measurement

#: safetensors dtype names and their element sizes in bytes.
DTYPE_SIZES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}
