"""Specification of gossip intake (swarmnode/gossip/intake.py): the rules between the gossip core and
admission that the node's driver and both simulator modes share. Plain calls, no loop."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import cast

import pytest

import swarmnode.admit.pipeline as pipeline_module
import swarmnode.gossip.intake as intake_module
from swarmnode.admit import AdmissionConfig, AdmissionPipeline, Rejected, RejectReason
from swarmnode.core import PeerBanned
from swarmnode.gossip import AdmissionResult, Admit, Announced, GossipConfig, GossipCore, Pull, PullSucceeded
from swarmnode.gossip.intake import (
    NOT_A_ROLLOUT_BATCH,
    DecodedEnvelopes,
    ExternalPool,
    SenderTallies,
    admission_events,
    decode_pulled,
    envelope_digest,
    publication,
    verdict_events,
)
from swarmnode.identity import NodeIdentity
from swarmnode.tools import vectors
from swarmnode.tools.protocol_cli import pipeline_for_context
from swarmnode.train.batch import ScoredGroup
from swarmnode.wire import Envelope, Heartbeat, RolloutBatch, decode_envelope, encode_envelope, seal, to_ms

T0 = vectors.NOW
ALICE = NodeIdentity.from_seed(bytes(31) + b"\x01")


def heartbeat_bytes(round: int = 1, at: float = T0) -> bytes:
    return encode_envelope(seal(ALICE, Heartbeat(round=round, model_id="tiny", policy_version=0), to_ms(at)))


def batch_bytes(index: int = 0, at: float = T0) -> bytes:
    """ALICE's rollout batch of one chain_sum group, which the vectors' receiver admits."""
    task = vectors.vector_task(index)
    group = vectors.vector_group(task, [str(task.entry["answer"]), "5"])
    return encode_envelope(seal(ALICE, RolloutBatch(groups=(group,)), to_ms(at)))


def vectors_receiver() -> AdmissionPipeline:
    """A fresh receiver in the state every protocol vector is judged in."""
    return pipeline_for_context(vectors.context())


def decoded(data: bytes) -> Envelope:
    value = decode_envelope(data)
    assert isinstance(value, Envelope)
    return value


@dataclass(frozen=True)
class StandInGroup:
    """What the pool looks at in a group: its signer (``ScoredGroup.source``), nothing else."""

    tag: int
    source: str


def scored(tag: int, source: str = "alice") -> ScoredGroup:
    return cast(ScoredGroup, StandInGroup(tag, source))


# -- own envelopes -------------------------------------------------------------------------------


def test_an_own_envelope_is_published_under_its_envelope_id_with_its_encoded_size() -> None:
    data = heartbeat_bytes()
    event = publication(decoded(data), data)
    assert event.digest == decoded(data).envelope_id() == envelope_digest(data)
    assert event.size == len(data)
    assert envelope_digest(b"\xff not an envelope") == b""


# -- pulled bytes: decoded once ------------------------------------------------------------------


def test_pulled_envelopes_reach_the_core_by_id_and_their_decode_waits_for_their_admit() -> None:
    first, second = batch_bytes(1), batch_bytes(2)
    held = DecodedEnvelopes()
    pulled = decode_pulled([first, b"\x08\x01 garbage", second], held)
    assert pulled.items == ((envelope_digest(first), first), (envelope_digest(second), second))
    assert pulled.not_envelopes == (b"\x08\x01 garbage",)  # still judged, and charged, by admission
    assert pulled.unreadable == ("malformed",)  # and held against its server by the core
    assert held.take(first) == decoded(first)
    assert held.take(first) is None  # handed out once
    assert held.take(bytes(bytearray(second))) is None  # equal bytes are not these bytes
    held.clear()
    assert len(held) == 0 and held.take(second) is None


def test_two_payloads_with_one_envelope_id_each_keep_their_own_decode() -> None:
    # The envelope id does not cover the signature: a peer can send other bytes under an honest id.
    # Admission must judge the decode of exactly the bytes it is given, never its twin's.
    honest = batch_bytes()
    twin = encode_envelope(replace(decoded(honest), signature=bytes(64)))
    held = DecodedEnvelopes()
    pulled = decode_pulled([honest, twin], held)
    assert pulled.items[0][0] == pulled.items[1][0]
    assert held.take(twin) == decoded(twin) and held.take(honest) == decoded(honest)


def test_a_pulled_envelope_of_another_kind_than_a_rollout_batch_is_never_admitted() -> None:
    # Red team rt32 F1, F4: announcements list rollout batches only, yet heartbeats and self-signed
    # weight manifests were admitted, and bought their server score and credit for free.
    core = GossipCore(GossipConfig(round_seconds=30.0, epoch=T0 - 1.0, read_interval=1.0), "me")
    beat = heartbeat_bytes()
    held = DecodedEnvelopes()
    pulled = decode_pulled([beat, batch_bytes()], held)
    assert [payload for _, payload in pulled.items] == [batch_bytes()]
    assert pulled.not_envelopes == () and pulled.unreadable == (NOT_A_ROLLOUT_BATCH,)
    assert held.take(beat) is None  # nothing waits for an Admit of it
    (pull,) = [a for a in core.handle(Announced("p", 0, (envelope_digest(beat),)), T0) if isinstance(a, Pull)]
    actions = core.handle(PullSucceeded(pull.request_id, "p", (), unreadable=pulled.unreadable), T0)
    assert not [a for a in actions if isinstance(a, Admit)]
    assert core.stats.items_unreadable == 1 and core._peers["p"].score < 0  # held against its server


def test_a_pulled_envelope_is_decoded_once_from_pull_to_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    """Core, decode and admission driven by hand, as the driver does: one decode per envelope."""
    core = GossipCore(GossipConfig(round_seconds=30.0, epoch=T0 - 1.0, read_interval=1.0), "me")
    admission = vectors_receiver()
    data = batch_bytes()
    digest = envelope_digest(data)
    (pull,) = [a for a in core.handle(Announced("relay", 0, (digest,)), T0) if isinstance(a, Pull)]
    calls: list[bytes] = []
    real = intake_module.decode_envelope

    def counting(raw: bytes) -> object:
        calls.append(raw)
        return real(raw)

    monkeypatch.setattr(intake_module, "decode_envelope", counting)
    monkeypatch.setattr(pipeline_module, "decode_envelope", counting)
    held = DecodedEnvelopes()
    pulled = decode_pulled([data], held)
    actions = core.handle(PullSucceeded(pull.request_id, "relay", pulled.items), T0)
    (admit,) = [a for a in actions if isinstance(a, Admit)]
    envelope = held.take(admit.payload)
    verdict = admission.admit(admit.payload, T0, via=admit.peer, solicited=True, envelope=envelope)
    events = verdict_events(admit.peer, admit.digest, verdict, admission.ban_left_by(verdict, admit.peer, T0))
    core.handle_all(events, T0)
    assert calls == [data]
    assert verdict.accepted and core.stats.accepted == 1


# -- verdicts ------------------------------------------------------------------------------------


def test_an_acceptance_is_one_accepted_result_for_the_digest() -> None:
    assert admission_events("p", b"d", accepted=True, reason="accepted", banned_until=None) == [
        AdmissionResult("p", b"d", True, "accepted")
    ]


def test_a_rejection_that_left_a_ban_stops_the_core_pulling_from_the_delivering_peer() -> None:
    verdict = Rejected(RejectReason.BAD_SIGNATURE, "forged", charged="p")
    refused = AdmissionResult("p", b"d", False, "bad_signature", copy_refused=True)  # only this copy
    assert verdict_events("p", b"d", verdict, T0 + 60) == [refused, PeerBanned("p", T0 + 60)]
    assert verdict_events("p", b"d", verdict, None) == [refused]


RECEIVER_DEPENDENT = (
    RejectReason.COMPLETION_TOO_LONG,
    RejectReason.STALE_POLICY,
    RejectReason.TASK_NOT_ALLOWED,
)


def test_a_ban_on_the_signer_lets_the_delivering_peers_pulls_run_to_their_end() -> None:
    # The signer's ban stops pulls from the peer that delivered its envelope, but its pulls in
    # flight are not cancelled: their other items (another signer's, or the peer's own junk) are
    # still judged each for itself. A ban on the delivering peer itself cancels them.
    signer = Rejected(RejectReason.PROMPT_MISMATCH, "lies", sender="s", charged="s")
    refused = AdmissionResult("p", b"d", False, "prompt_mismatch")
    assert verdict_events("p", b"d", signer, T0 + 60) == [refused, PeerBanned("p", T0 + 60, for_signer=True)]
    # The simulator names a peer and its signer alike; the node does not (libp2p id, Ed25519 id).
    own = Rejected(RejectReason.PROMPT_MISMATCH, "lies", sender="p", charged="p")
    assert verdict_events("p", b"d", own, T0 + 60)[-1] == PeerBanned("p", T0 + 60, for_signer=False)
    deliverer = Rejected(RejectReason.BANNED, "banned", sender="s", charged="p")  # names the deliverer
    assert verdict_events("p", b"d", deliverer, T0 + 60)[-1] == PeerBanned("p", T0 + 60, for_signer=False)


def test_a_rejection_admission_charges_to_nobody_is_reported_uncharged() -> None:
    # Receiver-dependent reasons (admit.reasons.CHARGE: nobody) must not count toward the core
    # shunning the server; every charged one does.
    for reason in RECEIVER_DEPENDENT:
        verdict = Rejected(reason, "receiver-dependent", sender="s")
        assert verdict_events("p", b"d", verdict, None) == [
            AdmissionResult("p", b"d", False, reason.value, charged=False)
        ]
    charged = Rejected(RejectReason.INVALID_PAYLOAD, "bad", sender="s", charged="s")
    assert verdict_events("p", b"d", charged, None) == [AdmissionResult("p", b"d", False, "invalid_payload")]


def test_admission_charges_nobody_for_each_reason_the_core_then_ignores() -> None:
    # The pipeline's Rejected.charged is what verdict_events reads: None exactly for CHARGE nobody.
    from swarmnode.admit.reasons import CHARGE, Charge

    uncharged = {r for r, c in CHARGE.items() if c is Charge.NOBODY}
    assert set(RECEIVER_DEPENDENT) <= uncharged
    assert RejectReason.INVALID_PAYLOAD not in uncharged


def test_bytes_that_were_no_envelope_report_only_the_ban_they_left() -> None:
    verdict = Rejected(RejectReason.MALFORMED, "not an Envelope", charged="p")
    assert verdict_events("p", None, verdict, T0 + 60) == [PeerBanned("p", T0 + 60)]
    assert verdict_events("p", None, verdict, None) == []


def test_the_verdict_events_name_the_pipelines_reason() -> None:
    admission = AdmissionPipeline(AdmissionConfig(allowed_tasks=frozenset(vectors.ALLOWED_TASKS)), now=T0)
    group = vectors.vector_group(vectors.vector_task(0), ["1"])
    data = encode_envelope(seal(ALICE, RolloutBatch(groups=(group,)), to_ms(T0)))
    verdict = admission.admit(data, T0, via="p")
    (result,) = verdict_events("p", envelope_digest(data), verdict, None)
    assert isinstance(result, AdmissionResult)
    assert result.accepted == verdict.accepted
    assert result.reason == ("accepted" if verdict.accepted else verdict.reason.value)


# -- admitted groups -----------------------------------------------------------------------------


def test_the_pool_hands_out_each_fresh_group_once_and_drops_the_oldest_past_its_capacity() -> None:
    pool = ExternalPool(capacity=3, keep_rounds=1)
    for tag, arrived in ((1, 5), (2, 8), (3, 9), (4, 9)):
        pool.add(scored(tag), arrived)
    assert len(pool) == 3  # group 1 dropped: the oldest
    assert pool.take_all(10) == [scored(3), scored(4)]  # group 2 is too old for round 10
    assert pool.take_all(10) == [] and len(pool) == 0


def test_sender_tallies_are_bounded_and_count_our_rewards_beside_the_claimed_ones() -> None:
    group = vectors.vector_group(vectors.vector_task(0), ["1", "2"])
    tallies = SenderTallies(limit=2)
    tallies.add("alice", [1.0, 0.0], group)
    tallies.add("alice", [1.0, 1.0], group)
    tallies.add("carol", [1.0], group)
    tallies.add("bob", [1.0], group)  # past the limit: takes the place of the one with fewest groups
    assert set(tallies.as_dict()) == {"alice", "bob"}
    only = ("alice", tallies.as_dict()["alice"])
    assert only[1]["groups"] == 2 and only[1]["completions"] == 4 and only[1]["reward_sum"] == 3.0
    claimed = 2 * sum(c.claimed_reward_informational for c in group.completions)
    assert only[1]["claimed_reward_sum"] == claimed
    # Groups trained on and remembered answers replayed (red team rt60 L4), per tallied signer only.
    tallies.used({"alice": 2, "local": 8}, {"alice": 5, "bob": 1, "local": 30})
    assert {k: tallies.as_dict()["alice"][k] for k in ("used", "replayed")} == {"used": 2, "replayed": 5}
    assert tallies.as_dict()["bob"]["replayed"] == 1 and "local" not in tallies.as_dict()


def test_one_signers_flood_evicts_its_own_groups_not_those_of_others() -> None:
    # Red team F3: one fresh identity's 512 admitted groups used to evict every honest group.
    pool = ExternalPool(capacity=8)
    honest = [scored(i, "honest") for i in range(3)]
    for group in honest:
        pool.add(group, 5)
    flood = [scored(100 + i, "mallory") for i in range(50)]
    for group in flood:
        pool.add(group, 5)
    assert len(pool) == 8
    assert pool.take_all(5) == [*honest, *flood[-5:]]  # arrival order; mallory keeps its newest


def test_a_full_pool_drops_the_oldest_group_of_the_signer_holding_the_most() -> None:
    pool = ExternalPool(capacity=4)
    for group in (scored(1, "a"), scored(2, "a"), scored(3, "b"), scored(4, "a"), scored(5, "b")):
        pool.add(group, 1)  # full at 4: the fifth evicts a's oldest (a holds 3)
    pool.add(scored(6, "c"), 1)  # a and b hold 2 each: b got to 2 first, its oldest goes
    assert pool.take_all(1) == [scored(2, "a"), scored(4, "a"), scored(5, "b"), scored(6, "c")]
    assert len(pool) == 0
    for i in range(10):  # emptied: counts start again from nothing
        pool.add(scored(i, "b"), 2)
    assert pool.take_all(2) == [scored(i, "b") for i in range(6, 10)]


def test_a_broken_copy_of_an_honest_envelope_does_not_keep_the_genuine_one_out() -> None:
    """Red team F2, driven as the node's driver does: core, decode once, real admission."""
    core = GossipCore(GossipConfig(round_seconds=30.0, epoch=T0 - 1.0, read_interval=1.0), "me")
    admission = vectors_receiver()
    genuine = batch_bytes()
    digest = envelope_digest(genuine)
    envelope = decoded(genuine)
    forged = encode_envelope(
        replace(envelope, signature=bytes([envelope.signature[0] ^ 1]) + envelope.signature[1:])
    )
    assert envelope_digest(forged) == digest  # the id does not cover the signature
    served = {"a-racer": forged, "honest": genuine}  # the racer's id sorts first: it is pulled first
    held = DecodedEnvelopes()
    verdicts: list[tuple[str, str]] = []
    actions = core.handle_all([Announced("a-racer", 0, (digest,)), Announced("honest", 0, (digest,))], T0)
    while actions:
        action = actions.pop(0)
        if isinstance(action, Pull):
            pulled = decode_pulled([served[action.peer]], held)
            actions += core.handle(PullSucceeded(action.request_id, action.peer, pulled.items), T0)
        elif isinstance(action, Admit):
            verdict = admission.admit(action.payload, T0, via=action.peer, envelope=held.take(action.payload))
            verdicts.append((action.peer, "accepted" if verdict.accepted else cast(Rejected, verdict).reason))
            banned_until = admission.ban_left_by(verdict, action.peer, T0)
            actions += core.handle_all(verdict_events(action.peer, action.digest, verdict, banned_until), T0)
    assert verdicts == [("a-racer", RejectReason.BAD_SIGNATURE), ("honest", "accepted")]
    assert core.stats.copies_refused == 1


