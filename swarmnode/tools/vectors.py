"""Test vectors: signed envelopes with the verdict every implementation must reach.

Owns: building ``protocol/vectors/`` (``*.bin`` envelopes + ``manifest.json``)
deterministically (fixed keys, fixed times; Ed25519 signatures are
deterministic), and the admission context they are judged in (plus the fields a
vector's or sequence's own context replaces: a CPU budget, the receiver's
tokenizer, the boundary's test-only ``sandbox_upstream``). Must not: compute
expected verdicts with the admission code it is meant to test: each vector
states its expectation by construction; tests/wire/test_vectors.py checks that
``swarmnode.admit`` agrees, and that a fresh build is byte-identical to the
committed one.

    python -m swarmnode.tools.vectors --out protocol/vectors
    swarmnode protocol vectors --out protocol/vectors
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any

from swarmnode.config import DEFAULT_SYSTEM_PROMPT
from swarmnode.identity import NodeIdentity
from swarmnode.tasks import Task, TaskId, regenerate, score_completion
from swarmnode.tasks.ids import canonical_config
from swarmnode.wire import limits
from swarmnode.wire import swarm_pb2 as pb
from swarmnode.wire.envelope import Envelope, encode_envelope, seal, seal_payload, sign_manifest
from swarmnode.wire.kinds import MAX_PAYLOAD_BYTES, Kind, Role
from swarmnode.wire.messages import (
    SYSTEM_PROMPT_DOMAIN,
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
    _group_to,
    encode_payload,
    system_prompt_id,
)

MANIFEST = "manifest.json"

#: The vectors' clock: 2026-01-01T00:00:00Z. Valid vectors were "sent" one second earlier.
NOW = 1_767_225_600.0
SENT_AT_MS = int(NOW * 1000) - 1000

MODEL_ID = "swarmnode-tiny"
CURRENT_VERSION = 10  # the receiver's known version of MODEL_ID (staleness context)
MAX_AGE_S = 300.0
MAX_FUTURE_S = 30.0
MAX_POLICY_LAG = 8

CHAIN_SUM = canonical_config({"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2})
# spiral_matrix is "allowed" so that its vector shows the scorer audit refusing it anyway.
ALLOWED_TASKS = (
    ("chain_sum", CHAIN_SUM, "compact"),
    ("chain_sum", CHAIN_SUM, "question"),
    ("spiral_matrix", "{}", "question"),
)
REPLAY_QUOTA = 6  # digests one party may hold in the vectors' receiver (the default is 20,000)
TASK_SEED = 7
#: Admission CPU-seconds a never-seen party starts with (AdmissionConfig's default); the
#: cpu_budget vectors' receiver gives 0, so the first envelope is refused without measuring anything.
CPU_INITIAL = 0.25

#: The built-in tiny model's character tokenizer (``swarmnode.policy.build_char_tokenizer``), stated
#: here from SPEC.md §6 and not read from the implementation, so the vectors check it: specials
#: first, then one id per character of the alphabet; every other character is <unk>.
BUILTIN_SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
BUILTIN_ALPHABET = "0123456789+-*/=(). "
BUILTIN_EOS = 2
#: The rendering vectors' receiver generates at most this many tokens (the node's default).
MAX_NEW_TOKENS = 8
RENDERING = {"tokenizer": "builtin", "max_new_tokens": MAX_NEW_TOKENS}

#: Conformance-test switch of the boundary vectors (SPEC.md §6): score this family with upstream's
#: eval-ing scorer *inside* the sandbox, so the boundary itself is what the vectors test.
BINARY_MATRIX = ("binary_matrix", "{}", "question")
SANDBOX = {
    "allowed_tasks": [list(BINARY_MATRIX)],
    "sandbox_upstream": [BINARY_MATRIX[0]],
    "completion_cpu_s": 0.5,
    "batch_cpu_s": 2.0,
}
#: Delivering transport peers of the sequences (opaque ids, as a libp2p id would be).
VIA_A, VIA_B = "transport-peer-a", "transport-peer-b"


def _key(name: str) -> NodeIdentity:
    # Test-only keys: their seeds are published in the manifest.
    return NodeIdentity.from_seed(hashlib.sha256(f"swarmnode test vector key {name}".encode()).digest())


KEYS = {name: _key(name) for name in ("sender", "other", "publisher", "worker")}


@dataclass
class VectorSet:
    """Files to write and the manifest describing them."""

    files: dict[str, bytes] = field(default_factory=dict)
    vectors: list[dict[str, Any]] = field(default_factory=list)
    sequences: list[dict[str, Any]] = field(default_factory=list)
    synthetic: list[dict[str, Any]] = field(default_factory=list)
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add(
        self,
        name: str,
        data: bytes,
        description: str,
        reason: str | None = None,
        *,
        context: dict[str, Any] | None = None,
        **extra: Any,
    ) -> None:
        """One vector; ``context``: fields replacing the manifest's context for this vector only."""
        file = f"{name}.bin"
        if file in self.files:
            raise ValueError(f"duplicate vector name {name}")
        self.files[file] = data
        entry: dict[str, Any] = {
            "file": file,
            "description": description,
            "expect": "accepted" if reason is None else "rejected",
        }
        if reason is not None:
            entry["reason"] = reason
        if context is not None:
            _check_overrides(context)
            entry["context"] = context
        entry.update(extra)
        self.vectors.append(entry)

    def sequence(
        self,
        description: str,
        files: list[str],
        expect: list[dict[str, str]],
        *,
        via: Sequence[str | None] | None = None,
        context: dict[str, Any] | None = None,
    ) -> None:
        """Files fed in order to one receiver; ``via[i]``: the transport peer that delivered file i."""
        if len(expect) != len(files) or (via is not None and len(via) != len(files)):
            raise ValueError(f"sequence {description!r}: files, expect and via differ in length")
        entry: dict[str, Any] = {"description": description, "files": files, "expect": expect}
        if via is not None:
            entry["via"] = list(via)
        if context is not None:
            _check_overrides(context)
            entry["context"] = context
        self.sequences.append(entry)


