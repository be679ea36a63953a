"""protocol/vectors: regenerating them changes nothing, and admission reaches every stated verdict."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from swarmnode.admit import Accepted, Verdict
from swarmnode.wire import vectors
from swarmnode.wire.cli_protocol import pipeline_for_context

VECTORS = Path(__file__).resolve().parents[2] / "protocol" / "vectors"
MANIFEST: dict[str, Any] = json.loads((VECTORS / vectors.MANIFEST).read_text(encoding="utf-8"))


def outcome(verdict: Verdict) -> dict[str, Any]:
    if isinstance(verdict, Accepted):
        return {"expect": "accepted"}
    return {"expect": "rejected", "reason": verdict.reason.value}


def expected(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: entry[k] for k in ("expect", "reason") if k in entry}


def judge(data: bytes) -> Verdict:
    ctx = MANIFEST["context"]
    return pipeline_for_context(ctx).admit(data, ctx["now"])


def test_regenerating_the_vectors_gives_byte_identical_files(tmp_path: Path) -> None:
    vectors.write(tmp_path)
    fresh = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    committed = {p.name: p.read_bytes() for p in VECTORS.iterdir()}
    assert sorted(fresh) == sorted(committed)
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"stale vectors {stale}: run `python -m swarmnode.wire.vectors --out protocol/vectors`"


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
def test_each_vector_gets_its_stated_verdict(entry: dict[str, Any]) -> None:
    verdict = judge((VECTORS / entry["file"]).read_bytes())
    assert outcome(verdict) == expected(entry), getattr(verdict, "detail", "")
    if isinstance(verdict, Accepted):
        assert verdict.sender == entry["sender"]
        assert verdict.envelope.kind.label == entry["kind"]
        assert [list(g.rewards) for g in verdict.groups] == entry.get("rewards", [])


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
def test_each_sequence_gets_its_stated_verdicts_from_one_receiver(sequence: dict[str, Any]) -> None:
    ctx = MANIFEST["context"]
    receiver = pipeline_for_context(ctx)
    got = [outcome(receiver.admit((VECTORS / f).read_bytes(), ctx["now"])) for f in sequence["files"]]
    assert got == [expected(e) for e in sequence["expect"]]


def test_task_table_matches_regeneration() -> None:
    from swarmnode.tasks import TaskId, regenerate

    for key, task in MANIFEST["tasks"].items():
        tid = TaskId(task["dataset"], task["config"], task["seed"], task["index"], task["prompt_format"])
        assert tid.key() == key
        assert regenerate(tid).prompt == task["prompt"]