def test_only_rejections_of_the_bytes_or_their_deliverer_leave_the_id_open() -> None:
    def refused(reason: RejectReason, sender: str | None = None) -> bool:
        (result,) = verdict_events("p", b"d", Rejected(reason, "x", sender=sender), None)
        assert isinstance(result, AdmissionResult)
        return result.copy_refused

    for reason in (RejectReason.TOO_LARGE, RejectReason.MALFORMED, RejectReason.BAD_SIGNATURE):
        assert refused(reason)
    assert refused(RejectReason.BANNED) and refused(RejectReason.CPU_BUDGET)  # the deliverer's
    assert not refused(RejectReason.BANNED, sender="signer")  # the signer's: about the content
    assert not refused(RejectReason.CPU_BUDGET, sender="signer")
    for reason in (RejectReason.REPLAY, RejectReason.TOO_OLD, RejectReason.PROMPT_MISMATCH):
        assert not refused(reason)  # these name the id's own signed content


def test_refusals_for_the_receivers_shared_state_are_reported_busy() -> None:
    # Red team rt23: an attacker drained the new-identity budget, and an honest newcomer's items,
    # refused new_identity_limit, got it paused for 10 minutes. Busy results pause nobody.
    # Never reported as our overload, which would spare the server its waste: a proven peer
    # serving envelopes of fresh signers drains the new-identity budget itself (rt29 F1).
    for reason in (RejectReason.NEW_IDENTITY_LIMIT, RejectReason.REPLAY_CACHE_FULL):
        for overloaded in (False, True):
            assert verdict_events("p", b"d", Rejected(reason, "ours"), None, overloaded=overloaded) == [
                AdmissionResult("p", b"d", False, reason.value, charged=False, busy=True)
            ]
    refused = Rejected(RejectReason.TASK_NOT_ALLOWED, "another family", sender="s")
    assert verdict_events("p", b"d", refused, None) == [
        AdmissionResult("p", b"d", False, "task_not_allowed", charged=False)
    ]