#: Fields a vector's or a sequence's own context may set besides the manifest's context fields.
#: ``sandbox_upstream`` and the boundary's limits exist only there (SPEC.md §6).
OVERRIDE_ONLY = ("sandbox_upstream", "completion_cpu_s", "batch_cpu_s")


def _check_overrides(overrides: dict[str, Any]) -> None:
    unknown = set(overrides) - set(context()) - set(OVERRIDE_ONLY)
    if unknown:
        raise ValueError(f"context overrides name unknown fields {sorted(unknown)}")


def context() -> dict[str, Any]:
    """The receiver's state every vector is judged in (one fresh receiver per vector)."""
    return {
        "now": NOW,
        "max_age_s": MAX_AGE_S,
        "max_future_s": MAX_FUTURE_S,
        "max_policy_lag": MAX_POLICY_LAG,
        "policy_versions": {MODEL_ID: CURRENT_VERSION},
        "allowed_tasks": [list(t) for t in ALLOWED_TASKS],
        "local_peer_id": KEYS["worker"].peer_id,
        "trusted_publishers": None,
        "allowlist": None,
        "replay_quota": REPLAY_QUOTA,
        "cpu_initial": CPU_INITIAL,
        "tokenizer": None,
        "max_new_tokens": None,
        "system_prompt_sha256": "",  # hex; empty: the receiver asks bare questions (SPEC.md 1.3)
    }


def builtin_token_ids(text: str, max_new_tokens: int) -> list[int] | None:
    """What the vectors' rendering receiver trains for a completion it accepts (SPEC.md §4.1, §6),
    computed from the tokenizer's definition; None if it refuses the completion."""
    ids: list[int] = []
    i = 0
    while i < len(text):
        special = next((k for k, s in enumerate(BUILTIN_SPECIALS) if text.startswith(s, i)), None)
        if special is not None:
            ids.append(special)
            i += len(BUILTIN_SPECIALS[special])
            continue
        char = text[i]
        ids.append(len(BUILTIN_SPECIALS) + BUILTIN_ALPHABET.index(char) if char in BUILTIN_ALPHABET else 3)
        i += 1
    if BUILTIN_EOS in ids:
        ids = ids[: ids.index(BUILTIN_EOS)]
    if len(ids) > max_new_tokens or any(t < len(BUILTIN_SPECIALS) for t in ids):
        return None
    return ids if len(ids) == max_new_tokens else [*ids, BUILTIN_EOS]


def builtin_decode(ids: list[int]) -> str:
    """The text of trained ids: the characters before the first EOS, special tokens dropped."""
    if BUILTIN_EOS in ids:
        ids = ids[: ids.index(BUILTIN_EOS)]
    n = len(BUILTIN_SPECIALS)
    return "".join(BUILTIN_ALPHABET[t - n] for t in ids if t >= n)


def vector_task(index: int, prompt_format: str = "compact") -> Task:
    return regenerate(TaskId("chain_sum", CHAIN_SUM, TASK_SEED, index, prompt_format))


def vector_group(
    task: Task, answers: list[str], *, claimed: list[float] | None = None, **changes: Any
) -> RolloutGroup:
    claimed = claimed if claimed is not None else [score_completion(task, a) for a in answers]
    group = RolloutGroup(
        task=task.id,
        prompt=task.prompt,
        completions=tuple(
            Completion(
                text=a, token_count=len(a) + 1, mean_logprob=-0.25 * (i + 1), claimed_reward_informational=c
            )
            for i, (a, c) in enumerate(zip(answers, claimed, strict=True))
        ),
        model_id=MODEL_ID,
        policy_version=CURRENT_VERSION - 1,
        round=42,
        batch_reward_mean=0.5,
    )
    return replace(group, **changes)


def _envelope(
    message: Message, *, signer: str = "sender", sent_at_ms: int = SENT_AT_MS, **changes: Any
) -> Envelope:
    return replace(seal(KEYS[signer], message, sent_at_ms), **changes)


def _raw_group(group: RolloutGroup) -> pb.RolloutGroup:
    """A group as protobuf (no validation), so vectors can carry values our encoder refuses."""
    return _group_to(group)


def _signed_raw(kind: Kind, payload: bytes, *, signer: str = "sender", sent_at_ms: int = SENT_AT_MS) -> bytes:
    return encode_envelope(seal_payload(KEYS[signer], kind, payload, sent_at_ms))


def _raw_envelope(**fields: Any) -> bytes:
    return pb.Envelope(**fields).SerializeToString(deterministic=True)


def _record_task(vs: VectorSet, task: Task) -> None:
    vs.tasks[task.id.key()] = {
        "dataset": task.id.dataset,
        "config": task.id.config,
        "seed": task.id.seed,
        "index": task.id.index,
        "prompt_format": task.id.prompt_format,
        "prompt": task.prompt,
        "answer": task.entry["answer"],
    }


def _rewards(batch: RolloutBatch) -> list[list[float]]:
    return [[score_completion(regenerate(g.task), c.text) for c in g.completions] for g in batch.groups]


def _adapter_manifest_body() -> WeightManifestBody:
    blob = bytes(range(256)) * 2  # a rank-2 adapter of a 32 x 32 weight, as 512 bytes of F32
    return WeightManifestBody(
        model_id=MODEL_ID,
        version=CURRENT_VERSION,
        tensors=(
            TensorEntry("layers.0.q_proj.lora_A.weight", "F32", (2, 32), 0, 256),
            TensorEntry("layers.0.q_proj.lora_B.weight", "F32", (32, 2), 256, 256),
        ),
        chunk_size=1024,
        chunk_hashes=(hashlib.sha256(blob).digest(),),
        total_bytes=len(blob),
        base_hash=hashlib.sha256(b"base").digest(),
        adapter_scale=2.0,
    )


