"""Admission: the steps in order, named reasons as values, fair attribution, persisted bans."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from swarmnode.admit import (
    Accepted,
    AdmissionConfig,
    AdmissionPipeline,
    Rejected,
    RejectReason,
    ScoreRule,
    task_families,
)
from swarmnode.identity import KeyAllowlist
from swarmnode.store import Ledger
from swarmnode.tasks import Task, TaskId, default_mixture, regenerate
from swarmnode.tools import vectors
from swarmnode.verify import Scored, VerifierFailure, VerifierReason
from swarmnode.wire.envelope import (
    Envelope,
    decode_envelope,
    encode_envelope,
    seal,
    seal_payload,
    sign_manifest,
    to_ms,
)
from swarmnode.wire.kinds import Kind
from swarmnode.wire.limits import MAX_ENVELOPE_BYTES
from swarmnode.wire.messages import (
    Activate,
    PeerRecord,
    TensorEntry,
    WeightManifestBody,
    encode_payload,
)

from .conftest import FAMILIES, T0, batch, envelope, heartbeat, identity, make_group

ALICE, BOB, MALLORY = identity(1), identity(2), identity(3)


def reason(verdict: Accepted | Rejected) -> str:
    return "accepted" if isinstance(verdict, Accepted) else verdict.reason.value


def test_a_valid_batch_is_accepted_with_rewards_from_the_local_verifier(pipeline: AdmissionPipeline) -> None:
    good = make_group(1, ("84", "<answer>84</answer>", "85"))
    verdict = pipeline.admit(envelope(batch(good), ALICE), T0)
    assert isinstance(verdict, Accepted)
    assert verdict.sender == ALICE.peer_id
    (admitted,) = verdict.groups
    assert admitted.rewards == (1.0, 1.0, 0.0)
    assert admitted.task.prompt == "58+26=" and admitted.sender == ALICE.peer_id


def test_claimed_rewards_are_never_read(config: AdmissionConfig) -> None:
    seen: list[str] = []

    def score(groups: Sequence[tuple[Task, Sequence[str]]]) -> Scored:
        seen.extend(text for _, texts in groups for text in texts)
        return Scored(tuple(tuple(0.25 for _ in texts) for _, texts in groups))

    pipeline = AdmissionPipeline(config, now=T0, score_groups=score)
    lying = make_group(
        1,
        ("1", "2"),
        completions=tuple(
            replace(c, claimed_reward_informational=1.0) for c in make_group(1, ("1", "2")).completions
        ),
    )
    verdict = pipeline.admit(envelope(batch(lying), ALICE), T0)
    assert isinstance(verdict, Accepted)
    assert verdict.groups[0].rewards == (0.25, 0.25)
    assert seen == ["1", "2"]


def test_a_whole_batch_is_refused_when_one_group_is_bad(pipeline: AdmissionPipeline) -> None:
    bad = make_group(2, prompt="1+1=")
    verdict = pipeline.admit(envelope(batch(make_group(1), bad), ALICE), T0)
    assert isinstance(verdict, Rejected) and verdict.reason is RejectReason.PROMPT_MISMATCH
    assert "groups[1]" in verdict.detail


def test_age_is_judged_before_the_signature_and_the_signature_before_the_payload(
    pipeline: AdmissionPipeline,
) -> None:
    # An expired envelope is refused from its header alone, charged to whoever delivered it and never
    # to the key it names: anyone can re-send anyone's old envelope (red team: re-sends of one spent
    # the signer's rate tokens and CPU and got it banned).
    env = seal(ALICE, heartbeat(), to_ms(T0 - 10_000))
    forged = encode_envelope(replace(env, signature=bytes(64)))
    old = pipeline.admit(forged, T0, via="transport-mallory")
    assert isinstance(old, Rejected) and old.reason is RejectReason.TOO_OLD
    assert old.sender is None and old.charged == "transport-mallory"
    fresh_forged = encode_envelope(replace(seal(ALICE, heartbeat(), to_ms(T0)), signature=bytes(64)))
    assert reason(pipeline.admit(fresh_forged, T0)) == "bad_signature"
    garbage_payload = encode_envelope(
        replace(seal_payload(ALICE, Kind.HEARTBEAT, b"\xff", to_ms(T0)), signature=bytes(64))
    )
    assert reason(pipeline.admit(garbage_payload, T0)) == "bad_signature"


def test_replay_is_checked_before_freshness(pipeline: AdmissionPipeline) -> None:
    data = envelope(heartbeat(), ALICE)
    assert reason(pipeline.admit(data, T0)) == "accepted"
    assert reason(pipeline.admit(data, T0 + 299)) == "replay"
    assert reason(pipeline.admit(data, T0 + 301)) == "too_old", "digest expired with the freshness window"


def test_a_forged_signature_is_charged_to_the_delivering_peer_not_the_claimed_sender(
    pipeline: AdmissionPipeline,
) -> None:
    forged = encode_envelope(replace(seal(ALICE, heartbeat(), to_ms(T0)), signature=bytes(64)))
    for _ in range(2):  # 5 points each: banned at -10
        verdict = pipeline.admit(forged, T0, via="transport-mallory")
        assert isinstance(verdict, Rejected) and verdict.reason is RejectReason.BAD_SIGNATURE
        assert verdict.charged == "transport-mallory" and verdict.sender is None
    assert pipeline.peers.score(ALICE.peer_id) is None, "no state at all for the claimed sender"
    assert pipeline.banned_until("transport-mallory", T0) is not None
    assert reason(pipeline.admit(forged, T0, via="transport-mallory")) == "banned"
    assert reason(pipeline.admit(envelope(heartbeat(2), ALICE), T0)) == "accepted"


def test_replays_by_a_third_party_never_lower_the_signers_score(pipeline: AdmissionPipeline) -> None:
    data = envelope(batch(), ALICE)
    assert reason(pipeline.admit(data, T0)) == "accepted"
    score = pipeline.peers.score(ALICE.peer_id)
    for _ in range(40):
        verdict = pipeline.admit(data, T0 + 1, via="transport-mallory")
        assert isinstance(verdict, Rejected)
    assert pipeline.peers.score(ALICE.peer_id) == score
    assert pipeline.banned_until(ALICE.peer_id, T0 + 1) is None
    assert pipeline.banned_until("transport-mallory", T0 + 1) is not None
    assert reason(pipeline.admit(envelope(heartbeat(), ALICE, T0 + 1), T0 + 1)) == "accepted"


def test_a_signer_that_loses_the_race_to_a_relay_of_its_own_envelopes_is_never_charged(
    pipeline: AdmissionPipeline,
) -> None:
    """Red team: a forwarder that delivered each of Alice's envelopes first turned Alice's own
    deliveries into replays charged to her as the delivering peer; 34 races banned her."""
    for n in range(60):
        now = T0 + 5 * n  # Alice's own pace: within her rate bucket
        data = envelope(batch(make_group(1, (str(n),))), ALICE, now)
        assert reason(pipeline.admit(data, now, via="transport-relay")) == "accepted"
        verdict = pipeline.admit(data, now, via=ALICE.peer_id)
        assert isinstance(verdict, Rejected) and verdict.reason is RejectReason.REPLAY
        assert verdict.charged is None
    assert pipeline.banned_until(ALICE.peer_id, now) is None
    assert pipeline.peers.score(ALICE.peer_id) > 0
    # A third party replaying the same envelope is still charged.
    verdict = pipeline.admit(data, now, via="transport-mallory")
    assert isinstance(verdict, Rejected) and verdict.charged == "transport-mallory"


def test_an_honest_signers_valid_envelopes_handed_to_a_receiver_set_up_otherwise_never_ban_it(
    config: AdmissionConfig,
) -> None:
    """Red team: 20 of Alice's valid batches, relayed to a node that trains other families or
    knows a newer version, banned Alice. Those verdicts depend on the receiver, not on Alice."""
    other_families = AdmissionPipeline(replace(config, allowed_tasks=frozenset()), now=T0)
    moved_on = AdmissionPipeline(config, now=T0)
    moved_on.set_policy_version(vectors.MODEL_ID, 1000)
    for receiver, expected in ((other_families, "task_not_allowed"), (moved_on, "stale_policy")):
        for n in range(40):
            data = envelope(batch(make_group(1, (str(n),))), ALICE, T0 + n * 0.01)  # 40 distinct, valid
            assert reason(receiver.admit(data, T0 + 1, via="transport-mallory")) == expected
        assert receiver.banned_until(ALICE.peer_id, T0 + 1) is None
        assert (receiver.peers.score(ALICE.peer_id) or 0.0) >= 0  # untracked: never charged
        assert reason(receiver.admit(envelope(heartbeat(), ALICE, T0 + 1), T0 + 1)) == "accepted"


def test_unattributable_rejections_are_counted_but_charge_nobody_without_via(
    pipeline: AdmissionPipeline,
) -> None:
    verdict = pipeline.admit(b"\xff" * 10, T0)
    assert (
        isinstance(verdict, Rejected) and verdict.reason is RejectReason.MALFORMED and verdict.charged is None
    )
    assert pipeline.counts() == {"malformed": 1}
    assert len(pipeline.peers) == 0


def test_a_banned_transport_peer_is_refused_before_its_bytes_are_decoded(pipeline: AdmissionPipeline) -> None:
    pipeline.penalize("transport-x", RejectReason.PROMPT_MISMATCH, T0)
    verdict = pipeline.admit(b"\xff" * 10, T0, via="transport-x")
    assert isinstance(verdict, Rejected) and verdict.reason is RejectReason.BANNED


def test_a_sender_at_the_threshold_is_banned_and_the_ban_is_persisted(
    tmp_path: Path, config: AdmissionConfig
) -> None:
    with Ledger(tmp_path / "ledger.db") as ledger:
        pipeline = AdmissionPipeline(config, now=T0, ledger=ledger)
        liar = envelope(batch(make_group(1, prompt="99+1=")), MALLORY)
        verdict = pipeline.admit(liar, T0)
        assert isinstance(verdict, Rejected) and verdict.reason is RejectReason.PROMPT_MISMATCH
        assert verdict.charged == MALLORY.peer_id
        until = T0 + config.score.ban_seconds
        assert ledger.active_bans(T0) == {MALLORY.peer_id: until}
        assert ledger.rejection_counts(MALLORY.peer_id) == {"prompt_mismatch": 1}
        assert reason(pipeline.admit(envelope(heartbeat(), MALLORY), T0 + 1)) == "banned"
    with Ledger(tmp_path / "ledger.db") as ledger:  # restart: the ban survives
        restarted = AdmissionPipeline(config, now=T0 + 2, ledger=ledger)
        assert reason(restarted.admit(envelope(heartbeat(3), MALLORY, T0 + 2), T0 + 2)) == "banned"
        later = until + 1
        assert reason(restarted.admit(envelope(heartbeat(4), MALLORY, later), later)) == "accepted"


def test_small_penalties_add_up_to_a_ban() -> None:
    pipeline = AdmissionPipeline(
        AdmissionConfig(allowed_tasks=FAMILIES, score=ScoreRule(ban_threshold=-2.0, ban_seconds=60.0)), now=T0
    )
    for i in range(3):  # too old: charged to via at 0.5 each -> -1.5, not yet banned
        pipeline.admit(envelope(heartbeat(i), ALICE, T0 - 1000), T0, via="slow-relay")
    assert pipeline.banned_until("slow-relay", T0) is None
    pipeline.admit(envelope(heartbeat(9), ALICE, T0 - 1000), T0, via="slow-relay")
    assert pipeline.banned_until("slow-relay", T0) == T0 + 60.0


def test_accepted_messages_slowly_restore_a_score(pipeline: AdmissionPipeline) -> None:
    pipeline.admit(envelope(heartbeat(), ALICE, T0 + 100), T0)  # from the future: -1
    assert pipeline.peers.score(ALICE.peer_id) == -1.0
    for i in range(5):
        pipeline.admit(envelope(heartbeat(10 + i), ALICE), T0)
    assert pipeline.peers.score(ALICE.peer_id) == pytest.approx(0.0)


def test_each_sender_has_its_own_rate_bucket() -> None:
    pipeline = AdmissionPipeline(
        AdmissionConfig(allowed_tasks=FAMILIES, score=ScoreRule(rate_per_s=1.0, burst=3.0)), now=T0
    )
    got = [reason(pipeline.admit(envelope(heartbeat(i), ALICE), T0)) for i in range(4)]
    assert got == ["accepted", "accepted", "accepted", "rate_limited"]
    assert reason(pipeline.admit(envelope(heartbeat(1), BOB), T0)) == "accepted"
    assert reason(pipeline.admit(envelope(heartbeat(5), ALICE, T0 + 1), T0 + 1)) == "accepted"


def test_new_identities_are_capped_per_window_without_creating_state() -> None:
    pipeline = AdmissionPipeline(
        AdmissionConfig(allowed_tasks=FAMILIES, new_identities=3, new_identity_window_s=60.0), now=T0
    )
    got = [reason(pipeline.admit(envelope(heartbeat(), identity(100 + i)), T0)) for i in range(4)]
    assert got == ["accepted", "accepted", "accepted", "new_identity_limit"]
    assert len(pipeline.peers) == 3
    assert reason(pipeline.admit(envelope(heartbeat(2), identity(100)), T0)) == "accepted", (
        "known peers unaffected"
    )
    assert reason(pipeline.admit(envelope(heartbeat(), identity(200), T0 + 20), T0 + 20)) == "accepted"


def test_a_full_replay_cache_forgets_only_behind_a_watermark_so_nothing_can_be_replayed() -> None:
    pipeline = AdmissionPipeline(
        AdmissionConfig(allowed_tasks=FAMILIES, replay_capacity=2, max_age_s=10.0), now=T0
    )
    first = envelope(heartbeat(1), ALICE, T0 - 2)
    assert reason(pipeline.admit(first, T0)) == "accepted"
    assert reason(pipeline.admit(envelope(heartbeat(2), ALICE, T0 - 1), T0)) == "accepted"
    assert reason(pipeline.admit(envelope(heartbeat(3), ALICE), T0)) == "accepted"  # forgets `first`
    assert pipeline.replay.evicted == 1
    verdict = pipeline.admit(first, T0 + 1)
    assert isinstance(verdict, Rejected) and verdict.reason is RejectReason.REPLAY, (
        "forgotten, not replayable"
    )
    assert verdict.charged is None or verdict.charged != ALICE.peer_id


def test_a_replay_cache_full_of_our_own_digests_refuses_instead_of_forgetting() -> None:
    pipeline = AdmissionPipeline(
        AdmissionConfig(allowed_tasks=FAMILIES, replay_capacity=2, max_age_s=10.0), now=T0
    )
    pipeline.replay.add(b"own-1", T0 + 10)  # our own published envelopes: owned by nobody
    pipeline.replay.add(b"own-2", T0 + 10)
    verdict = pipeline.admit(envelope(heartbeat(3), ALICE), T0)
    assert isinstance(verdict, Rejected) and verdict.reason is RejectReason.REPLAY_CACHE_FULL
    assert verdict.charged is None
    assert reason(pipeline.admit(envelope(heartbeat(3), ALICE, T0 + 10), T0 + 10)) == "accepted"


def test_the_same_groups_in_a_new_envelope_are_a_duplicate_but_other_signers_may_send_them(
    pipeline: AdmissionPipeline,
) -> None:
    group = make_group(1)
    assert reason(pipeline.admit(envelope(batch(group), ALICE), T0)) == "accepted"
    verdict = pipeline.admit(envelope(batch(group), ALICE, T0 + 1), T0 + 1)
    assert isinstance(verdict, Rejected) and verdict.reason is RejectReason.DUPLICATE
    assert verdict.charged == ALICE.peer_id
    assert reason(pipeline.admit(envelope(batch(group), BOB), T0)) == "accepted"


def test_the_same_groups_under_a_renamed_task_id_are_a_duplicate(pipeline: AdmissionPipeline) -> None:
    # Red team rt61 F4: (seed - k, index + k) regenerates the same task (SPEC 4.1a), so one signer
    # re-sent the same rollouts under k names and each was admitted.
    group = make_group(1)
    renamed = replace(group.task, seed=group.task.seed - 5, index=group.task.index + 5)
    assert regenerate(renamed).prompt == group.prompt  # the same question: admission checks it
    assert reason(pipeline.admit(envelope(batch(group), ALICE), T0)) == "accepted"
    again = pipeline.admit(envelope(batch(replace(group, task=renamed)), ALICE, T0 + 1), T0 + 1)
    assert isinstance(again, Rejected) and again.reason is RejectReason.DUPLICATE


@pytest.mark.parametrize(
    ("sent_at", "expected"),
    [
        (T0 - 300.0, "accepted"),
        (T0 - 300.001, "too_old"),
        (T0 + 30.0, "accepted"),
        (T0 + 30.001, "from_future"),
    ],
)
def test_freshness_window_edges(pipeline: AdmissionPipeline, sent_at: float, expected: str) -> None:
    assert reason(pipeline.admit(envelope(heartbeat(), ALICE, sent_at), T0)) == expected


@pytest.mark.parametrize(
    ("version", "expected"), [(20, "accepted"), (12, "accepted"), (11, "stale_policy"), (21, "stale_policy")]
)
def test_policy_version_must_be_within_the_staleness_bound(
    pipeline: AdmissionPipeline, version: int, expected: str
) -> None:
    pipeline.set_policy_version(vectors.MODEL_ID, 20)
    assert reason(pipeline.admit(envelope(batch(make_group(policy_version=version)), ALICE), T0)) == expected


def test_no_staleness_bound_applies_to_a_model_we_know_no_version_of(pipeline: AdmissionPipeline) -> None:
    pipeline.set_policy_version("some-other-model", 1000)
    assert reason(pipeline.admit(envelope(batch(make_group(policy_version=0)), ALICE), T0)) == "accepted"


def test_tasks_outside_the_families_we_train_on_are_refused_before_regeneration(
    config: AdmissionConfig,
) -> None:
    calls: list[TaskId] = []

    def regenerate(tid: TaskId) -> Task:
        calls.append(tid)
        raise AssertionError("must not be called")

    pipeline = AdmissionPipeline(config, now=T0, regenerate=regenerate)
    hostile = make_group(1, task=TaskId("chain_sum", '{"max_digits":100000}', 0, 1, "compact"))
    assert reason(pipeline.admit(envelope(batch(hostile), ALICE), T0)) == "task_not_allowed"
    assert calls == []


def test_task_families_come_from_the_mixture() -> None:
    assert task_families(default_mixture(0)) == {vectors.ALLOWED_TASKS[0]}


def test_a_task_that_cannot_be_regenerated_is_task_invalid() -> None:
    pipeline = AdmissionPipeline(AdmissionConfig(allowed_tasks=None), now=T0)
    unknown = make_group(1, task=TaskId("no_such_generator", "{}", 0, 1, "question"))
    assert reason(pipeline.admit(envelope(batch(unknown), ALICE), T0)) == "task_invalid"


@pytest.mark.parametrize("prompt", ["58+26= ", " 58+26=", "58 + 26 =", "58+26=\n"])
def test_the_prompt_must_match_the_regenerated_one_exactly(pipeline: AdmissionPipeline, prompt: str) -> None:
    assert (
        reason(pipeline.admit(envelope(batch(make_group(1, prompt=prompt)), ALICE), T0)) == "prompt_mismatch"
    )


@pytest.mark.parametrize(
    ("failure", "expected"),
    [(VerifierReason.FAILED, "verifier_failed"), (VerifierReason.TIMEOUT, "verifier_timeout")],
)
def test_a_verifier_failure_is_a_rejection_charged_to_the_signer(
    config: AdmissionConfig, failure: VerifierReason, expected: str
) -> None:
    def score(groups: Sequence[tuple[Task, Sequence[str]]]) -> VerifierFailure:
        return VerifierFailure(failure, "worker died", cpu_s=1.5)

    pipeline = AdmissionPipeline(config, now=T0, score_groups=score)
    verdict = pipeline.admit(envelope(batch(), ALICE), T0)
    assert isinstance(verdict, Rejected) and verdict.reason.value == expected
    assert verdict.charged == ALICE.peer_id and pipeline.last_scoring_cpu_s == 1.5


def test_a_private_swarm_refuses_keys_off_the_allowlist() -> None:
    pipeline = AdmissionPipeline(
        AdmissionConfig(allowed_tasks=FAMILIES, allowlist=KeyAllowlist.from_keys([ALICE.public_key])), now=T0
    )
    assert reason(pipeline.admit(envelope(heartbeat(), ALICE), T0)) == "accepted"
    verdict = pipeline.admit(envelope(heartbeat(), BOB), T0)
    assert isinstance(verdict, Rejected) and verdict.reason is RejectReason.NOT_ALLOWLISTED
    assert pipeline.peers.score(BOB.peer_id) is None


def test_a_peer_record_must_name_its_signer(pipeline: AdmissionPipeline) -> None:
    assert reason(pipeline.admit(envelope(PeerRecord(peer_id=ALICE.peer_id), ALICE), T0)) == "accepted"
    assert reason(pipeline.admit(envelope(PeerRecord(peer_id=ALICE.peer_id), BOB), T0)) == "sender_mismatch"


def test_manifests_need_a_valid_and_if_configured_trusted_publisher() -> None:
    body = WeightManifestBody("m", 1, (TensorEntry("w", "U8", (10,), 0, 10),), 1024, (bytes(32),), 10)
    manifest = sign_manifest(BOB, body)
    open_pipeline = AdmissionPipeline(AdmissionConfig(allowed_tasks=FAMILIES), now=T0)
    assert reason(open_pipeline.admit(envelope(manifest, ALICE), T0)) == "accepted"
    strict = AdmissionPipeline(
        AdmissionConfig(allowed_tasks=FAMILIES, trusted_publishers=frozenset({ALICE.public_key})), now=T0
    )
    assert reason(strict.admit(envelope(manifest, ALICE), T0)) == "untrusted_publisher"
    forged = replace(manifest, signature=ALICE.sign(b"something else"))
    assert reason(open_pipeline.admit(envelope(forged, ALICE, T0 + 1), T0 + 1)) == "bad_manifest_signature"


def test_control_messages_must_be_addressed_to_us() -> None:
    pipeline = AdmissionPipeline(AdmissionConfig(allowed_tasks=FAMILIES, local_peer_id=BOB.peer_id), now=T0)
    assert reason(pipeline.admit(envelope(Activate(BOB.peer_id, "m", 1, 1.0, 60), ALICE), T0)) == "accepted"
    wrong = pipeline.admit(envelope(Activate(MALLORY.peer_id, "m", 1, 1.0, 60), ALICE), T0, via="relay")
    assert isinstance(wrong, Rejected) and wrong.reason is RejectReason.WRONG_RECIPIENT
    assert wrong.charged == "relay"


def test_signed_garbage_is_charged_to_its_signer(pipeline: AdmissionPipeline) -> None:
    data = encode_envelope(seal_payload(ALICE, Kind.ROLLOUT_BATCH, b"\xff\xff", to_ms(T0)))
    verdict = pipeline.admit(data, T0, via="relay")
    assert isinstance(verdict, Rejected) and verdict.reason is RejectReason.INVALID_PAYLOAD
    assert verdict.charged == ALICE.peer_id and verdict.sender == ALICE.peer_id


def test_counters_count_every_verdict_by_reason(tmp_path: Path, config: AdmissionConfig) -> None:
    with Ledger(tmp_path / "ledger.db") as ledger:
        pipeline = AdmissionPipeline(config, now=T0, ledger=ledger)
        pipeline.admit(envelope(batch(), ALICE), T0)
        pipeline.admit(envelope(batch(), ALICE), T0)  # replay, no via: charged to nobody
        pipeline.admit(b"", T0, via="relay")
        pipeline.admit(envelope(heartbeat(), ALICE, T0 - 1000), T0, via="relay")
        pipeline.admit(encode_envelope(seal_payload(BOB, Kind.ANNOUNCE, b"\x12\x01x", to_ms(T0))), T0)
        assert pipeline.counts() == {
            "accepted": 1,
            "replay": 1,
            "unsupported_version": 1,
            "too_old": 1,
            "invalid_payload": 1,
        }
        assert ledger.rejection_counts() == {"unsupported_version": 1, "too_old": 1, "invalid_payload": 1}
        assert ledger.rejection_counts("relay") == {"unsupported_version": 1, "too_old": 1}


def test_evicting_a_peer_from_the_table_never_lifts_its_ban() -> None:
    pipeline = AdmissionPipeline(AdmissionConfig(allowed_tasks=FAMILIES, max_tracked_peers=2), now=T0)
    pipeline.penalize(MALLORY.peer_id, RejectReason.SENDER_MISMATCH, T0)
    for i in range(5):
        pipeline.admit(envelope(heartbeat(), identity(300 + i)), T0)
    assert len(pipeline.peers) == 2
    assert reason(pipeline.admit(envelope(heartbeat(), MALLORY), T0)) == "banned"


def test_admission_reads_no_clock(pipeline: AdmissionPipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    data = [envelope(batch(make_group(i)), ALICE) for i in range(3)] + [
        b"junk",
        envelope(heartbeat(), BOB, 0),
    ]

    def no_clock() -> float:
        raise AssertionError("admission read the clock")

    for name in ("time", "monotonic", "perf_counter", "time_ns", "monotonic_ns"):
        monkeypatch.setattr(time, name, no_clock)
    verdicts = [reason(pipeline.admit(d, T0)) for d in data]
    monkeypatch.undo()
    assert verdicts == ["accepted", "accepted", "accepted", "malformed", "too_old"]


def test_config_must_price_every_reason() -> None:
    with pytest.raises(ValueError, match="penalties"):
        AdmissionConfig(allowed_tasks=FAMILIES, penalties={RejectReason.BANNED: 0.0})


def test_question_format_groups_of_an_allowed_family_are_accepted(pipeline: AdmissionPipeline) -> None:
    task = vectors.vector_task(3, "question")
    group = vectors.vector_group(task, [task.entry["answer"], "0"])
    verdict = pipeline.admit(envelope(batch(group), ALICE), T0)
    assert isinstance(verdict, Accepted)
    assert verdict.groups[0].rewards == (1.0, 0.0)
    assert verdict.groups[0].task.prompt.startswith("State the final answer")


def test_a_node_must_choose_which_task_families_it_accepts() -> None:
    with pytest.raises(TypeError, match="allowed_tasks"):
        AdmissionConfig()  # type: ignore[call-arg]


def test_large_envelopes_cost_more_rate_tokens() -> None:
    config = AdmissionConfig(
        allowed_tasks=FAMILIES, score=ScoreRule(rate_per_s=1.0, burst=3.0), bytes_per_token=512
    )
    pipeline = AdmissionPipeline(config, now=T0)
    big = batch(make_group(1, completions=make_group(1).completions * 32))
    assert len(encode_payload(big)) // 512 == 2  # costs 1 + 2 tokens: the whole burst
    assert reason(pipeline.admit(envelope(big, ALICE), T0)) == "accepted"
    assert reason(pipeline.admit(envelope(heartbeat(), ALICE), T0)) == "rate_limited"
    assert reason(pipeline.admit(envelope(heartbeat(), ALICE, T0 + 1), T0 + 1)) == "accepted"


def test_solicited_responses_skip_the_rate_bucket_but_no_other_check() -> None:
    config = AdmissionConfig(allowed_tasks=FAMILIES, score=ScoreRule(rate_per_s=0.001, burst=1.0))
    pipeline = AdmissionPipeline(config, now=T0)
    assert reason(pipeline.admit(envelope(heartbeat(0), ALICE), T0)) == "accepted"
    assert reason(pipeline.admit(envelope(heartbeat(1), ALICE), T0)) == "rate_limited"
    got = [reason(pipeline.admit(envelope(heartbeat(i), ALICE), T0, solicited=True)) for i in range(2, 12)]
    assert got == ["accepted"] * 10
    forged = encode_envelope(replace(seal(ALICE, heartbeat(99), to_ms(T0)), signature=bytes(64)))
    assert reason(pipeline.admit(forged, T0, solicited=True)) == "bad_signature"


def test_our_own_envelope_handed_back_is_a_replay_charged_to_the_deliverer() -> None:
    pipeline = AdmissionPipeline(AdmissionConfig(allowed_tasks=FAMILIES, local_peer_id=ALICE.peer_id), now=T0)
    verdict = pipeline.admit(envelope(batch(), ALICE), T0, via="mallory-transport")
    assert isinstance(verdict, Rejected)
    assert verdict.reason is RejectReason.REPLAY
    assert verdict.charged == "mallory-transport"
    assert isinstance(pipeline.admit(envelope(batch(), BOB), T0, via="bob-transport"), Accepted)


# -- an envelope the caller decoded already (the gossip driver: decode once) ------------------------


def decoded(data: bytes) -> Envelope:
    value = decode_envelope(data)
    assert isinstance(value, Envelope)
    return value


def test_an_envelope_decoded_by_the_caller_gets_the_verdict_its_bytes_get(config: AdmissionConfig) -> None:
    by_bytes, by_value = AdmissionPipeline(config, now=T0), AdmissionPipeline(config, now=T0)
    good = envelope(batch(make_group(1, ("84", "85"))), ALICE)
    bad = envelope(batch(make_group(2, prompt="1+1=")), BOB)
    forged = encode_envelope(replace(seal(MALLORY, heartbeat(), to_ms(T0)), signature=bytes(64)))
    verdicts = []
    for data in (good, bad, forged, good):  # the second ``good`` is a replay
        expected = by_bytes.admit(data, T0, via="relay", solicited=True)
        verdict = by_value.admit(data, T0, via="relay", solicited=True, envelope=decoded(data))
        assert verdict == expected
        verdicts.append(reason(verdict))
    assert verdicts == ["accepted", "prompt_mismatch", "bad_signature", "replay"]
    assert by_value.counts() == by_bytes.counts()


def test_the_size_limit_holds_for_the_raw_bytes_even_when_the_caller_decoded_them(
    pipeline: AdmissionPipeline,
) -> None:
    data = envelope(heartbeat(), ALICE)
    padded = data + bytes(MAX_ENVELOPE_BYTES)  # what a caller's decode could never have accepted
    verdict = pipeline.admit(padded, T0, via="transport-x", envelope=decoded(data))
    assert isinstance(verdict, Rejected) and verdict.reason is RejectReason.TOO_LARGE
    assert verdict.charged == "transport-x"


def test_a_banned_transport_peer_is_refused_first_whoever_decoded_the_bytes(
    pipeline: AdmissionPipeline,
) -> None:
    pipeline.penalize("transport-x", RejectReason.PROMPT_MISMATCH, T0)
    data = envelope(heartbeat(), ALICE)
    verdict = pipeline.admit(data, T0, via="transport-x", envelope=decoded(data))
    assert isinstance(verdict, Rejected) and verdict.reason is RejectReason.BANNED
    assert reason(pipeline.admit(data, T0, envelope=decoded(data))) == "accepted"  # not remembered


def test_the_ban_a_rejection_left_is_read_for_whom_it_charged_else_its_signer_else_the_deliverer(
    pipeline: AdmissionPipeline,
) -> None:
    forged = encode_envelope(replace(seal(ALICE, heartbeat(), to_ms(T0)), signature=bytes(64)))
    verdict = pipeline.admit(forged, T0, via="transport-mallory")
    assert isinstance(verdict, Rejected)
    assert pipeline.ban_left_by(verdict, "transport-mallory", T0) is None  # one forgery: no ban yet
    for _ in range(20):
        verdict = pipeline.admit(forged, T0, via="transport-mallory")
    until = pipeline.ban_left_by(verdict, "transport-mallory", T0)
    assert until is not None and until == pipeline.banned_until("transport-mallory", T0)
    assert pipeline.banned_until(ALICE.peer_id, T0) is None  # the key it names is never charged
    accepted = pipeline.admit(envelope(heartbeat(), BOB), T0)
    assert pipeline.ban_left_by(accepted, "transport-mallory", T0) is None  # an acceptance leaves none


def test_our_own_published_envelope_remembered_as_seen_is_a_replay_when_handed_back(
    pipeline: AdmissionPipeline,
) -> None:
    data = envelope(heartbeat(), ALICE)
    assert pipeline.remember_own(decoded(data), T0)
    verdict = pipeline.admit(data, T0 + 1, via="relay")
    assert isinstance(verdict, Rejected) and verdict.reason is RejectReason.REPLAY
    assert pipeline.replay.held("relay") == 0  # owned by nobody: no peer's quota
    assert reason(pipeline.admit(data, T0 + 301, via="relay")) == "too_old"  # forgotten with its window


def test_a_payload_decoded_by_the_caller_is_not_decoded_again_and_gets_the_same_verdict(
    config: AdmissionConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The learner's data plane decodes and verifies a worker's batch; admission takes those values."""
    import swarmnode.admit.pipeline as pipeline_module

    by_bytes, by_value = AdmissionPipeline(config, now=T0), AdmissionPipeline(config, now=T0)
    good = envelope(batch(make_group(1, ("84", "85"))), ALICE)
    bad = envelope(batch(make_group(2, prompt="1+1=")), BOB)
    expected = [by_bytes.admit(data, T0, via="w", solicited=True) for data in (good, bad)]
    values = []
    for data in (good, bad):
        value = decoded(data)
        values.append((data, value, pipeline_module.decode_payload(value.kind, value.payload)))
    calls: list[bytes] = []
    real = pipeline_module.decode_payload

    def counting(kind: Kind, payload: bytes) -> object:
        calls.append(payload)
        return real(kind, payload)

    monkeypatch.setattr(pipeline_module, "decode_payload", counting)
    verdicts = [
        by_value.admit(data, T0, via="w", solicited=True, envelope=value, message=message)
        for data, value, message in values
    ]
    assert verdicts == expected and [reason(v) for v in verdicts] == ["accepted", "prompt_mismatch"]
    assert calls == []
    with pytest.raises(ValueError, match="only with the envelope"):
        by_value.admit(good, T0, message=values[0][2])  # type: ignore[arg-type]