def test_the_driver_feeds_no_verdict_for_an_item_whose_judging_outlasted_the_wait() -> None:
    # Red team rt83 F2: reported as our overload, the item was pulled again from its server,
    # which kept its standing. With no verdict, the core's admission timeout decides: its server
    # is not proven until another of its items is accepted, and the id is not pulled again.
    import asyncio

    from swarmnode.admit.intake import Judged
    from swarmnode.gossip.driver import GossipDriver
    from swarmnode.net.hivemind_runtime import HivemindRuntime
    from swarmnode.ops.metrics import Metrics

    class SlowIntake:
        async def judge(self, *_args: object, **_kwargs: object) -> Judged:
            refused = Rejected(RejectReason.CPU_BUDGET, "its judging took over 54 s")
            return Judged(refused, busy=True, timed_out=True)

    admission = AdmissionPipeline(AdmissionConfig(allowed_tasks=frozenset()), now=0.0)
    runtime = cast(HivemindRuntime, None)  # not touched before start()
    driver = GossipDriver(
        GossipCore(GossipConfig(), "me"), runtime, admission, ExternalPool(), print, Metrics(), "s"
    )
    driver.intake.close()
    driver.intake = SlowIntake()  # type: ignore[assignment]
    asyncio.run(driver._admit(Admit("p", b"d" * 32, b"payload")))
    assert driver._pending == []


