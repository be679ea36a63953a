"""protocol/vectors: regenerating them changes nothing, and admission reaches every stated verdict.

Vectors whose own context sets ``sandbox_upstream`` are scored by the real verification boundary
(a ``VerifierPool`` running upstream's scorer inside its sandbox); the rest in process.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from swarmnode.admit import Accepted, AdmissionPipeline, RejectReason, Verdict
from swarmnode.tools import vectors
from swarmnode.tools.protocol_cli import (
    families_named,
    pipeline_for_context,
    vector_context,
    verifier_for_context,
)
from swarmnode.verify import GroupScorer, VerifierPool, score_in_process
from swarmnode.wire import system_prompt_id

VECTORS = Path(__file__).resolve().parents[2] / "protocol" / "vectors"
MANIFEST: dict[str, Any] = json.loads((VECTORS / vectors.MANIFEST).read_text(encoding="utf-8"))


def outcome(verdict: Verdict) -> dict[str, Any]:
    if isinstance(verdict, Accepted):
        return {"expect": "accepted"}
    return {"expect": "rejected", "reason": verdict.reason.value}


def expected(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: entry[k] for k in ("expect", "reason") if k in entry}


Receivers = Callable[[dict[str, Any], list[bytes]], AdmissionPipeline]


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receivers]:
    """A fresh receiver for a context; through a started pool when the context asks for the sandbox
    (one pool per such context and set of families, shared by the module)."""
    pools: dict[str, VerifierPool] = {}

    def make(ctx: dict[str, Any], files: list[bytes]) -> AdmissionPipeline:
        scorer: GroupScorer = score_in_process
        if "sandbox_upstream" in ctx:
            families = sorted({f for data in files for f in families_named(data)})
            key = json.dumps([ctx, families], sort_keys=True)
            if key not in pools:
                pools[key] = verifier_for_context(ctx, families)
                pools[key].start()
            scorer = pools[key].score
        return pipeline_for_context(ctx, scorer)

    yield make
    for pool in pools.values():
        pool.close()


def judge(data: bytes) -> Verdict:
    ctx = vector_context(MANIFEST)
    return pipeline_for_context(ctx).admit(data, ctx["now"])


def test_regenerating_the_vectors_gives_byte_identical_files(tmp_path: Path) -> None:
    vectors.write(tmp_path)
    fresh = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    committed = {p.name: p.read_bytes() for p in VECTORS.iterdir()}
    assert sorted(fresh) == sorted(committed)
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"stale vectors {stale}: run `python -m swarmnode.tools.vectors --out protocol/vectors`"


def test_manifest_lists_every_file_once() -> None:
    listed = [v["file"] for v in MANIFEST["vectors"]]
    assert len(listed) == len(set(listed))
    assert set(listed) == {p.name for p in VECTORS.glob("*.bin")}


def test_vectors_cover_both_verdicts_and_every_kind() -> None:
    accepted = [v for v in MANIFEST["vectors"] if v["expect"] == "accepted"]
    assert {v["kind"] for v in accepted} == {
        "peer_record",
        "rollout_batch",
        "announce",
        "weight_manifest",
        "chunk_request",
        "chunk_data",
        "chunk_have",
        "refusal",
        "activate",
        "deactivate",
        "heartbeat",
    }
    assert len(MANIFEST["vectors"]) - len(accepted) >= 30


@pytest.mark.parametrize("entry", MANIFEST["vectors"], ids=lambda e: e["file"])
def test_each_vector_gets_its_stated_verdict(entry: dict[str, Any], receiver: Receivers) -> None:
    data = (VECTORS / entry["file"]).read_bytes()
    ctx = vector_context(MANIFEST, entry)
    verdict = receiver(ctx, [data]).admit(data, ctx["now"])
    assert outcome(verdict) == expected(entry), getattr(verdict, "detail", "")
    if isinstance(verdict, Accepted):
        assert verdict.sender == entry["sender"]
        assert verdict.envelope.kind.label == entry["kind"]
        assert [list(g.rewards) for g in verdict.groups] == entry.get("rewards", [])
        if "trained_token_ids" in entry:
            assert [[list(ids) for ids in g.token_ids] for g in verdict.groups] == entry["trained_token_ids"]
            assert [list(g.texts) for g in verdict.groups] == entry["trained_texts"]


def test_claimed_rewards_do_not_reach_the_verdict() -> None:
    entry = next(v for v in MANIFEST["vectors"] if v["file"] == "rollout_batch_claimed_rewards_ignored.bin")
    verdict = judge((VECTORS / entry["file"]).read_bytes())
    assert isinstance(verdict, Accepted)
    claimed = [c.claimed_reward_informational for g in verdict.groups for c in g.group.completions]
    assert claimed == [1.0, 1.0, 1.0]
    assert [r for g in verdict.groups for r in g.rewards] == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("entry", MANIFEST["synthetic"], ids=lambda e: e["name"])
def test_each_synthetic_vector_gets_its_stated_verdict(entry: dict[str, Any]) -> None:
    data = bytes([entry["bytes"]["fill"]]) * entry["bytes"]["length"]
    assert outcome(judge(data)) == expected(entry)


@pytest.mark.parametrize("sequence", MANIFEST["sequences"], ids=lambda s: s["description"])
def test_each_sequence_gets_its_stated_verdicts_from_one_receiver(
    sequence: dict[str, Any], receiver: Receivers
) -> None:
    ctx = vector_context(MANIFEST, sequence)
    files = [(VECTORS / f).read_bytes() for f in sequence["files"]]
    one = receiver(ctx, files)
    via = sequence.get("via", [None] * len(files))
    got = [outcome(one.admit(data, ctx["now"], via=v)) for data, v in zip(files, via, strict=True)]
    assert got == [expected(e) for e in sequence["expect"]]


#: Reasons older than issue #12's rule that still have no vector; a reason added since must bring one.
WITHOUT_VECTOR = {
    "banned",
    "new_identity_limit",
    "not_allowlisted",
    "rate_limited",
    "replay_cache_full",
    "task_invalid",
    "untrusted_publisher",
}


def test_every_new_rejection_reason_has_a_vector() -> None:
    reached = {e.get("reason") for e in MANIFEST["vectors"] + MANIFEST["synthetic"]}
    reached |= {e.get("reason") for s in MANIFEST["sequences"] for e in s["expect"]}
    assert {r.value for r in RejectReason} - reached == WITHOUT_VECTOR


def test_the_manifests_own_context_refuses_what_only_a_vectors_context_allows() -> None:
    """The sandbox vectors' family is refused by the manifest's receiver; their completions reach
    the verifier only under their own (test-only) context, and that switch cannot be the manifest's."""
    for entry in MANIFEST["vectors"]:
        if "sandbox_upstream" in entry.get("context", {}):
            verdict = judge((VECTORS / entry["file"]).read_bytes())
            assert outcome(verdict) == {"expect": "rejected", "reason": "task_not_allowed"}
    with pytest.raises(ValueError, match="sandbox_upstream"):
        vector_context({"context": {**MANIFEST["context"], "sandbox_upstream": ["binary_matrix"]}})


