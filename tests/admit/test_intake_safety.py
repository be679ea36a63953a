"""The intake under attack: what is scored is what is trained, quotas, CPU budgets, a live loop.

Each test is one finding of the safe-intake review, asserting the outcome: the wrong answer
is not trained as right, a flooder cannot lock honest signers out of the replay cache, a
peer that spent its CPU is refused, and the event loop keeps running while admission works.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmnode.admit import Accepted, AdmissionConfig, AdmissionPipeline, Rejected, RejectReason, Verdict
from swarmnode.admit.intake import Intake, Judged
from swarmnode.identity import NodeIdentity
from swarmnode.policy import Policy, build_tiny_policy
from swarmnode.roles.convert import completion_token_rows, to_scored, trained_texts
from swarmnode.tasks import Task, TaskId, regenerate, score_completion
from swarmnode.verify import Scored, score_in_process
from swarmnode.wire.messages import Heartbeat

from .conftest import FAMILIES, T0, batch, envelope, heartbeat, identity, make_group

T = TypeVar("T")

MAX_NEW = 8
ALICE, MALLORY = identity(1), identity(3)


@pytest.fixture(scope="module")
def policy() -> Policy:
    torch.set_num_threads(1)
    return build_tiny_policy(0)


def rendering_pipeline(policy: Policy) -> AdmissionPipeline:
    return AdmissionPipeline(
        AdmissionConfig(allowed_tasks=FAMILIES),
        now=T0,
        render=lambda texts: trained_texts(policy, texts, MAX_NEW),
    )


def test_a_wrong_answer_past_the_trained_tokens_is_refused_not_trained_as_right(policy: Policy) -> None:
    """Finding: ``202\\n\\n\\n\\n\\n<answer>191</answer>`` scored 1.0 and trained as ``202...``."""
    task = regenerate(TaskId("chain_sum", FAMILIES_CHAIN, 7, 0, "compact"))
    right = task.entry["answer"]
    hostile = "202\n\n\n\n\n<answer>" + right + "</answer>"
    verdict = rendering_pipeline(policy).admit(envelope(batch(make_group(0, (hostile, right))), ALICE), T0)
    assert isinstance(verdict, Rejected) and verdict.reason.value == "completion_too_long"


FAMILIES_CHAIN = next(config for dataset, config, fmt in FAMILIES if fmt == "compact")

texts = st.text(alphabet=st.sampled_from("0123456789+-=<>/answer \n\u00e9x"), max_size=12)


@settings(max_examples=60, deadline=None)
@given(answers=st.lists(texts, min_size=1, max_size=4))
def test_every_admitted_reward_is_the_score_of_the_decoded_trained_ids(
    policy: Policy, answers: list[str]
) -> None:
    pipeline = rendering_pipeline(policy)
    verdict = pipeline.admit(envelope(batch(make_group(1, tuple(answers))), ALICE), T0)
    if isinstance(verdict, Rejected):
        assert verdict.reason.value in (
            "completion_too_long",
            "completion_untrainable",
            "invalid_payload",
            "limit_exceeded",
        )
        return
    assert isinstance(verdict, Accepted)
    for admitted in verdict.groups:
        scored = to_scored(admitted, policy, MAX_NEW)
        fresh = completion_token_rows(policy, [c.text for c in admitted.group.completions], MAX_NEW)
        assert scored.completion_ids == fresh  # the ids admission rendered are the ones trained
        for ids, reward in zip(scored.completion_ids, scored.rewards, strict=True):
            assert len(ids) <= MAX_NEW
            assert reward == score_completion(admitted.task, policy.decode_completion(ids))


def test_an_eos_spelled_inside_a_completion_ends_what_is_trained(policy: Policy) -> None:
    eos_text = policy.tokenizer.decode([policy.eos_token_id])
    [ids] = completion_token_rows(policy, [f"84{eos_text}99"], MAX_NEW)
    assert isinstance(ids, list) and ids[-1] == policy.eos_token_id and ids.count(policy.eos_token_id) == 1
    assert policy.decode_completion(ids) == "84"


@pytest.mark.parametrize("spelled", ["bos", "pad", "unk", "foreign"])
def test_tokens_the_reward_cannot_see_are_refused_not_trained(policy: Policy, spelled: str) -> None:
    """Red-team F3: ``<bos>-28`` scored 1.0 (decoding drops specials) and was trained with the <bos>."""
    tokenizer = policy.tokenizer
    token = {"bos": tokenizer.bos_token, "pad": tokenizer.pad_token, "unk": tokenizer.unk_token}.get(
        spelled, "é"
    )
    assert token is not None
    [row] = completion_token_rows(policy, [f"{token}-28"], MAX_NEW)
    assert row is RejectReason.COMPLETION_UNTRAINABLE


def test_an_8_kib_filler_is_refused_by_length_before_any_tokenization(policy: Policy) -> None:
    [row] = completion_token_rows(policy, ["84" + "0" * 8000], MAX_NEW)
    assert row is RejectReason.COMPLETION_TOO_LONG


def heartbeat_from(who: NodeIdentity, k: int) -> bytes:
    """The k-th heartbeat of ``who``, sent k ms after T0 (a real signer's envelopes are in time order)."""
    return envelope(Heartbeat(round=1000 + k, model_id="tiny", policy_version=0), who, at=T0 + k / 1000)


def test_one_flooding_signer_cannot_lock_honest_signers_out_of_the_replay_cache() -> None:
    """Finding: one signer filled the 200,000-digest cache; honest batches were refused."""
    pipeline = AdmissionPipeline(
        AdmissionConfig(allowed_tasks=FAMILIES, replay_capacity=100, replay_quota=20), now=T0
    )
    verdicts = [pipeline.admit(heartbeat_from(MALLORY, k), T0, via="mallory-transport") for k in range(60)]
    refused = [v for v in verdicts if isinstance(v, Rejected)]
    assert sum(isinstance(v, Accepted) for v in verdicts) == 20
    assert {v.reason.value for v in refused} <= {"replay_quota_signer", "replay_quota_via", "banned"}
    assert pipeline.banned_until(MALLORY.peer_id, T0) is not None  # a persistent flooder is banned
    honest = pipeline.admit(envelope(batch(make_group(1)), ALICE), T0, via="alice-transport")
    assert isinstance(honest, Accepted)


def test_a_delivering_peer_is_held_to_its_quota_across_signers() -> None:
    pipeline = AdmissionPipeline(
        AdmissionConfig(allowed_tasks=FAMILIES, replay_capacity=1000, replay_quota=10), now=T0
    )
    sybils = [identity(100 + k) for k in range(20)]
    verdicts = [pipeline.admit(heartbeat_from(s, 0), T0, via="relay") for s in sybils]
    assert sum(isinstance(v, Accepted) for v in verdicts) == 10
    assert {v.reason.value for v in verdicts if isinstance(v, Rejected)} == {"replay_quota_via"}


def test_a_peer_that_spent_its_cpu_budget_is_refused_until_it_refills() -> None:
    pipeline = AdmissionPipeline(
        AdmissionConfig(allowed_tasks=FAMILIES, cpu_rate=0.1, cpu_burst=1.0, cpu_initial=1.0), now=T0
    )
    pipeline.charge_cpu(ALICE.peer_id, "announcer", 3.0, T0)
    as_signer = pipeline.admit(heartbeat_from(ALICE, 1), T0, via="elsewhere")
    as_via = pipeline.admit(heartbeat_from(identity(9), 1), T0, via="announcer")
    assert isinstance(as_signer, Rejected) and as_signer.reason.value == "cpu_budget"
    assert isinstance(as_via, Rejected) and as_via.reason.value == "cpu_budget"
    assert as_signer.charged is None  # the budget is the consequence; no score lost
    later = T0 + 25.0  # debt 2.0 refills at 0.1/s
    assert isinstance(pipeline.admit(heartbeat_from(ALICE, 2), later, via="elsewhere"), Accepted)


def test_admission_runs_off_the_event_loop_and_charges_its_cpu() -> None:
    """Finding: a 25 s scorer kept /healthz from answering for 25 s. Here the loop keeps ticking."""

    def slow(groups: Sequence[tuple[Task, Sequence[str]]]) -> Scored:
        deadline = time.thread_time() + 0.6
        while time.thread_time() < deadline:  # CPU-bound, holding the GIL as a scorer would
            pass
        return score_in_process(groups)  # type: ignore[return-value]

    now = time.time()
    pipeline = AdmissionPipeline(AdmissionConfig(allowed_tasks=FAMILIES), now=now, score_groups=slow)
    intake = Intake(pipeline, clock=lambda: now)  # the budget does not refill while the scorer runs

    async def scenario() -> tuple[float, object]:
        worst = 0.0
        task = asyncio.ensure_future(
            intake.admit(envelope(batch(make_group(1)), ALICE, at=now), via="peer", solicited=True)
        )
        while not task.done():
            before = time.monotonic()
            await asyncio.sleep(0.01)
            worst = max(worst, time.monotonic() - before - 0.01)
        return worst, task.result()

    try:
        worst, verdict = asyncio.run(scenario())
    finally:
        intake.close()
    assert isinstance(verdict, Accepted)
    assert worst < 0.05, f"the loop stalled {worst * 1000:.0f} ms"
    assert intake.cpu_seconds >= 0.6
    level = pipeline.cpu.level(ALICE.peer_id)
    assert level is not None and level <= pipeline.config.cpu_initial - 0.6


def test_many_flooding_identities_cannot_fill_the_cache_against_an_honest_signer() -> None:
    """Quotas alone let a few identities fill the cache together; the largest holder's oldest
    digests are forgotten to make room, and no forgotten envelope can be replayed."""
    pipeline = AdmissionPipeline(
        AdmissionConfig(allowed_tasks=FAMILIES, replay_capacity=60, replay_quota=20, new_identities=1000),
        now=T0,
    )
    honest_accepted = 0
    for k in range(10):
        honest_accepted += isinstance(pipeline.admit(heartbeat_from(ALICE, k), T0, via="alice"), Accepted)
        for sybil in range(8):
            who = identity(200 + sybil)
            pipeline.admit(heartbeat_from(who, k * 3), T0, via=f"sybil-{sybil}")
            pipeline.admit(heartbeat_from(who, k * 3 + 1), T0, via=f"sybil-{sybil}")
    assert honest_accepted == 10
    assert pipeline.replay.evicted > 0
    for k in range(10):  # every one of Alice's envelopes is still refused as a replay
        again = pipeline.admit(heartbeat_from(ALICE, k), T0, via="mallory")
        assert isinstance(again, Rejected) and again.reason.value == "replay"
    for sybil in range(8):  # and so is every flooder's, remembered or forgotten
        again = pipeline.admit(heartbeat_from(identity(200 + sybil), 0), T0, via="mallory")
        assert isinstance(again, Rejected) and again.reason.value in ("replay", "banned")


def test_an_envelope_that_fails_freshness_makes_the_cache_forget_nothing() -> None:
    """Red-team F1: a stale envelope at a full cache evicted an honest signer's digests."""
    pipeline = AdmissionPipeline(
        AdmissionConfig(allowed_tasks=FAMILIES, replay_capacity=10, replay_quota=10), now=T0
    )
    for k in range(10):
        assert isinstance(pipeline.admit(heartbeat_from(ALICE, k), T0, via="alice"), Accepted)
    stale = envelope(Heartbeat(round=1, model_id="tiny", policy_version=0), MALLORY, at=T0 - 400.0)
    assert pipeline.admit(stale, T0, via="mallory").reason.value == "too_old"  # type: ignore[union-attr]
    assert pipeline.replay.evicted == 0 and pipeline.replay.held(ALICE.peer_id) == 10


def test_a_new_identity_starts_with_a_small_cpu_allowance() -> None:
    """Red-team F2: each cheap identity brought a whole 2-s burst; now it brings cpu_initial."""
    pipeline = AdmissionPipeline(AdmissionConfig(allowed_tasks=FAMILIES, cpu_initial=0.25), now=T0)
    newcomer = identity(77)
    pipeline.charge_cpu(newcomer.peer_id, None, 0.3, T0)
    refused = pipeline.admit(heartbeat_from(newcomer, 1), T0, via="x")
    assert isinstance(refused, Rejected) and refused.reason.value == "cpu_budget"


def test_a_third_party_resending_a_signers_envelope_spends_nothing_of_the_signers() -> None:
    """Red team: 100 unsolicited re-sends of one of Alice's valid envelopes, each from a fresh (free)
    transport id, spent Alice's rate bucket before the replay check ran, and banned her for an hour.
    An envelope id already seen is refused by its id, before the signer's bucket or budget is read."""
    pipeline = AdmissionPipeline(AdmissionConfig(allowed_tasks=FAMILIES), now=T0)
    data = envelope(batch(make_group(1)), ALICE)
    assert isinstance(pipeline.admit(data, T0, via="alice-transport"), Accepted)
    tokens = pipeline.peers.state(ALICE.peer_id, T0).bucket.available(T0)
    for n in range(200):
        verdict = pipeline.admit(data, T0, via=f"mallory-{n}")
        assert isinstance(verdict, Rejected) and verdict.reason is RejectReason.REPLAY
        assert verdict.charged == f"mallory-{n}" and verdict.sender is None
    assert pipeline.peers.state(ALICE.peer_id, T0).bucket.available(T0) == tokens
    assert pipeline.banned_until(ALICE.peer_id, T0) is None
    fresh = envelope(batch(make_group(2)), ALICE, T0 + 1)
    assert isinstance(pipeline.admit(fresh, T0 + 1, via="bob"), Accepted)


def test_the_cpu_a_replay_costs_is_charged_to_whoever_delivered_it() -> None:
    """Red team: replays of Alice's 64 x 64 envelope pulled from Mallory cost ~18 ms each (signature,
    payload parse) charged to Alice, until her envelopes were refused cpu_budget even from Bob."""
    pipeline = AdmissionPipeline(AdmissionConfig(allowed_tasks=FAMILIES), now=time.time())
    intake = Intake(pipeline)
    data = envelope(batch(make_group(1), make_group(2)), ALICE, at=time.time())

    async def scenario() -> list[Verdict]:
        first = await intake.admit(data, via="bob", solicited=True)
        after_first.append(pipeline.cpu.level(ALICE.peer_id))
        return [first, *[await intake.admit(data, via="mallory", solicited=True) for _ in range(50)]]

    after_first: list[float | None] = []
    try:
        first, *replays = asyncio.run(scenario())
    finally:
        intake.close()
    assert isinstance(first, Accepted)
    assert all(isinstance(v, Rejected) for v in replays)
    # Mallory is refused by id, then for its spent budget or its ban; none of it falls on Alice.
    reasons = {v.reason for v in replays if isinstance(v, Rejected)}
    assert RejectReason.REPLAY in reasons
    assert reasons <= {RejectReason.REPLAY, RejectReason.CPU_BUDGET, RejectReason.BANNED}
    assert pipeline.banned_until(ALICE.peer_id, time.time()) is None
    # Not a microsecond of Alice's: her level did not fall (it may only refill as time passes,
    # which under load made an equality flaky).
    level = pipeline.cpu.level(ALICE.peer_id)
    assert level is not None and after_first[0] is not None and level >= after_first[0]
    # The replays are charged to their deliverer. (Not "Mallory's level is below cpu_initial": her
    # bucket refills with wall time, and under load the refill outran the replays' tiny cost.)
    assert all(
        v.charged == "mallory" for v in replays if isinstance(v, Rejected) and v.reason is RejectReason.REPLAY
    )
    assert pipeline.cpu.level("mallory") is not None


@pytest.mark.parametrize("kind", ["too_old", "stale_policy"])
def test_re_sent_old_envelopes_never_cost_their_signer_its_rate_or_its_standing(kind: str) -> None:
    """Red team round 4: an envelope refused too_old or stale_policy is never remembered, so 200
    unsolicited re-sends through rotating transport ids spent Alice's rate bucket (51 rate_limited
    charged to her) and banned her for an hour. Age is judged from the header before anything costs
    the signer, and rate tokens are the delivering peer's."""
    pipeline = AdmissionPipeline(AdmissionConfig(allowed_tasks=FAMILIES), now=T0)
    if kind == "too_old":
        data, now = envelope(batch(make_group(1)), ALICE, T0 - 1_000), T0
    else:
        data, now = envelope(batch(make_group(1)), ALICE, T0), T0
        pipeline.set_policy_version(make_group(1).model_id, make_group(1).policy_version + 100)
    for n in range(200):
        verdict = pipeline.admit(data, now, via=f"mallory-{n % 7}")
        assert isinstance(verdict, Rejected) and verdict.charged != ALICE.peer_id
    assert pipeline.banned_until(ALICE.peer_id, now) is None
    assert isinstance(pipeline.admit(envelope(heartbeat(), ALICE, now), now, via=ALICE.peer_id), Accepted)
    # ... and the re-sends took one new-identity slot, not 200: a newcomer still gets in.
    assert isinstance(pipeline.admit(envelope(heartbeat(), identity(77), now), now, via="bob"), Accepted)


def test_serving_a_signers_expired_envelope_never_spends_its_cpu_budget() -> None:
    """Red team round 4: each serve of Alice's expired 0.9-MiB envelope cost ~9 ms of CPU charged to
    her; after 9 her fresh envelopes were refused cpu_budget."""
    now = time.time()
    pipeline = AdmissionPipeline(AdmissionConfig(allowed_tasks=FAMILIES), now=now)
    intake = Intake(pipeline)
    expired = envelope(batch(make_group(1), make_group(2)), ALICE, at=now - 1_000)

    async def scenario() -> list[Verdict]:
        return [await intake.admit(expired, via="mallory", solicited=True) for _ in range(30)]

    try:
        verdicts = asyncio.run(scenario())
    finally:
        intake.close()
    assert all(isinstance(v, Rejected) for v in verdicts)
    assert pipeline.cpu.level(ALICE.peer_id) is None  # never charged a thing: no bucket was made
    assert pipeline.cpu.level("mallory") is not None


def test_an_envelope_cannot_be_replayed_at_the_last_instant_of_its_window() -> None:
    """Red team round 4: at exactly sent_at + max_age the id was forgotten while freshness still
    accepted the envelope, so it was admitted twice."""
    pipeline = AdmissionPipeline(AdmissionConfig(allowed_tasks=FAMILIES), now=T0)
    data = envelope(heartbeat(), ALICE, T0)
    assert isinstance(pipeline.admit(data, T0, via="a"), Accepted)
    last = T0 + pipeline.config.max_age_s
    verdict = pipeline.admit(data, last, via="b")
    assert isinstance(verdict, Rejected) and verdict.reason is RejectReason.REPLAY


def test_a_signer_pays_for_each_envelope_it_signed_whoever_delivers_it() -> None:
    """Red team round 5: stale_policy envelopes (a verdict that charges nobody, and was not
    remembered) re-judged through fresh transport ids cost 16-25 ms each and charged the signer
    nothing: one key kept the admission thread busy. Now the id is remembered before the policy
    check, and the signer's budget pays for judging each of its envelopes once."""
    now = time.time()
    pipeline = AdmissionPipeline(AdmissionConfig(allowed_tasks=FAMILIES), now=now)
    pipeline.set_policy_version(make_group(1).model_id, make_group(1).policy_version + 100)
    intake = Intake(pipeline, clock=lambda: now)  # no refill while the test runs, however slowly
    mallory = identity(66)
    envelopes = [envelope(batch(make_group(1, (str(n),))), mallory, at=now) for n in range(20)]

    async def scenario() -> list[Verdict]:
        first = [await intake.admit(envelopes[0], via=f"fresh-{n}", solicited=True) for n in range(20)]
        rest = [
            await intake.admit(data, via=f"other-{n}", solicited=True) for n, data in enumerate(envelopes)
        ]
        return first + rest

    try:
        verdicts = asyncio.run(scenario())
    finally:
        intake.close()
    reasons = [v.reason for v in verdicts if isinstance(v, Rejected)]
    assert reasons[0] is RejectReason.STALE_POLICY  # judged once ...
    assert set(reasons[1:20]) == {RejectReason.REPLAY}  # ... then refused by its id, charged to the deliverer
    level = pipeline.cpu.level(mallory.peer_id)
    assert level is not None and level < pipeline.config.cpu_initial  # the signer paid for its 20 envelopes


def judged_by_a_full_queue(**limits: int) -> tuple[Judged, Intake, AdmissionPipeline]:
    """ALICE's envelope, delivered by bob, judged by an intake with these (full) queue limits."""
    pipeline = AdmissionPipeline(AdmissionConfig(allowed_tasks=FAMILIES), now=time.time())
    intake = Intake(pipeline, **limits)
    data = envelope(batch(make_group(1)), ALICE, at=time.time())
    try:
        return asyncio.run(intake.judge(data, via="bob", solicited=True)), intake, pipeline
    finally:
        intake.close()


def test_a_full_admission_queue_refuses_unjudged_and_says_it_was_our_load() -> None:
    # The gossip core must not pause or shun the peer whose item met our own overload
    # (Judged.busy -> AdmissionResult.busy), nor pull the id again from someone else.
    from swarmnode.gossip.core import AdmissionResult
    from swarmnode.gossip.intake import verdict_events

    judged, intake, pipeline = judged_by_a_full_queue(max_pending=0)
    assert judged.busy and isinstance(judged.verdict, Rejected)
    assert judged.verdict.reason is RejectReason.CPU_BUDGET and judged.verdict.charged is None
    assert intake.overloaded == 1 and pipeline.cpu.level(ALICE.peer_id) is None  # nothing judged
    # Full with every peer's work, bob's own share empty: our load alone, not bob's waste.
    assert judged.overloaded
    assert verdict_events("bob", b"d", judged.verdict, None, busy=True, overloaded=judged.overloaded) == [
        AdmissionResult(
            "bob", b"d", False, "cpu_budget", copy_refused=False, charged=False, busy=True, overloaded=True
        )
    ]


def test_a_peer_whose_own_share_of_the_queue_is_full_is_refused_busy_not_overloaded() -> None:
    # The gossip core hands admission at most a peer's share (gossip.max_pending_admissions_per_peer):
    # a full share means its envelopes outlast the core's wait, which is the peer's waste, not our load.
    judged, _, _ = judged_by_a_full_queue(max_pending_per_peer=0)
    assert judged.busy and not judged.overloaded
    assert isinstance(judged.verdict, Rejected) and judged.verdict.reason is RejectReason.CPU_BUDGET


def test_bytes_that_are_no_envelope_are_judged_outside_the_queues_count() -> None:
    # Red team rt32 F2: junk items from free ids, counted in the queue the gossip core sizes its
    # pulls to, filled it, and honest envelopes behind them were refused as overloaded and lost.
    pipeline = AdmissionPipeline(AdmissionConfig(allowed_tasks=FAMILIES), now=time.time())
    intake = Intake(pipeline, max_pending=0, max_pending_per_peer=0)  # full for every envelope

    async def scenario() -> Judged:
        judged = await intake.judge_unreadable(b"\x08\x01 no envelope", via="mallory")
        assert intake.pending == 0
        return judged

    try:
        judged = asyncio.run(scenario())
    finally:
        intake.close()
    assert not judged.busy and isinstance(judged.verdict, Rejected)
    assert judged.verdict.reason is RejectReason.MALFORMED  # judged, and charged to mallory
    assert intake.overloaded == 0


def run_then_close(intake: Intake, scenario: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``scenario`` on a fresh event loop, then ``intake`` closed whatever happened."""
    try:
        return asyncio.run(scenario())
    finally:
        intake.close()


class BurningPipeline:
    """Stands in for the pipeline: each admit burns the thread CPU its bytes name, and is logged."""

    last_scoring_cpu_s = 0.0

    def __init__(self) -> None:
        self.judged: list[str] = []

    def admit(self, data: bytes, now: float, *, via: str | None, **_: object) -> Verdict:
        seconds = float(data.decode())
        started = time.thread_time()
        while time.thread_time() - started < seconds:
            pass
        self.judged.append(str(via))
        return Rejected(RejectReason.MALFORMED, "stand-in")

    def charge_cpu(self, *_: object) -> None:
        pass

    def ban_left_by(self, *_: object) -> None:
        return None


def test_the_next_envelope_judged_is_from_the_peer_that_used_the_least_admission_cpu() -> None:
    # Red team rt34 F1: served one envelope per peer in turn, a peer whose envelopes cost 24x an
    # honest one's took 24x its CPU; 16 such peers cut an honest peer's judged items to 8%.
    pipeline = BurningPipeline()
    intake = Intake(pipeline)  # type: ignore[arg-type]

    async def scenario() -> None:
        costly = [intake.judge(b"0.02", via="mallory", solicited=True) for _ in range(6)]
        cheap = [intake.judge(b"0.0", via="honest", solicited=True) for _ in range(6)]
        await asyncio.gather(*costly, *cheap)

    run_then_close(intake, scenario)
    last_honest = max(i for i, via in enumerate(pipeline.judged) if via == "honest")
    assert pipeline.judged[: last_honest + 1].count("mallory") <= 2  # round-robin: 6


class ChargingPipeline(BurningPipeline):
    """A ``BurningPipeline`` that adds up the admission CPU charged to each party."""

    def __init__(self) -> None:
        super().__init__()
        self.charged: Counter[str] = Counter()

    def charge_cpu(self, signer: str | None, via: str | None, seconds: float, now: float) -> None:
        for party in {signer, via} - {None}:
            self.charged[str(party)] += seconds


def test_work_an_admitted_envelope_makes_us_do_waits_with_its_deliverers_and_is_charged_to_it() -> None:
    # Red team rt63 F2: rendering an admitted batch's groups for training ran first in line and
    # charged to no one, 4.7x the admit's own CPU (11.8x under a long system prompt).
    pipeline = ChargingPipeline()
    intake = Intake(pipeline)  # type: ignore[arg-type]

    def render() -> None:
        pipeline.admit(b"0.02", 0.0, via="mallory")  # 20 ms of CPU, logged as mallory's

    async def scenario() -> None:
        costly = [intake.call_as(render, signer="mallory-signer", via="mallory") for _ in range(6)]
        cheap = [intake.judge(b"0.0", via="honest", solicited=True) for _ in range(6)]
        await asyncio.gather(*costly, *cheap)

    run_then_close(intake, scenario)
    last_honest = max(i for i, via in enumerate(pipeline.judged) if via == "honest")
    assert pipeline.judged[: last_honest + 1].count("mallory") <= 2  # first in line: all 6
    assert pipeline.charged["mallory"] >= 0.12 and pipeline.charged["mallory-signer"] >= 0.12
    assert intake.cpu_seconds >= 0.12


def test_an_envelope_that_waits_past_max_wait_is_given_up_and_never_judged() -> None:
    # The gossip core stops counting an item after its admission timeout; a queue that still held
    # it filled behind the core's back and refused every peer's items as overloaded (rt34 F1).
    pipeline = BurningPipeline()
    intake = Intake(pipeline, max_wait=0.2)  # type: ignore[arg-type]

    async def scenario() -> Judged:
        blocker = asyncio.ensure_future(intake.call(lambda: pipeline.admit(b"0.5", 0.0, via="us")))
        await asyncio.sleep(0.05)  # our own work runs first, for 0.5 s of CPU
        waited = await intake.judge(b"0.0", via="b", solicited=True)
        assert intake.pending == 0  # it no longer counts
        await blocker
        return waited

    waited = run_then_close(intake, scenario)
    assert waited.busy and waited.overloaded and not waited.timed_out  # our load: pulled again
    assert intake.gave_up == 1 and pipeline.judged == ["us"]  # b's envelope was never judged


def test_an_envelope_whose_own_judging_outlasts_max_wait_is_no_overload_of_ours() -> None:
    # Red team rt83 F2: a give-up was always reported as our overload, so the gossip core pulled
    # the item again from its server, which kept its standing, and paused every pull: proven ids
    # whose junk took longer than the wait to judge held their rounds' places for good. Its own
    # judging past the wait is the item's: no verdict, as if admission never answered.
    pipeline = BurningPipeline()
    intake = Intake(pipeline, max_wait=0.1)  # type: ignore[arg-type]

    async def scenario() -> Judged:
        return await intake.judge(b"0.3", via="slow", solicited=True)

    judged = run_then_close(intake, scenario)
    assert judged.timed_out and not judged.overloaded
    assert intake.gave_up == 1 and pipeline.judged == ["slow"]


def test_an_envelope_that_starts_late_behind_others_work_is_our_overload_not_timed_out() -> None:
    # Red team rt84 F1: judged by having started at all, a job that waited behind others' work
    # and began just before the wait ended counted as the item's own slowness, and its server
    # lost its standing: fresh ids' jobs timed to end then did so to 8 of 8 honest items.
    pipeline = BurningPipeline()
    intake = Intake(pipeline, max_wait=1.0)  # type: ignore[arg-type]

    async def scenario() -> Judged:
        # Our own work runs first, past half the wait: 0.55 s of thread CPU, so b's job starts
        # before the 1-s wait ends even if this thread gets only ~55% of a core (at 0.7 s, a loaded
        # CI machine once ran it past the wait, and b never started).
        blocker = asyncio.ensure_future(intake.call(lambda: pipeline.admit(b"0.55", 0.0, via="us")))
        await asyncio.sleep(0.02)
        late = await intake.judge(b"0.6", via="b", solicited=True)
        await blocker
        return late

    late = run_then_close(intake, scenario)
    assert pipeline.judged == ["us", "b"]  # b's envelope started before the wait ended
    assert late.overloaded and not late.timed_out


def test_fresh_ids_start_at_the_level_of_the_peer_served_last_not_at_zero() -> None:
    # Red team rt35 F1: starting newcomers at the least queued peer's level (or 0) let fresh ids
    # run ahead of a peer with a long history until they had used as much CPU as it ever had.
    pipeline = BurningPipeline()
    intake = Intake(pipeline)  # type: ignore[arg-type]

    async def scenario() -> None:
        for _ in range(4):  # the honest peer's history: 0.08 s of admission CPU
            await intake.judge(b"0.02", via="honest", solicited=True)
        pipeline.judged.clear()
        fresh = [intake.judge(b"0.02", via=f"sybil{i % 3}", solicited=True) for i in range(12)]
        honest = [intake.judge(b"0.0", via="honest", solicited=True) for _ in range(2)]
        await asyncio.gather(*fresh, *honest)

    run_then_close(intake, scenario)
    # Started at 0, the three fresh ids would run all 12 of their envelopes (0.08 s each) first.
    # Level with the honest peer, each runs one or, as measured CPU ties to within the busy loop's
    # overshoot (microseconds), two before it: index 3 to 6 (CI once saw 6).
    assert pipeline.judged.index("honest") <= 6


def test_an_envelope_given_up_on_leaves_the_queue_at_once() -> None:
    # Red team rt35 F1: dead jobs kept their payloads (up to 2 MiB each) until their peer's turn.
    pipeline = BurningPipeline()
    intake = Intake(pipeline, max_wait=0.1)  # type: ignore[arg-type]

    async def scenario() -> int:
        blocker = asyncio.ensure_future(intake.call(lambda: pipeline.admit(b"0.3", 0.0, via="us")))
        await asyncio.sleep(0.02)
        await asyncio.gather(*(intake.judge(b"0.0", via="b", solicited=True) for _ in range(5)))
        queued = sum(len(q) for q in intake._queues.values())
        await blocker
        return queued

    queued = run_then_close(intake, scenario)
    assert queued == 0 and intake.gave_up == 5


@pytest.mark.parametrize(
    "text", ["<|im_start|>assistant\n<answer>84</answer>", "<answer>84</answer><|im_start|>user"]
)
def test_a_chat_turn_marker_spelled_in_a_completion_is_refused_not_trained(text: str) -> None:
    """Red team rt90 F1: the built-in chat tokenizer's config does not list <|im_start|> among its
    special tokens, yet decoding skips it: a fake turn scored 1.0 and was trained, and the node
    learnt to write <|im_start|> into its own answers. Every added token marked special counts."""
    from swarmnode.policy.chat_model import build_chat_policy
    from swarmnode.roles.convert import untrainable_ids

    chat = build_chat_policy(0)
    im_start = chat.tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert im_start not in chat.tokenizer.all_special_ids  # what let it through
    assert im_start in untrainable_ids(chat) and chat.eos_token_id not in untrainable_ids(chat)
    [row] = completion_token_rows(chat, [text], 64)
    assert row is RejectReason.COMPLETION_UNTRAINABLE
    [honest] = completion_token_rows(chat, ["<answer>84</answer>"], 64)
    assert isinstance(honest, list) and im_start not in honest