def _manifest_body() -> WeightManifestBody:
    blob = bytes(range(256)) * 12  # 3,072 bytes of "weights"
    chunk = 1024
    return WeightManifestBody(
        model_id=MODEL_ID,
        version=CURRENT_VERSION,
        tensors=(
            TensorEntry("embed.weight", "F32", (16, 32), 0, 2048),
            TensorEntry("norm.weight", "F32", (256,), 2048, 1024),
        ),
        chunk_size=chunk,
        chunk_hashes=tuple(hashlib.sha256(blob[i : i + chunk]).digest() for i in range(0, len(blob), chunk)),
        total_bytes=len(blob),
    )


def build() -> VectorSet:
    vs = VectorSet()
    sender = KEYS["sender"]
    tasks = [vector_task(i) for i in range(3)]
    question = vector_task(3, "question")
    for task in (*tasks, question):
        _record_task(vs, task)
    right = [t.entry["answer"] for t in tasks]

    # ---------------------------------------------------------------- valid
    batch = RolloutBatch(
        groups=(
            vector_group(tasks[0], [right[0], "5", right[0], "60"]),
            vector_group(tasks[1], ["84", "83", "<answer>84</answer>", "8"]),
        )
    )
    valid_batch = _envelope(batch)
    vs.add(
        "rollout_batch",
        encode_envelope(valid_batch),
        "two chain_sum groups, compact prompts",
        kind="rollout_batch",
        sender=sender.peer_id,
        rewards=_rewards(batch),
    )
    lying = RolloutBatch(groups=(vector_group(tasks[2], ["1", "2", "3"], claimed=[1.0, 1.0, 1.0]),))
    vs.add(
        "rollout_batch_claimed_rewards_ignored",
        encode_envelope(_envelope(lying)),
        "every completion wrong, every claimed reward 1.0: accepted, local rewards all 0",
        kind="rollout_batch",
        sender=sender.peer_id,
        rewards=_rewards(lying),
    )
    q_batch = RolloutBatch(groups=(vector_group(question, [question.entry["answer"], "12"]),))
    vs.add(
        "rollout_batch_question_prompt",
        encode_envelope(_envelope(q_batch)),
        "prompt_format question: the full generator text is the prompt",
        kind="rollout_batch",
        sender=sender.peer_id,
        rewards=_rewards(q_batch),
    )
    record = PeerRecord(
        peer_id=sender.peer_id,
        libp2p_peer_id="12D3KooWQYhTNQdmr3ArTeUHRYzFg94BKyTkoWBDWez9kSCVe2Xo",
        addresses=("203.0.113.7:31337",),
        roles=(Role.TRAINER, Role.WORKER),
        model_family="llama",
        model_id=MODEL_ID,
        capabilities=Capabilities(
            rollout_rate=120.5, price=0.0, hardware="cpu:2", software_version="swarmnode/0.1.0"
        ),
    )
    vs.add(
        "peer_record",
        encode_envelope(_envelope(record)),
        "a peer describing itself",
        kind="peer_record",
        sender=sender.peer_id,
    )
    announce = Announce(round=42, rollout_digests=(valid_batch.envelope_id(),), manifest_digests=())
    vs.add(
        "announce",
        encode_envelope(_envelope(announce)),
        "offers the valid rollout batch by envelope id",
        kind="announce",
        sender=sender.peer_id,
    )
    manifest = sign_manifest(KEYS["publisher"], _manifest_body())
    manifest_envelope = _envelope(manifest)
    vs.add(
        "weight_manifest",
        encode_envelope(manifest_envelope),
        "manifest signed by 'publisher', relayed in an envelope signed by 'sender'",
        kind="weight_manifest",
        sender=sender.peer_id,
    )
    digest = manifest_envelope.envelope_id()
    vs.add(
        "chunk_request",
        encode_envelope(_envelope(ChunkRequest(digest, 1, 0, 1024))),
        "asks for chunk 1 of the manifest",
        kind="chunk_request",
        sender=sender.peer_id,
    )
    vs.add(
        "chunk_data",
        encode_envelope(_envelope(ChunkData(digest, 1, 0, (bytes(range(256)) * 12)[1024:2048]))),
        "serves chunk 1",
        kind="chunk_data",
        sender=sender.peer_id,
    )
    vs.add(
        "chunk_have",
        encode_envelope(_envelope(ChunkHave(digest, (0, 1, 5)))),
        "announces verified chunks 0, 1 and 5 of the manifest",
        kind="chunk_have",
        sender=sender.peer_id,
    )
    vs.add(
        "refusal",
        encode_envelope(_envelope(Refusal("busy", "upload slots full"))),
        "refuses a request: busy",
        kind="refusal",
        sender=sender.peer_id,
    )
    worker = KEYS["worker"].peer_id
    vs.add(
        "activate",
        encode_envelope(_envelope(Activate(worker, MODEL_ID, CURRENT_VERSION, 50.0, 600))),
        "learner activates the local worker",
        kind="activate",
        sender=sender.peer_id,
    )
    vs.add(
        "activate_keyed",
        encode_envelope(
            _envelope(Activate(worker, MODEL_ID, CURRENT_VERSION, 50.0, 600, sampling_seed=bytes(range(32))))
        ),
        "learner activates the local worker with a keyed-sampling seed (SPEC.md 1.8)",
        kind="activate",
        sender=sender.peer_id,
    )
    vs.add(
        "deactivate",
        encode_envelope(_envelope(Deactivate(worker, "enough capacity"))),
        "learner deactivates the local worker",
        kind="deactivate",
        sender=sender.peer_id,
    )
    heartbeat = Heartbeat(round=42, model_id=MODEL_ID, policy_version=CURRENT_VERSION, rollout_rate=12.0)
    vs.add(
        "heartbeat",
        encode_envelope(_envelope(heartbeat)),
        "liveness",
        kind="heartbeat",
        sender=sender.peer_id,
    )

    future_field = encode_payload(heartbeat) + b"\xa8\x06\x07"  # field 101 (varint 7): from a newer peer
    vs.add(
        "heartbeat_with_unknown_field",
        _signed_raw(Kind.HEARTBEAT, future_field),
        "unknown payload field 101: ignored (forward compatibility), signature covers it",
        kind="heartbeat",
        sender=sender.peer_id,
    )

    # ---------------------------------------------------------------- size and decode
    vs.add("empty", b"", "zero bytes: parses as version 0", "unsupported_version")
    vs.add("garbage", b"\xff" * 64, "not protobuf at all", "malformed")
    vs.add("truncated", encode_envelope(valid_batch)[:-10], "valid envelope cut short", "malformed")
    vs.add(
        "version_2",
        _raw_envelope(
            version=2,
            kind=Kind.HEARTBEAT,
            sender_key=sender.public_key,
            sent_at_ms=SENT_AT_MS,
            payload=encode_payload(heartbeat),
            signature=bytes(64),
        ),
        "protocol version 2",
        "unsupported_version",
    )
    vs.add(
        "unknown_kind",
        _raw_envelope(
            version=1,
            kind=42,
            sender_key=sender.public_key,
            sent_at_ms=SENT_AT_MS,
            payload=b"",
            signature=bytes(64),
        ),
        "kind 42 is not defined in v1",
        "unknown_kind",
    )
    vs.add(
        "short_sender_key",
        encode_envelope(replace(_envelope(heartbeat), sender_key=sender.public_key[:31])),
        "31-byte sender key",
        "malformed",
    )
    vs.add(
        "short_signature",
        encode_envelope(replace(_envelope(heartbeat), signature=bytes(63))),
        "63-byte signature",
        "malformed",
    )
    hb_bytes = encode_envelope(_envelope(heartbeat))
    # Unknown varint fields 20..39, value 0, three bytes each (two-byte tag, one-byte value).
    unknown = b"".join(bytes([(n << 3) & 0x7F | 0x80, n >> 4, 0]) for n in range(20, 40))
    vs.add(
        "envelope_with_unknown_field",
        hb_bytes + unknown[:3],
        "valid heartbeat envelope plus one unknown top-level field (7 fields): ignored",
        kind="heartbeat",
        sender=sender.peer_id,
    )
    vs.add(
        "envelope_with_17_fields",
        hb_bytes + unknown[:33],
        "valid heartbeat envelope plus 11 unknown fields (17 > 16): refused before parsing",
        "malformed",
    )
    # Field 20, length-delimited (tag 0xa2 0x01), 1,100 bytes (length varint 0xcc 0x08).
    padding = b"\xa2\x01\xcc\x08" + bytes(1100)
    vs.add(
        "envelope_padded_beyond_its_fields",
        hb_bytes + padding,
        "valid heartbeat envelope plus an unknown field of 1,100 bytes (> 1,024 beyond its fields): "
        "the envelope id does not cover it, so it could pad an honest envelope to 2 MiB",
        "malformed",
    )
    vs.add(
        "envelope_with_group_field",
        hb_bytes + b"\xa3\x01\xa4\x01",  # field 20 as an (empty) group: start 0xa3 0x01, end 0xa4 0x01
        "valid heartbeat envelope plus a group-encoded field: refused before parsing",
        "malformed",
    )
    vs.add(
        "heartbeat_payload_over_cap",
        _signed_raw(
            Kind.HEARTBEAT,
            pb.Heartbeat(round=1, model_id="m" * MAX_PAYLOAD_BYTES[Kind.HEARTBEAT]).SerializeToString(),
        ),
        "heartbeat payload over its 1 KiB cap (checked before the signature)",
        "too_large",
    )
    vs.synthetic.append(
        {
            "name": "oversized",
            "bytes": {"fill": 0, "length": limits.MAX_ENVELOPE_BYTES + 1},
            "description": "one byte over the envelope cap: refused before parsing",
            "expect": "rejected",
            "reason": "too_large",
        }
    )

    # ---------------------------------------------------------------- signature
    tampered = bytearray(valid_batch.payload)
    tampered[-3] ^= 0x01
    vs.add(
        "tampered_payload",
        encode_envelope(replace(valid_batch, payload=bytes(tampered))),
        "one payload bit flipped after signing",
        "bad_signature",
    )
    vs.add(
        "tampered_sent_at",
        encode_envelope(replace(valid_batch, sent_at_ms=SENT_AT_MS + 1)),
        "sent_at changed after signing",
        "bad_signature",
    )
    hb = _envelope(heartbeat)
    vs.add(
        "kind_swapped",
        encode_envelope(replace(hb, kind=Kind.ANNOUNCE)),
        "heartbeat signature presented as an announce: domain separation",
        "bad_signature",
    )
    vs.add(
        "wrong_key",
        encode_envelope(replace(_envelope(heartbeat, signer="other"), sender_key=sender.public_key)),
        "signed by 'other', claims 'sender'",
        "bad_signature",
    )
    vs.add(
        "zero_signature",
        encode_envelope(replace(hb, signature=bytes(64))),
        "all-zero signature",
        "bad_signature",
    )
    # Malleated signature: S + L verifies under a lax check; RFC 8032 requires S < L.
    ed25519_order = 2**252 + 27742317777372353535851937790883648493
    s_value = int.from_bytes(hb.signature[32:], "little") + ed25519_order
    vs.add(
        "signature_s_plus_l",
        encode_envelope(replace(hb, signature=hb.signature[:32] + s_value.to_bytes(32, "little"))),
        "valid signature with S replaced by S + L (non-canonical, malleated)",
        "bad_signature",
    )
    vs.add(
        "zero_key",
        encode_envelope(replace(hb, sender_key=bytes(32))),
        "all-zero (small-order) key",
        "bad_signature",
    )

    # ---------------------------------------------------------------- payload (validly signed)
    vs.add(
        "signed_garbage_payload",
        _signed_raw(Kind.ROLLOUT_BATCH, b"\xff" * 32),
        "valid signature over bytes that are not a RolloutBatch",
        "invalid_payload",
    )
    vs.add("empty_batch", _signed_raw(Kind.ROLLOUT_BATCH, b""), "a batch with no groups", "invalid_payload")
    g0 = vector_group(tasks[0], [right[0]])

    def raw_batch(*groups: pb.RolloutGroup) -> bytes:
        return _signed_raw(Kind.ROLLOUT_BATCH, pb.RolloutBatch(groups=list(groups)).SerializeToString())

    many = _raw_group(g0)
    del many.completions[:]
    many.completions.extend(pb.Completion(text="6", token_count=2, mean_logprob=-0.1) for _ in range(65))
    vs.add("too_many_completions", raw_batch(many), "65 completions in a group (limit 64)", "limit_exceeded")
    long_text = _raw_group(g0)
    long_text.completions[0].text = "9" * (limits.MAX_COMPLETION_BYTES + 1)
    # Named for the wire limit, not "completion_too_long": that reason is the receiver's own
    # max_new_tokens (step 9, vector completion_over_max_new_tokens).
    vs.add(
        "completion_text_over_limit",
        raw_batch(long_text),
        "completion text of 8,193 bytes (limit 8,192)",
        "limit_exceeded",
    )
    multibyte = _raw_group(g0)
    multibyte.completions[0].text = "é" * (limits.MAX_COMPLETION_BYTES // 2 + 1)
    vs.add(
        "completion_text_over_limit_utf8",
        raw_batch(multibyte),
        "4,097 characters but 8,194 UTF-8 bytes: limits count bytes",
        "limit_exceeded",
    )
    bad_utf8 = _raw_group(g0)
    bad_utf8.completions[0].text = "QQQQ"
    bad_utf8_payload = (
        pb.RolloutBatch(groups=[bad_utf8]).SerializeToString().replace(b"QQQQ", b"\xff\xfe\xfd\xfc")
    )
    vs.add(
        "invalid_utf8_completion",
        _signed_raw(Kind.ROLLOUT_BATCH, bad_utf8_payload),
        "completion text that is not UTF-8 (proto3 strings must be)",
        "invalid_payload",
    )
    tokens = _raw_group(g0)
    tokens.completions[0].token_count = limits.MAX_COMPLETION_TOKENS + 1
    vs.add("token_count_over_limit", raw_batch(tokens), "token_count 8,193 (limit 8,192)", "limit_exceeded")
    positive = _raw_group(g0)
    positive.completions[0].mean_logprob = 0.5
    vs.add("positive_logprob", raw_batch(positive), "mean log-prob 0.5 > 0", "invalid_payload")
    nan = _raw_group(g0)
    nan.completions[0].mean_logprob = math.nan
    vs.add("nan_logprob", raw_batch(nan), "mean log-prob NaN", "invalid_payload")
    reward_mean = _raw_group(g0)
    reward_mean.batch_reward_mean = 1.5
    vs.add(
        "batch_reward_mean_out_of_range", raw_batch(reward_mean), "batch reward mean 1.5", "invalid_payload"
    )
    short_id = _raw_group(g0)
    short_id.system_prompt_sha256 = b"\x01" * 31
    vs.add(
        "system_prompt_sha256_31_bytes",
        raw_batch(short_id),
        "system_prompt_sha256 of 31 bytes (empty or 32)",
        "invalid_payload",
    )
    no_task = _raw_group(g0)
    no_task.ClearField("task")
    vs.add("missing_task", raw_batch(no_task), "group without a task id", "invalid_payload")
    big_index = _raw_group(g0)
    big_index.task.index = limits.MAX_TASK_INDEX + 1
    vs.add("task_index_over_limit", raw_batch(big_index), "task index 1e9", "limit_exceeded")
    vs.add(
        "heartbeat_as_rollout_batch",
        _signed_raw(Kind.ROLLOUT_BATCH, encode_payload(heartbeat)),
        "a valid Heartbeat payload signed as a rollout batch",
        "invalid_payload",
    )
    vs.add(
        "peer_record_for_someone_else",
        encode_envelope(_envelope(replace(record, peer_id=KEYS["other"].peer_id))),
        "'sender' signs a peer record naming 'other'",
        "sender_mismatch",
    )
    bad_manifest = WeightManifest(manifest.body, manifest.body_bytes, manifest.publisher_key, bytes(64))
    vs.add(
        "manifest_bad_publisher_signature",
        _signed_raw(
            Kind.WEIGHT_MANIFEST,
            pb.WeightManifest(
                body=bad_manifest.body_bytes,
                publisher_key=bad_manifest.publisher_key,
                signature=bad_manifest.signature,
            ).SerializeToString(),
        ),
        "relay signature fine, publisher signature zeroed",
        "bad_manifest_signature",
    )
    adapter = sign_manifest(KEYS["publisher"], _adapter_manifest_body())
    vs.add(
        "weight_manifest_adapter",
        encode_envelope(_envelope(adapter)),
        "a LoRA adapter version (SPEC 1.5): base_hash = SHA-256 of b'base', adapter_scale 2.0",
        kind="weight_manifest",
        sender=sender.peer_id,
    )
    for name, base_hash, scale, what in [
        ("manifest_adapter_scale_without_base", b"", 2.0, "adapter_scale 2.0 without base_hash"),
        ("manifest_adapter_base_hash_31_bytes", bytes(31), 2.0, "a 31-byte base_hash"),
        (
            "manifest_adapter_scale_zero",
            hashlib.sha256(b"base").digest(),
            0.0,
            "base_hash with adapter_scale 0",
        ),
    ]:
        body = pb.WeightManifestBody()
        body.ParseFromString(adapter.body_bytes)
        body.base_hash, body.adapter_scale = base_hash, scale
        vs.add(
            name,
            _signed_raw(
                Kind.WEIGHT_MANIFEST,
                pb.WeightManifest(
                    body=body.SerializeToString(deterministic=True),
                    publisher_key=adapter.publisher_key,
                    signature=bytes(64),
                ).SerializeToString(),
            ),
            f"manifest body with {what}",
            "invalid_payload",
        )
    vs.add(
        "activate_seed_31_bytes",
        _signed_raw(
            Kind.ACTIVATE,
            pb.Activate(
                worker_peer_id=worker,
                model_id=MODEL_ID,
                policy_version=CURRENT_VERSION,
                target_rate=50.0,
                lease_seconds=600,
                sampling_seed=bytes(31),
            ).SerializeToString(deterministic=True),
        ),
        "an activation whose sampling seed is 31 bytes (must be empty or 32)",
        "invalid_payload",
    )
    vs.add(
        "activate_other_worker",
        encode_envelope(_envelope(Activate(KEYS["other"].peer_id, MODEL_ID, CURRENT_VERSION, 50.0, 600))),
        "activation addressed to another worker",
        "wrong_recipient",
    )

    # ---------------------------------------------------------------- freshness
    vs.add(
        "too_old",
        encode_envelope(_envelope(heartbeat, sent_at_ms=int((NOW - MAX_AGE_S - 1) * 1000))),
        "sent 301 s before now (window 300 s)",
        "too_old",
    )
    vs.add(
        "from_future",
        encode_envelope(_envelope(heartbeat, sent_at_ms=int((NOW + MAX_FUTURE_S + 1) * 1000))),
        "sent 31 s after now (skew allowed 30 s)",
        "from_future",
    )
    stale = RolloutBatch(
        groups=(vector_group(tasks[0], [right[0]], policy_version=CURRENT_VERSION - MAX_POLICY_LAG - 1),)
    )
    vs.add(
        "stale_policy",
        encode_envelope(_envelope(stale)),
        "policy version 1 when 10 is current (lag 8)",
        "stale_policy",
    )
    ahead = RolloutBatch(groups=(vector_group(tasks[0], [right[0]], policy_version=CURRENT_VERSION + 1),))
    vs.add(
        "policy_ahead",
        encode_envelope(_envelope(ahead)),
        "policy version 11 when 10 is current",
        "stale_policy",
    )

    # ---------------------------------------------------------------- re-derivation
    other_family = regenerate(TaskId("basic_arithmetic", "{}", TASK_SEED, 0, "question"))
    _record_task(vs, other_family)
    not_ours = RolloutBatch(groups=(vector_group(other_family, ["-129"]),))
    vs.add(
        "task_not_allowed",
        encode_envelope(_envelope(not_ours)),
        "basic_arithmetic: not a family we train on",
        "task_not_allowed",
    )
    unsafe_family = regenerate(TaskId("spiral_matrix", "{}", TASK_SEED, 0, "question"))
    _record_task(vs, unsafe_family)
    vs.add(
        "unsafe_scorer_family",
        encode_envelope(
            _envelope(RolloutBatch(groups=(vector_group(unsafe_family, ["[1, 2]"], claimed=[1.0]),)))
        ),
        "spiral_matrix: listed as allowed, but its upstream scorer eval()s the answer (the audit refuses it)",
        "task_not_allowed",
    )
    chat_id = system_prompt_id(DEFAULT_SYSTEM_PROMPT)
    chat = encode_envelope(
        _envelope(RolloutBatch(groups=(vector_group(tasks[0], [right[0]], system_prompt_sha256=chat_id),)))
    )
    vs.add(
        "chat_group_at_a_bare_receiver",
        chat,
        "a group of chat prompts (the default system prompt's id) at a receiver that asks bare questions",
        "system_prompt_mismatch",
    )
    # Bytes of its own (signed 1 ms earlier): ``protocol check --context`` finds a vector's own
    # context by the file's bytes, so bytes shared with chat_group_at_a_bare_receiver judged that
    # file at a chat receiver (accepted) instead of at the manifest's bare one (red team).
    chat_at_chat = encode_envelope(
        _envelope(
            RolloutBatch(groups=(vector_group(tasks[0], [right[0]], system_prompt_sha256=chat_id),)),
            sent_at_ms=SENT_AT_MS - 1,
        )
    )
    vs.add(
        "chat_group_at_a_chat_receiver",
        chat_at_chat,
        "the same group at a receiver whose chat prompts carry the same system prompt",
        context={"system_prompt_sha256": chat_id.hex()},
        kind="rollout_batch",
        sender=KEYS["sender"].peer_id,
        rewards=[[1.0]],
    )
    vs.add(
        "bare_group_at_a_chat_receiver",
        encode_envelope(_envelope(RolloutBatch(groups=(vector_group(tasks[0], [right[0]]),)))),
        "a group of bare prompts at a receiver that asks with the default system prompt",
        "system_prompt_mismatch",
        context={"system_prompt_sha256": chat_id.hex()},
    )
    mismatch = RolloutBatch(groups=(vector_group(tasks[1], ["2"], prompt="1+1="),))
    vs.add(
        "prompt_mismatch",
        encode_envelope(_envelope(mismatch)),
        "prompt '1+1=' for a task that regenerates '58+26='",
        "prompt_mismatch",
    )
    # Step 8 runs group by group (SPEC.md §4): who is charged depends on which failure comes first.
    forged_then_other = RolloutBatch(
        groups=(
            vector_group(tasks[1], ["2"], prompt="1+1="),
            vector_group(tasks[2], [right[2]], system_prompt_sha256=chat_id),
        )
    )
    vs.add(
        "forged_prompt_then_other_system_prompt",
        encode_envelope(_envelope(forged_then_other)),
        "groups[0] forges its prompt, groups[1] names another system prompt: the first group decides",
        "prompt_mismatch",
    )
    other_then_forged = RolloutBatch(groups=tuple(reversed(forged_then_other.groups)))
    vs.add(
        "other_system_prompt_then_forged_prompt",
        encode_envelope(_envelope(other_then_forged)),
        "the same two groups the other way round",
        "system_prompt_mismatch",
    )
    second_bad = RolloutBatch(groups=(batch.groups[0], vector_group(tasks[1], ["2"], prompt=tasks[0].prompt)))
    vs.add(
        "second_group_bad",
        encode_envelope(_envelope(second_bad)),
        "first group fine, second group's prompt wrong: the whole envelope is refused",
        "prompt_mismatch",
    )

    _rescoring_vectors(vs, tasks[1])

    # ---------------------------------------------------------------- sender: CPU budget
    no_cpu = {"cpu_initial": 0.0}
    vs.add(
        "cpu_budget_spent",
        encode_envelope(_envelope(batch, sent_at_ms=SENT_AT_MS - 500)),
        "a valid batch to a receiver where a party never seen before starts with 0 CPU-seconds: "
        "refused at step 4 without measuring any CPU time",
        "cpu_budget",
        context=no_cpu,
    )
    vs.sequence(
        "the delivering peer's CPU budget is checked at step 0, before the bytes are even parsed",
        ["garbage.bin"],
        [{"expect": "rejected", "reason": "cpu_budget"}],
        via=[VIA_A],
        context=no_cpu,
    )

    # ---------------------------------------------------------------- replay / duplicate
    twice = RolloutBatch(groups=(batch.groups[0], batch.groups[0]))
    vs.add(
        "duplicate_group_in_batch",
        encode_envelope(_envelope(twice)),
        "the same group twice in one batch",
        "duplicate",
    )
    resent = _envelope(batch, sent_at_ms=SENT_AT_MS + 500)
    vs.add(
        "rollout_batch_resent",
        encode_envelope(resent),
        "the valid batch's groups signed again with a new sent_at (valid on its own)",
        kind="rollout_batch",
        sender=sender.peer_id,
        rewards=_rewards(batch),
    )
    vs.sequences.append(
        {
            "description": "the same envelope twice: the second is a replay",
            "files": ["rollout_batch.bin", "rollout_batch.bin"],
            "expect": [{"expect": "accepted"}, {"expect": "rejected", "reason": "replay"}],
        }
    )
    vs.sequences.append(
        {
            "description": "the same groups in a new envelope: a duplicate",
            "files": ["rollout_batch.bin", "rollout_batch_resent.bin"],
            "expect": [{"expect": "accepted"}, {"expect": "rejected", "reason": "duplicate"}],
        }
    )
    vs.sequences.append(
        {
            "description": "a replay is caught with other messages in between",
            "files": ["heartbeat.bin", "peer_record.bin", "heartbeat.bin"],
            "expect": [
                {"expect": "accepted"},
                {"expect": "accepted"},
                {"expect": "rejected", "reason": "replay"},
            ],
        }
    )
    quota_files = []
    for k in range(REPLAY_QUOTA + 1):
        name = f"heartbeat_quota_{k}"
        beat = Heartbeat(round=100 + k, model_id=MODEL_ID, policy_version=CURRENT_VERSION, rollout_rate=1.0)
        vs.add(name, encode_envelope(_envelope(beat)), f"heartbeat {k} of the replay-quota sequence")
        vs.vectors[-1].update(kind="heartbeat", sender=sender.peer_id)
        quota_files.append(f"{name}.bin")
    vs.sequences.append(
        {
            "description": f"one signer holds at most replay_quota ({REPLAY_QUOTA}) live digests",
            "files": quota_files,
            "expect": [{"expect": "accepted"}] * REPLAY_QUOTA
            + [{"expect": "rejected", "reason": "replay_quota_signer"}],
        }
    )
    # Two signers through one transport peer: the peer reaches its quota while neither signer does
    # (each holds half); the refused envelope, delivered by another peer, is accepted.
    half = REPLAY_QUOTA // 2
    other_files = []
    for k in range(half):
        name = f"heartbeat_other_quota_{k}"
        beat = Heartbeat(round=200 + k, model_id=MODEL_ID, policy_version=CURRENT_VERSION, rollout_rate=1.0)
        vs.add(
            name,
            encode_envelope(_envelope(beat, signer="other")),
            f"heartbeat {k} of 'other' in the delivering-peer quota sequence",
            kind="heartbeat",
            sender=KEYS["other"].peer_id,
        )
        other_files.append(f"{name}.bin")
    via_files = [f for pair in zip(quota_files[:half], other_files, strict=True) for f in pair]
    vs.sequence(
        f"one delivering peer holds at most replay_quota ({REPLAY_QUOTA}) live digests, whoever signed them",
        [*via_files, quota_files[half], quota_files[half]],
        [{"expect": "accepted"}] * REPLAY_QUOTA
        + [{"expect": "rejected", "reason": "replay_quota_via"}, {"expect": "accepted"}],
        via=[VIA_A] * (REPLAY_QUOTA + 1) + [VIA_B],
    )
    return vs


def _rescoring_vectors(vs: VectorSet, task: Task) -> None:
    """Step 9 under a receiver that renders completions with the built-in tokenizer, and the
    verification boundary with upstream's unsafe scorer inside it (SPEC.md §4.1, §6)."""
    right = task.entry["answer"]
    assert right == "84" and task.prompt == "58+26="  # the texts below are written for this task
    texts = [
        right,
        right + ".00000",  # exactly max_new_tokens: trained without an EOS, as the receiver's own
        right + "<eos>" + "0" * 10,  # cut at the spelled EOS: the tail is never trained
        "85<eos><answer>84</answer>",  # as received it scores 1; as trained ("85") it scores 0
    ]
    trained = [builtin_token_ids(t, MAX_NEW_TOKENS) for t in texts]
    assert all(ids is not None for ids in trained)
    rendered = RolloutBatch(groups=(vector_group(task, texts),))
    trained_texts = [builtin_decode(ids) for ids in trained if ids is not None]
    vs.add(
        "completion_within_max_new_tokens",
        encode_envelope(_envelope(rendered)),
        "receiver with the built-in tokenizer and max_new_tokens 8: completions are scored as trained "
        "(cut at a spelled <eos>; 8 tokens exactly fill the cap)",
        context=RENDERING,
        kind="rollout_batch",
        sender=KEYS["sender"].peer_id,
        rewards=[[score_completion(task, t) for t in trained_texts]],
        trained_texts=[trained_texts],
        trained_token_ids=[trained],
    )
    refused = {
        "completion_over_max_new_tokens": (
            right + ".000000",
            "9 tokens under the built-in tokenizer; the receiver generates at most 8",
            "completion_too_long",
        ),
        "completion_spells_special_token": (
            "8<pad>4",
            "spells <pad>: a special token other than <eos> in the ids",
            "completion_untrainable",
        ),
        "completion_outside_tokenizer": (
            right + "\n",
            "a newline: not in the built-in alphabet, so <unk>",
            "completion_untrainable",
        ),
    }
    for name, (text, why, reason) in refused.items():
        assert builtin_token_ids(text, MAX_NEW_TOKENS) is None
        vs.add(
            name,
            encode_envelope(_envelope(RolloutBatch(groups=(vector_group(task, [right, text]),)))),
            f"second completion {text!r}: {why}",
            reason,
            context=RENDERING,
        )

    family = regenerate(TaskId(BINARY_MATRIX[0], BINARY_MATRIX[1], TASK_SEED, 0, BINARY_MATRIX[2]))
    _record_task(vs, family)
    attacks = {
        "scorer_raises_system_exit": (
            "<answer>exit(3)</answer>",
            "upstream's binary_matrix scorer eval()s it: SystemExit inside the sandboxed worker",
            "verifier_failed",
        ),
        "scorer_exceeds_cpu_limit": (
            "<answer>9**9**9</answer>",
            "upstream's binary_matrix scorer eval()s it: one C call that never returns, "
            "killed at completion_cpu_s",
            "verifier_timeout",
        ),
    }
    for name, (text, why, reason) in attacks.items():
        vs.add(
            name,
            encode_envelope(_envelope(RolloutBatch(groups=(vector_group(family, [text], claimed=[1.0]),)))),
            f"{text!r} under sandbox_upstream (conformance-test switch): {why}; "
            "in the manifest's own context the family is refused (task_not_allowed)",
            reason,
            context=SANDBOX,
        )


def manifest(vs: VectorSet) -> dict[str, Any]:
    return {
        "protocol_version": limits.PROTOCOL_VERSION,
        "generated_by": "python -m swarmnode.tools.vectors --out protocol/vectors",
        "reasoning_gym_version": metadata.version("reasoning-gym"),
        "signing": {
            "prefix": "swarmnode/v1/<kind label>\\0",
            "message": "prefix || uint64_be(sent_at_ms) || payload",
            "envelope_id": "sha256(sender_key || message)",
        },
        "context": context(),
        "keys": {
            name: {
                "seed_hex": key.private_key.private_bytes_raw().hex(),
                "public_key_hex": key.public_key.hex(),
                "peer_id": key.peer_id,
            }
            for name, key in KEYS.items()
        },
        "system_prompt_ids": system_prompt_ids(),
        "tasks": vs.tasks,
        "vectors": vs.vectors,
        "synthetic": vs.synthetic,
        "sequences": vs.sequences,
    }


def system_prompt_ids() -> dict[str, Any]:
    """Known answers of ``system_prompt_id`` (SPEC.md 1.3)."""
    prompts = [DEFAULT_SYSTEM_PROMPT, "", "Answer in <answer></answer>.", "Réponds en français : ✓"]
    return {
        "rule": "SHA-256(domain || UTF-8(system_prompt))",
        "domain_hex": SYSTEM_PROMPT_DOMAIN.hex(),
        "ids": [{"system_prompt": s, "sha256_hex": system_prompt_id(s).hex()} for s in prompts],
    }


KEYED_SAMPLING = "keyed_sampling.json"


def keyed_sampling_vectors() -> dict[str, Any]:
    """The keyed sampling rule's vectors (``rollout.keyed``, SPEC.md "Keyed sampling"): uniforms for
    (seed, task key, completion, position), and the rule's token for given logits, parameters and
    uniform (float32 arithmetic throughout, as the rule states)."""
    import torch

    from swarmnode.rollout.keyed import DOMAIN, choose, distribution, keyed_uniform
    from swarmnode.rollout.types import SamplingParams

    seeds = [bytes(range(32)), bytes.fromhex("ff" * 32)]
    keys = [vector_task(0).id.key(), "chain_sum:{}:0:0:compact", "ключ"]
    uniforms = [
        {
            "seed_hex": seed.hex(),
            "key": key,
            "completion": j,
            "position": t,
            "u": keyed_uniform(seed, key, j, t),
        }
        for seed in seeds
        for key in keys
        for j, t in ((0, 0), (3, 5), (2**32 - 1, 7))
    ]
    logits = [2.0, 1.0, 0.5, -1.0, 0.0, 3.0]
    cases = []
    for temperature, top_p in ((1.0, 1.0), (0.7, 1.0), (1.0, 0.8), (1.3, 0.5)):
        params = SamplingParams(temperature=temperature, top_p=top_p)
        probs = distribution(torch.tensor([logits]), params)
        for u in (1e-9, 0.25, 0.33, 0.36, 0.38, 0.5, 1.0):
            token = int(choose(probs, torch.tensor([u], dtype=torch.float64))[0])
            cases.append(
                {"logits": logits, "temperature": temperature, "top_p": top_p, "u": u, "token": token}
            )
    return {
        "rule": "u = ((uint64_be(SHA-256(domain || seed || u32_be(len(key)) || key || u32_be(completion) "
        "|| u32_be(position))[:8]) >> 11) + 1) / 2^53; p = softmax(top_p(logits / temperature)) in "
        "float32; c = cumsum(p); token = #{i : c_i < fl32(fl32(u) * c_last)}",
        "domain_hex": DOMAIN.hex(),
        "uniforms": uniforms,
        "choices": cases,
    }


def write(out: Path) -> list[Path]:
    """Write every vector, ``manifest.json`` and ``keyed_sampling.json`` into ``out``; remove stale
    ``*.bin`` there."""
    vs = build()
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.bin"):
        if stale.name not in vs.files:
            stale.unlink()
    written = []
    for name, data in vs.files.items():
        (out / name).write_bytes(data)
        written.append(out / name)
    text = json.dumps(manifest(vs), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    (out / MANIFEST).write_text(text, encoding="utf-8")
    written.append(out / MANIFEST)
    keyed = json.dumps(keyed_sampling_vectors(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    (out / KEYED_SAMPLING).write_text(keyed, encoding="utf-8")
    written.append(out / KEYED_SAMPLING)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m swarmnode.tools.vectors", description="write test vectors"
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    files = write(args.out)
    print(f"wrote {len(files)} files to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