def test_the_builtin_tokenizer_is_the_one_the_spec_states() -> None:
    """The vectors state the tokenizer from SPEC.md §6; the node's renderer must be that tokenizer."""
    from swarmnode.policy import DEFAULT_ALPHABET, build_char_tokenizer

    tokenizer = build_char_tokenizer()
    assert DEFAULT_ALPHABET == vectors.BUILTIN_ALPHABET
    assert [tokenizer.convert_tokens_to_ids(t) for t in vectors.BUILTIN_SPECIALS] == [0, 1, 2, 3]
    assert tokenizer.eos_token_id == vectors.BUILTIN_EOS


def test_task_table_matches_regeneration() -> None:
    from swarmnode.tasks import TaskId, regenerate

    for key, task in MANIFEST["tasks"].items():
        tid = TaskId(task["dataset"], task["config"], task["seed"], task["index"], task["prompt_format"])
        assert tid.key() == key
        assert regenerate(tid).prompt == task["prompt"]


def test_system_prompt_ids_are_the_manifests_known_answers() -> None:
    ids = MANIFEST["system_prompt_ids"]
    assert bytes.fromhex(ids["domain_hex"]) == b"swarmnode/system-prompt/v1\x00"
    for case in ids["ids"]:
        assert system_prompt_id(case["system_prompt"]).hex() == case["sha256_hex"]
    assert len({case["sha256_hex"] for case in ids["ids"]}) == len(ids["ids"])


def test_a_vector_with_its_own_context_shares_its_bytes_with_no_other_vector() -> None:
    """``protocol check --context`` picks a vector's own context by the file's bytes (SPEC.md §6):
    two vectors with the same bytes would judge one of them in the other's context."""
    by_bytes: dict[bytes, list[str]] = {}
    for entry in MANIFEST["vectors"]:
        by_bytes.setdefault((VECTORS / entry["file"]).read_bytes(), []).append(entry["file"])
    own = {entry["file"] for entry in MANIFEST["vectors"] if "context" in entry}
    shared = [files for files in by_bytes.values() if len(files) > 1 and own & set(files)]
    assert not shared, shared