def test_the_drivers_admission_queue_holds_all_the_core_may_hand_it() -> None:
    # Red team rt31 F3: items the core hands past admission's queue are refused unjudged, lost,
    # and held against their server. Its limits are the core's, in all and per peer.
    from swarmnode.gossip.driver import GossipDriver
    from swarmnode.net.hivemind_runtime import HivemindRuntime
    from swarmnode.ops.metrics import Metrics

    config = GossipConfig(max_pending_admissions=100, max_pending_admissions_per_peer=7)
    admission = AdmissionPipeline(AdmissionConfig(allowed_tasks=frozenset()), now=0.0)
    runtime = cast(HivemindRuntime, None)  # not touched before start()
    driver = GossipDriver(GossipCore(config, "me"), runtime, admission, ExternalPool(), print, Metrics(), "s")
    try:
        assert (driver.intake.max_pending, driver.intake.max_pending_per_peer) == (100, 7)
        # It stops waiting before the core does, or it counts items the core no longer counts.
        assert driver.intake.max_wait is not None and driver.intake.max_wait < config.admission_timeout
    finally:
        driver.intake.close()


def test_the_driver_charges_rendering_an_admitted_batch_to_its_signer_and_deliverer() -> None:
    # Red team rt63 F2: turning an admitted batch's groups into training groups (rendering the
    # prompt, tokenizing) ran in the admission thread first in line and charged to no one: 4.7x
    # the admit's own CPU on the chat model, 11.8x under a 4,096-character system prompt.
    import asyncio
    import time
    from types import SimpleNamespace

    from swarmnode.admit.intake import Intake
    from swarmnode.gossip.driver import GossipDriver
    from swarmnode.net.hivemind_runtime import HivemindRuntime
    from swarmnode.ops.metrics import Metrics

    admission = vectors_receiver()
    rendering = 0.3  # seconds of CPU a group takes to render, far more than its admit

    def convert(admitted: object) -> ScoredGroup:
        deadline = time.thread_time() + rendering
        while time.thread_time() < deadline:
            pass
        return cast(ScoredGroup, SimpleNamespace(source=ALICE.peer_id, rewards=[1.0, 0.0]))

    core = GossipCore(GossipConfig(), "me")
    runtime = cast(HivemindRuntime, None)  # not touched: no pull, no announcement
    intake = Intake(admission, clock=lambda: T0)  # the vectors' receiver judges at T0
    driver = GossipDriver(core, runtime, admission, ExternalPool(), convert, Metrics(), "s", intake=intake)
    data = batch_bytes()
    try:
        asyncio.run(driver._admit(Admit("relay", envelope_digest(data), data)))
    finally:
        intake.close()
    assert len(driver.pool) == 1  # admitted, and rendered
    for party in (ALICE.peer_id, "relay"):
        level = admission.cpu.level(party)
        assert level is not None and level <= vectors.CPU_INITIAL - rendering, party
