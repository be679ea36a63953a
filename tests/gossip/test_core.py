"""Specification of the sans-IO gossip core (swarmnode/gossip/core.py). Each test name is a rule."""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import itertools
import random
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from swarmnode.core import PeerBanned, round_at
from swarmnode.errors import ConfigError
from swarmnode.gossip import (
    AdmissionResult,
    Admit,
    Announce,
    Announced,
    CancelPull,
    GossipAction,
    GossipConfig,
    GossipCore,
    GossipEvent,
    Publish,
    Pull,
    PullFailed,
    PullRequest,
    PullSucceeded,
    ReadAnnouncements,
    Retire,
    Serve,
)

A = TypeVar("A")


def cfg(**overrides: Any) -> GossipConfig:
    """Small numbers so that rules show in a few calls; every other knob at its default."""
    base: dict[str, Any] = dict(
        round_seconds=10.0,
        read_interval=1.0,
        announce_delay=0.5,
        pull_timeout=5.0,
        backoff_base=1.0,
        backoff_max=8.0,
        admission_timeout=5.0,
        rejection_shun_seconds=100.0,
    )
    base.update(overrides)
    return GossipConfig(**base)


def d(i: int) -> bytes:
    return hashlib.sha256(b"item-%d" % i).digest()


def sha(payload: bytes) -> bytes:
    return hashlib.sha256(payload).digest()


def only(kind: type[A], actions: list[GossipAction]) -> list[A]:
    return [a for a in actions if isinstance(a, kind)]


def started(config: GossipConfig | None = None, now: float = 0.0, **kwargs: Any) -> GossipCore:
    """A core that has done its first poll (the first read is behind it)."""
    core = GossipCore(config or cfg(), "me", **kwargs)
    core.poll(now)
    return core


def announce(core: GossipCore, peer: str, digests: list[bytes], now: float) -> list[GossipAction]:
    return core.handle(Announced(peer, core.current_round(now), tuple(digests)), now)


def succeed(core: GossipCore, pull: Pull, now: float, payload: bytes = b"x") -> list[GossipAction]:
    items = tuple((digest, payload + digest) for digest in pull.digests)
    return core.handle(PullSucceeded(pull.request_id, pull.peer, items), now)


def served_once(core: GossipCore, peer: str, now: float, *, accepted: bool = False) -> None:
    """``peer`` serves its first pull, a small one of one item, intact (``accepted``: and admission
    accepts it). Its next pulls are small too: neither established nor on credit."""
    intro = hashlib.sha256(b"intro-" + peer.encode()).digest()
    [probe] = only(Pull, announce(core, peer, [intro], now))
    assert probe.digests == (intro,)  # a small pull: one item
    succeed(core, probe, now)
    if accepted:
        core.handle(AdmissionResult(peer, intro, True, "ok"), now)


def credited(core: GossipCore, peer: str, now: float) -> None:
    """``peer`` serves its first pull, one item of 1 MiB, and admission accepts it: its credit
    (``credit_per_accepted_byte``) covers whole answers of 16 items, so its next pulls are full
    size, on credit, in ``max_inflight_pulls``, and run for ``pull_timeout``."""
    intro = hashlib.sha256(b"intro-" + peer.encode()).digest()
    [probe] = only(Pull, announce(core, peer, [intro], now))
    core.handle(PullSucceeded(probe.request_id, peer, ((intro, b"i" * 1024 * 1024),)), now)
    core.handle(AdmissionResult(peer, intro, True, "ok"), now)
    assert core._on_credit(peer)


# --- configuration ----------------------------------------------------------------------------


def test_invalid_config_is_refused_with_the_field_named() -> None:
    with pytest.raises(ConfigError, match="max_inflight_pulls"):
        GossipConfig(max_inflight_pulls=0)
    with pytest.raises(ConfigError, match="pull_rate"):
        GossipConfig(pull_rate=float("nan"))
    with pytest.raises(ConfigError, match="remember_rounds"):
        GossipConfig(remember_rounds=1, read_back_rounds=1)


def test_unknown_events_are_a_programming_error() -> None:
    with pytest.raises(TypeError):
        started().handle("hello", 0.0)  # type: ignore[arg-type]


# --- announcing own items --------------------------------------------------------------------


def test_publication_is_announced_for_the_current_round_after_the_coalescing_delay() -> None:
    core = started(now=25.0)
    assert only(Announce, core.handle(Publish(d(1), 10), 25.0)) == []
    assert core.next_deadline() == 25.5
    assert only(Announce, core.poll(25.5)) == [Announce(round=2, part=0, digests=(d(1),), expires_at=50.0)]


def test_publications_within_the_delay_share_one_record_and_a_growing_record_is_rewritten_whole() -> None:
    core = started()
    core.handle(Publish(d(1), 10), 0.0)
    core.handle(Publish(d(2), 10), 0.2)
    assert only(Announce, core.poll(0.5)) == [Announce(0, 0, (d(1), d(2)), 30.0)]
    core.handle(Publish(d(3), 10), 1.0)
    assert only(Announce, core.poll(1.5)) == [Announce(0, 0, (d(1), d(2), d(3)), 30.0)]


def test_announcements_are_split_into_parts_of_at_most_max_digests_and_full_parts_go_out_at_once() -> None:
    core = started(cfg(max_digests_per_announcement=4))
    sent: list[Announce] = []
    for i in range(9):
        sent += only(Announce, core.handle(Publish(d(i), 1), 0.0))
    assert [(a.part, len(a.digests)) for a in sent] == [(0, 4), (1, 4)]  # full parts: no delay
    sent += only(Announce, core.poll(0.5))
    assert [(a.part, len(a.digests)) for a in sent] == [(0, 4), (1, 4), (2, 1)]
    assert [x for a in sent for x in a.digests] == [d(i) for i in range(9)]


def test_own_items_are_served_until_keep_rounds_after_their_round_then_retired() -> None:
    core = started(cfg(keep_rounds=1))
    core.handle(Publish(d(1), 10), 5.0)  # round 0: servable through round 1, i.e. until t=20
    assert core.handle(PullRequest("p", (d(1),)), 19.9)[0] == Serve("p", (d(1),))
    assert Retire(d(1)) in core.poll(20.0)
    assert core.handle(PullRequest("p", (d(1),)), 20.0)[0] == Serve("p", ())
    assert core.sizes().own_items == 0


def test_publication_beyond_capacity_is_retired_at_once() -> None:
    core = started(cfg(max_own_items=2))
    core.handle(Publish(d(1), 1), 0.0)
    core.handle(Publish(d(2), 1), 0.0)
    assert core.handle(Publish(d(3), 1), 0.0) == [Retire(d(3))]
    assert core.stats.publish_dropped == 1


# --- reading announcements, rounds -------------------------------------------------------------


def test_reads_the_current_and_previous_round_every_read_interval() -> None:
    core = GossipCore(cfg(), "me")
    assert only(ReadAnnouncements, core.poll(0.0)) == [ReadAnnouncements((0, -1))]
    assert core.next_deadline() == 1.0
    assert only(ReadAnnouncements, core.poll(0.5)) == []
    assert only(ReadAnnouncements, core.poll(1.0)) == [ReadAnnouncements((0, -1))]
    assert only(ReadAnnouncements, core.poll(12.0)) == [ReadAnnouncements((1, 0))]


def test_a_late_joiner_reads_and_announces_in_the_swarm_round_derived_from_the_clock() -> None:
    config = cfg(round_seconds=30.0, epoch=1_700_000_000.0)
    now = 1_700_000_000.0 + 3 * 3600 + 7.0  # joins three hours after the swarm's epoch
    old = GossipCore(config, "old")
    for t in range(0, 3 * 3600 + 7, 600):  # the old node has been polled all along
        old.poll(config.epoch + t)
    late = GossipCore(config, "late")
    expected = round_at(now, 30.0, config.epoch)
    assert expected == 360
    assert only(ReadAnnouncements, late.poll(now)) == [ReadAnnouncements((360, 359))]
    assert old.current_round(now) == late.current_round(now) == 360
    late.handle(Publish(d(1), 1), now)
    assert only(Announce, late.poll(now + 0.5))[0].round == 360


def test_announcements_for_rounds_outside_the_read_window_are_ignored() -> None:
    core = started(now=35.0)  # round 3 reads rounds 3 and 2
    assert only(Pull, core.handle(Announced("a", 1, (d(1),)), 35.0)) == []
    assert only(Pull, core.handle(Announced("a", 5, (d(2),)), 35.0)) == []
    assert only(Pull, core.handle(Announced("a", 2, (d(3),)), 35.0)) != []


def test_time_that_goes_backwards_is_held_at_its_last_value() -> None:
    core = started(now=15.0)
    core.handle(Publish(d(1), 1), 5.0)  # a clock step back: still round 1, flush at 15.5
    assert core.next_deadline() == 15.5
    assert only(Announce, core.poll(15.5))[0].round == 1


# --- deciding what to pull -------------------------------------------------------------------


def test_a_digest_is_pulled_once_however_often_and_by_whomever_it_is_announced() -> None:
    core = started()
    actions = announce(core, "a", [d(1)], 0.0)
    actions += announce(core, "b", [d(1)], 0.1)
    actions += announce(core, "a", [d(1)], 0.2)
    pulls = only(Pull, actions)
    assert [p.digests for p in pulls] == [(d(1),)]
    admits = only(Admit, succeed(core, pulls[0], 0.3))
    assert [a.digest for a in admits] == [d(1)]
    assert only(Pull, announce(core, "c", [d(1)], 0.4)) == []  # awaiting its verdict
    core.handle(AdmissionResult("a", d(1), True, "ok"), 0.5)
    assert only(Pull, announce(core, "c", [d(1)], 0.6)) == []  # remembered


def test_own_items_are_never_pulled_and_own_announcements_are_ignored() -> None:
    core = started()
    core.handle(Publish(d(1), 1), 0.0)
    assert only(Pull, announce(core, "a", [d(1)], 0.1)) == []
    assert only(Pull, announce(core, "me", [d(2)], 0.1)) == []
    assert core.sizes().candidates == 0


def test_digests_are_batched_per_peer_up_to_max_digests_per_pull() -> None:
    core = started(cfg(max_digests_per_pull=3, max_inflight_pulls_per_peer=2))
    credited(core, "a", 0.0)
    pulls = only(Pull, announce(core, "a", [d(i) for i in range(7)], 0.0))
    assert [len(p.digests) for p in pulls] == [3, 3]  # the 7th waits for a free slot
    assert [len(p.digests) for p in only(Pull, succeed(core, pulls[0], 0.1))] == [1]


def test_records_of_one_read_handled_together_are_scheduled_once_into_full_batches() -> None:
    core = started()
    credited(core, "a", 0.0)
    credited(core, "b", 0.0)
    read = [Announced("a", 0, (d(1), d(2))), Announced("a", 0, (d(3),)), Announced("b", 0, (d(3), d(4)))]
    pulls = only(Pull, core.handle_all(read, 0.0))
    assert [(p.peer, p.digests) for p in pulls] == [("a", (d(1), d(2), d(3))), ("b", (d(4),))]


def test_inflight_pulls_are_capped_globally() -> None:
    core = started(cfg(max_inflight_pulls=2))
    pulls = []
    for i, peer in enumerate(["a", "b", "c"]):
        credited(core, peer, 0.0)  # small pulls have a pool of their own (below)
        pulls += only(Pull, announce(core, peer, [d(i)], 0.0))
    assert [p.peer for p in pulls] == ["a", "b"]
    assert [p.peer for p in only(Pull, core.handle(PullFailed(pulls[0].request_id, "a", "x"), 0.1))] == ["c"]


def test_inflight_pulls_are_capped_per_peer() -> None:
    core = started(cfg(max_digests_per_pull=2, max_inflight_pulls_per_peer=1))
    credited(core, "a", 0.0)
    assert len(only(Pull, announce(core, "a", [d(i) for i in range(10)], 0.0))) == 1


def test_pulled_items_are_rate_limited_per_peer_with_a_token_bucket() -> None:
    core = started(cfg(pull_rate=2.0, pull_burst=4.0, max_digests_per_pull=16, max_inflight_pulls_per_peer=4))
    credited(core, "a", 0.0)  # one token
    credited(core, "b", 0.0)
    [first] = only(Pull, announce(core, "a", [d(i) for i in range(10)], 0.5))
    assert len(first.digests) == 4  # the burst
    assert only(Pull, succeed(core, first, 0.5)) == []
    assert core.next_deadline() == 1.0  # one token at 2 items/s
    assert [len(p.digests) for p in only(Pull, core.poll(1.0))] == [1]
    assert [len(p.digests) for p in only(Pull, core.poll(3.0))] == [4]
    # Another peer has its own bucket.
    assert [len(p.digests) for p in only(Pull, announce(core, "b", [d(100 + i) for i in range(9)], 3.0))] == [
        4
    ]


def test_a_failed_pull_is_retried_on_another_peer_that_announced_the_digests() -> None:
    core = started()
    credited(core, "a", 0.0)
    credited(core, "b", 0.0)
    [first] = only(Pull, announce(core, "a", [d(1), d(2)], 0.0))
    assert only(Pull, announce(core, "b", [d(1), d(2)], 0.1)) == []  # in flight: noted, not pulled twice
    [retry] = only(Pull, core.handle(PullFailed(first.request_id, "a", "connection reset"), 0.2))
    assert (retry.peer, retry.digests) == ("b", (d(1), d(2)))


def test_a_timed_out_pull_is_cancelled_and_retried_on_another_peer() -> None:
    core = started(cfg(probe_timeout=1.0))
    credited(core, "a", 0.0)
    credited(core, "b", 0.0)
    [first] = only(Pull, announce(core, "a", [d(1)], 0.0))
    announce(core, "b", [d(1)], 0.0)
    assert first.timeout == 5.0  # a probe's is probe_timeout (below)
    # The driver gives up at pull_timeout (5 s) and reports why; the core's expiry waits 10% more,
    # so that report is not pre-empted.
    assert only(CancelPull, core.poll(5.0)) == []
    assert core.next_deadline() <= 5.5  # type: ignore[operator]
    actions = core.poll(5.5)
    assert CancelPull(first.request_id, "a") in actions
    [retry] = only(Pull, actions)
    assert retry.peer == "b" and retry.digests == (d(1),)
    assert only(Admit, succeed(core, first, 5.6)) == []  # the late answer is ignored


def test_digests_missing_from_a_response_are_retried_elsewhere() -> None:
    core = started()
    credited(core, "a", 0.0)
    credited(core, "b", 0.0)
    [first] = only(Pull, announce(core, "a", [d(1), d(2)], 0.0))
    announce(core, "b", [d(1), d(2)], 0.0)
    actions = core.handle(PullSucceeded(first.request_id, "a", ((d(1), b"p1"),)), 0.1)
    assert only(Admit, actions) == [Admit("a", d(1), b"p1")]
    assert [(p.peer, p.digests) for p in only(Pull, actions)] == [("b", (d(2),))]


def test_a_failing_peer_is_backed_off_exponentially_up_to_backoff_max() -> None:
    core = started(cfg(max_attempts=100, backoff_base=1.0, backoff_max=4.0))
    [pull] = only(Pull, announce(core, "a", [d(1)], 0.0))
    now = 0.0
    for gap in [1.0, 2.0, 4.0, 4.0]:
        core.handle(PullFailed(pull.request_id, "a", "refused"), now)
        assert core.next_deadline() <= now + gap  # type: ignore[operator]
        assert only(Pull, core.poll(now + gap - 0.01)) == []
        [pull] = only(Pull, core.poll(now + gap))
        now += gap


def test_a_digest_is_given_up_after_max_attempts() -> None:
    core = started(cfg(max_attempts=2, backoff_base=0.1))
    [pull] = only(Pull, announce(core, "a", [d(1)], 0.0))
    core.handle(PullFailed(pull.request_id, "a", "x"), 0.0)
    [pull] = only(Pull, core.poll(0.1))
    assert only(Pull, core.handle(PullFailed(pull.request_id, "a", "x"), 0.1) + core.poll(5.0)) == []
    assert only(Pull, announce(core, "b", [d(1)], 5.0)) == []
    assert core.stats.gave_up == 1


def test_a_digest_announced_by_several_peers_goes_to_the_one_with_the_best_history() -> None:
    core = started(cfg(max_inflight_pulls=1, max_probe_pulls=1))
    [pull] = only(Pull, announce(core, "b", [d(1)], 0.0))
    succeed(core, pull, 0.1)
    core.handle(AdmissionResult("b", d(1), True, "ok"), 0.1)  # b: +1
    served_once(core, "a", 0.1)  # a: served an item, nothing accepted yet
    served_once(core, "z", 0.1)
    [blocker] = only(Pull, announce(core, "z", [d(9)], 0.2))  # occupies the only slot (all small pulls)
    announce(core, "a", [d(2)], 0.3)
    announce(core, "b", [d(2)], 0.3)
    [pull] = only(Pull, core.handle(PullFailed(blocker.request_id, "z", "x"), 0.4))
    assert pull.peer == "b" and pull.digests == (d(2),)


def test_results_of_unknown_or_finished_pulls_and_unrequested_items_are_ignored() -> None:
    core = started()
    assert only(Admit, core.handle(PullSucceeded(999, "a", ((d(1), b"x"),)), 0.0)) == []
    [pull] = only(Pull, announce(core, "a", [d(1)], 0.0))
    assert only(Admit, core.handle(PullSucceeded(pull.request_id, "b", ((d(1), b"x"),)), 0.0)) == []
    items = ((d(1), b"x"), (d(1), b"y"), (d(7), b"z"))
    assert only(Admit, core.handle(PullSucceeded(pull.request_id, "a", items), 0.1)) == [
        Admit("a", d(1), b"x")
    ]
    assert core.stats.items_unrequested == 2


def test_a_payload_that_does_not_match_its_digest_is_dropped_counted_and_retried_elsewhere() -> None:
    core = started(digest_of=sha)
    good = b"the real item"
    [pull] = only(Pull, announce(core, "a", [sha(good)], 0.0))
    announce(core, "b", [sha(good)], 0.0)
    actions = core.handle(PullSucceeded(pull.request_id, "a", ((sha(good), b"forged"),)), 0.1)
    assert only(Admit, actions) == []
    [retry] = only(Pull, actions)
    assert retry.peer == "b"
    assert only(Admit, core.handle(PullSucceeded(retry.request_id, "b", ((sha(good), good),)), 0.2)) == [
        Admit("b", sha(good), good)
    ]
    assert core.stats.items_corrupt == 1


# --- admission verdicts, bans ----------------------------------------------------------------


def test_a_peer_whose_items_are_rejected_repeatedly_is_not_pulled_from() -> None:
    core = started(cfg(max_rejections=2, rejection_shun_seconds=50.0))
    for i in range(2):
        [pull] = only(Pull, announce(core, "a", [d(i)], 0.0))
        succeed(core, pull, 0.1)
        core.handle(AdmissionResult("a", d(i), False, "bad_signature"), 0.1)
    assert core.is_banned("a", 0.2)
    assert only(Pull, announce(core, "a", [d(10)], 0.2)) == []
    [pull] = only(Pull, announce(core, "b", [d(10)], 0.2))
    assert pull.peer == "b"
    succeed(core, pull, 0.3)
    assert [p.peer for p in only(Pull, core.poll(50.1) + announce(core, "a", [d(11)], 50.1))] == ["a"]


def test_rejections_that_depend_on_the_receiver_never_shun_the_server() -> None:
    # stale_policy, task_not_allowed, completion_too_long...: admission charges nobody, since an
    # honest peer's valid item meets them; the core must not hold them against it either (three
    # such verdicts once shunned honest chat-model peers, and refused them service, for 10 min).
    core = started(cfg(max_rejections=2, rejection_shun_seconds=50.0))
    for i in range(6):
        [pull] = only(Pull, announce(core, "a", [d(i)], 0.0))
        succeed(core, pull, 0.1)
        core.handle(AdmissionResult("a", d(i), False, "completion_too_long", charged=False), 0.1)
    assert not core.is_banned("a", 0.2) and core.stats.peers_shunned == 0 and core.stats.rejected == 6
    [pull] = only(Pull, announce(core, "a", [d(10)], 0.2))  # still pulled from
    assert pull.peer == "a"
    # the same count of charged rejections shuns it
    succeed(core, pull, 0.3)
    core.handle(AdmissionResult("a", d(10), False, "invalid_payload"), 0.3)
    [pull] = only(Pull, announce(core, "a", [d(11)], 0.3))
    succeed(core, pull, 0.4)
    core.handle(AdmissionResult("a", d(11), False, "invalid_payload"), 0.4)
    assert core.is_banned("a", 0.5) and core.stats.peers_shunned == 1


def test_a_peer_that_sends_only_items_we_cannot_use_is_paused_not_banned() -> None:
    # A peer on another mixture sends items admission refuses as task_not_allowed, charged to
    # nobody: after max_unusable in a row we stop downloading them for a while, still serving it.
    core = started(cfg(max_unusable=3, rejection_shun_seconds=50.0))
    core.handle(Publish(d(0), 1), 0.0)
    verdicts = [False, False, True, False, False, False]  # the acceptance resets the count
    for i, accepted in enumerate(verdicts):
        [pull] = only(Pull, announce(core, "a", [d(1 + i)], 0.0))
        succeed(core, pull, 0.1)
        core.handle(
            AdmissionResult("a", d(1 + i), accepted, "ok" if accepted else "task_not_allowed", charged=False),
            0.1,
        )
    assert core.stats.peers_paused == 1 and core.stats.peers_shunned == 0
    assert not core.is_banned("a", 0.2)
    assert only(Pull, announce(core, "a", [d(20)], 0.2)) == []  # not pulled from
    assert only(Serve, core.handle(PullRequest("a", (d(0),)), 0.3)) == [Serve("a", (d(0),))]  # served
    after = core.poll(50.2) + announce(core, "a", [d(21)], 50.2)
    assert [p.peer for p in only(Pull, after)] == ["a"]  # pulled again after the pause


def test_refusals_for_our_own_full_admission_queue_neither_pause_nor_shun_the_server() -> None:
    # Admission refused these unjudged (cpu_budget, busy): our queue was full, whoever filled it.
    # An honest peer whose items met our overload must not be paused for 10 minutes for it.
    core = started(cfg(max_unusable=3, max_rejections=2, rejection_shun_seconds=50.0))
    for i in range(10):
        [pull] = only(Pull, announce(core, "a", [d(i)], 0.0))
        succeed(core, pull, 0.1)
        core.handle(AdmissionResult("a", d(i), False, "cpu_budget", charged=False, busy=True), 0.1)
    assert core.stats.refused_busy == 10
    assert core.stats.peers_paused == 0 and core.stats.peers_shunned == 0
    [pull] = only(Pull, announce(core, "a", [d(20)], 0.2))  # still pulled from
    assert pull.peer == "a"
    # the digest closes: another announcer's copy would meet the same queue
    assert only(Pull, announce(core, "b", [d(0)], 0.3)) == []


def answer_unreadable(core: GossipCore, peer: str, digest: bytes, reason: str, now: float) -> None:
    """``peer`` announces ``digest`` and answers its pull with bytes that are no envelope."""
    [pull] = only(Pull, announce(core, peer, [digest], now))
    core.handle(PullSucceeded(pull.request_id, peer, (), unreadable=(reason,)), now)


def test_bytes_that_are_no_envelope_count_against_their_server() -> None:
    # Red team rt23 F2: they have no id, so before the core never saw them; one identity made a
    # receiver download ~100 blobs of 2 MiB before admission's score alone stopped it.
    # (Backoff short: an answer with no requested item intact is a failed pull too.)
    shun = dict(max_rejections=2, max_unusable=3, rejection_shun_seconds=50.0)
    core = started(cfg(**shun, backoff_base=0.01, backoff_max=0.01))
    answer_unreadable(core, "a", d(0), "malformed", 0.1)
    assert not core.is_banned("a", 0.1)
    answer_unreadable(core, "a", d(1), "too_large", 0.2)  # an honest server serves envelopes only
    assert core.is_banned("a", 0.3) and core.stats.peers_shunned == 1
    assert core.stats.items_unreadable == 2
    # A newer protocol's envelope may come from an honest peer: paused like another mixture's items.
    for i in range(3):
        answer_unreadable(core, "b", d(10 + i), "unsupported_version", 0.3 + 0.02 * i)
    assert core.stats.peers_paused == 1 and not core.is_banned("b", 0.4)
    assert only(Pull, announce(core, "b", [d(20)], 0.4)) == []
    assert [p.peer for p in only(Pull, announce(core, "c", [d(20)], 0.4))] == ["c"]


def test_a_pull_broken_by_its_servers_bytes_counts_against_it_and_an_empty_answer_forgives_nothing() -> None:
    # Red team rt24 F2: an answer with broken item framing, or over the size an honest one can
    # have, failed the pull and cost its server only backoff, which an empty answer in between
    # reset: 853 MiB per minute per identity. Now it is a rejection, and rejections add up.
    core = started(cfg(max_rejections=2, backoff_base=0.1, backoff_max=0.1))
    [pull] = only(Pull, announce(core, "a", [d(0)], 0.0))
    core.handle(PullFailed(pull.request_id, "a", "protocol", charged=True), 0.1)
    assert not core.is_banned("a", 0.2) and core.stats.pulls_refused == 1
    [pull] = only(Pull, announce(core, "a", [d(1)], 0.3))
    succeed(core, Pull(pull.request_id, "a", (), pull.timeout), 0.4)  # an empty answer between
    [pull] = only(Pull, announce(core, "a", [d(2)], 0.5))
    actions = core.handle(PullFailed(pull.request_id, "a", "ValueError", charged=True), 0.6)
    assert core.is_banned("a", 0.7) and core.stats.peers_shunned == 1
    assert only(Pull, announce(core, "a", [d(3)], 0.8)) == [] and only(Pull, actions) == []
    # A timeout or an unreachable peer is nobody's fault: backoff only, never a ban.
    for i in range(5):
        [pull] = only(Pull, announce(core, "b", [d(10 + i)], 10.0 * (i + 1)))
        core.handle(PullFailed(pull.request_id, "b", "timeout"), 10.0 * (i + 1) + 0.1)
    assert not core.is_banned("b", 60.0) and core.stats.pulls_refused == 2


def test_an_empty_answer_is_a_failure_and_only_one_that_delivers_something_ends_a_peers_backoff() -> None:
    # Red team rt27: failed pulls with an empty answer between them never backed off. Red team
    # rt45 F1a: 8 ids answering every pull empty just before the timeout, charged only a lower
    # score, kept winning slots; newcomers lost 29% of their items.
    core = started(cfg(backoff_base=2.0, backoff_max=64.0))
    [pull] = only(Pull, announce(core, "a", [d(0)], 0.0))
    core.handle(PullFailed(pull.request_id, "a", "timeout"), 0.1)  # backoff 2 s
    [pull] = only(Pull, announce(core, "a", [d(1)], 2.2))
    core.handle(PullSucceeded(pull.request_id, "a", ()), 2.3)  # empty: the second failure, 4 s
    assert only(Pull, announce(core, "a", [d(2)], 6.2)) == []
    [pull] = only(Pull, core.poll(6.3))
    core.handle(PullSucceeded(pull.request_id, "a", ()), 6.4)  # the third: 8 s
    assert only(Pull, announce(core, "a", [d(3)], 14.3)) == []
    [pull] = only(Pull, core.poll(14.4))
    more = only(Pull, succeed(core, pull, 14.5))  # delivered: the run ends (the next id pulled at once)
    [pull] = more or only(Pull, announce(core, "a", [d(4)], 14.6))
    core.handle(PullFailed(pull.request_id, "a", "timeout"), 14.7)  # first failure again: 2 s
    assert only(Pull, announce(core, "a", [d(5)], 16.7)) != []


def test_a_full_candidate_table_makes_room_from_the_peers_that_hold_the_most() -> None:
    # Red team rt24 F1: a full table refused every new digest, so 8 free ids x 1,024 unserved
    # digests shut an honest announcer out. Now slots even out (max-min fairness).
    core = started(cfg(max_candidates=8, max_inflight_pulls=1, max_probe_pulls=1))
    only(Pull, announce(core, "slow", [d(100)], 0.0))  # holds the one probe: nothing leaves
    announce(core, "hog", [d(i) for i in range(8)], 0.1)
    assert core.sizes().candidates == 8
    announce(core, "new", [d(10), d(11)], 0.2)  # holds 0, then 1; "hog" 8, then 7
    assert core.stats.candidates_evicted == 2 and core.sizes().candidates == 8
    announce(core, "new", [d(12), d(13), d(14), d(15)], 0.3)  # until both hold 4: the last is dropped
    assert core.stats.candidates_evicted == 4 and core.sizes().candidates == 8


def test_a_proven_peer_takes_room_from_digests_no_proven_peer_announces() -> None:
    # Red team rt27: 1,000 ids announcing 9 digests each hold as few slots as an honest peer, so
    # max-min alone left it 1% of its items. A peer with accepted items evicts theirs.
    core = started(cfg(max_candidates=8, max_inflight_pulls=1, max_probe_pulls=1))
    [pull] = only(Pull, announce(core, "good", [d(40)], 0.0))
    succeed(core, pull, 0.1)
    core.handle(AdmissionResult("good", d(40), True, "ok"), 0.2)
    credited(core, "slow", 0.2)
    only(Pull, announce(core, "slow", [d(100)], 0.3))  # holds the one pull slot
    only(Pull, announce(core, "slower", [d(101)], 0.3))  # and the one probe
    for i in range(8):
        announce(core, f"thin{i}", [d(20 + i)], 0.4)
    announce(core, "thin8", [d(30)], 0.5)
    assert core.stats.candidates_dropped == 1 and core.stats.candidates_evicted == 0
    announce(core, "good", [d(41)], 0.6)
    assert core.stats.candidates_evicted == 1 and core.stats.candidates_dropped == 1


def test_small_pulls_have_a_pool_of_their_own_and_peers_on_credit_keep_the_pulls() -> None:
    # One accepted item earns "good" credit for whole answers (``_on_credit``); x, y and z, with
    # one item served and none accepted, are pulled small (``GossipCore._small``).
    config = cfg(max_inflight_pulls=1, max_probe_pulls=2, max_inflight_pulls_per_peer=1)
    core = started(dataclasses.replace(config, credit_per_accepted_byte=1e7))
    [first] = only(Pull, announce(core, "good", [d(0)], 0.0))
    succeed(core, first, 0.1)
    core.handle(AdmissionResult("good", d(0), True, "ok"), 0.2)
    for peer in ("x", "y", "z"):
        served_once(core, peer, 0.2)
    pulls = [p.peer for p in only(Pull, announce(core, "x", [d(1)], 0.3))]
    pulls += [p.peer for p in only(Pull, announce(core, "y", [d(2)], 0.3))]
    pulls += [p.peer for p in only(Pull, announce(core, "z", [d(3)], 0.3))]
    assert pulls == ["x", "y"]  # "z" waits for a small pull's slot...
    assert [p.peer for p in only(Pull, announce(core, "good", [d(4)], 0.4))] == ["good"]  # ...not "good"


def test_a_banned_peer_is_neither_pulled_from_nor_served_until_the_ban_ends() -> None:
    core = started()
    core.handle(Publish(d(0), 1), 0.0)
    [pull] = only(Pull, announce(core, "a", [d(1)], 0.0))
    announce(core, "b", [d(1)], 0.0)
    actions = core.handle(PeerBanned("a", until=29.5), 0.1)
    assert CancelPull(pull.request_id, "a") in actions
    # Its digest is pulled from "b" once the cancelled call reports what it cost (rt30 F1).
    actions = core.handle(PullFailed(pull.request_id, "a", "cancelled", received=0), 0.1)
    assert [(p.peer, p.digests) for p in only(Pull, actions)] == [("b", (d(1),))]
    assert only(Pull, announce(core, "a", [d(2)], 0.2)) == []
    assert only(Serve, core.handle(PullRequest("a", (d(0),)), 0.3)) == [Serve("a", ())]
    assert only(Serve, core.handle(PullRequest("a", (d(0),)), 29.0)) == [Serve("a", ())]
    assert only(Serve, core.handle(PullRequest("a", (d(0),)), 29.5)) == [Serve("a", (d(0),))]


def test_pulls_wait_while_pending_admissions_are_at_capacity() -> None:
    core = started(cfg(max_pending_admissions=2))
    credited(core, "a", 0.0)
    [pull] = only(Pull, announce(core, "a", [d(i) for i in range(5)], 0.0))
    assert len(pull.digests) == 2
    actions = succeed(core, pull, 0.1)
    assert len(only(Admit, actions)) == 2 and only(Pull, actions) == []
    [more] = only(Pull, core.handle(AdmissionResult("a", d(0), True, "ok"), 0.2))
    assert len(more.digests) == 1


def test_an_admission_that_times_out_frees_its_slot_and_the_digest_is_not_admitted_again() -> None:
    core = started(cfg(max_pending_admissions=1, admission_timeout=3.0))
    credited(core, "a", 0.0)
    [pull] = only(Pull, announce(core, "a", [d(1), d(2)], 0.0))
    succeed(core, pull, 0.0)
    assert core.next_deadline() == 1.0  # the read timer; the admission timer is at 3.0
    core.poll(1.0)
    core.poll(2.0)
    [pull] = only(Pull, core.poll(3.0))
    assert pull.digests == (d(2),)
    assert only(Pull, announce(core, "b", [d(1)], 3.1)) == []
    assert core.stats.admission_timeouts == 1


def test_an_item_whose_verdict_never_comes_leaves_its_server_unproven_until_another_is_accepted() -> None:
    # Red team rt82 F4: an admission timeout cost a proven id nothing, so its items that were never
    # judged held their round's places again and again, and it stayed first in line.
    core = started(cfg(admission_timeout=3.0))
    credited(core, "a", 0.0)
    [pull] = only(Pull, announce(core, "a", [d(1)], 0.0))
    succeed(core, pull, 0.0)
    assert core._proven("a")
    core.poll(3.0)  # no verdict for d(1)
    assert core.stats.admission_timeouts == 1 and not core._proven("a")
    [pull] = only(Pull, announce(core, "a", [d(2)], 3.1))
    succeed(core, pull, 3.2)
    core.handle(AdmissionResult("a", d(2), True, "ok"), 3.3)
    assert core._proven("a")


def test_proven_peers_kept_across_a_restart_are_proven_again_and_nothing_else_is() -> None:
    # Red team rt82 F3: standing was not kept, so a restarted node was a new one to a flood of
    # fresh identities. The node keeps ``standing()`` in its ledger and restores it at start.
    core = started()
    credited(core, "a", 0.0)
    served_once(core, "b", 0.0)  # served, never accepted: not proven
    kept = core.standing()
    assert [peer for peer, _ in kept] == ["a"]
    again = started(now=100.0)
    entries = [*kept, ("zero", 0), ("", 5), ("x" * 300, 5), ("negative", -3)]
    assert again.restore_standing(entries, 100.0) == 1
    assert again._proven("a") and not again._on_credit("a")  # proven, no credit until it serves
    assert [peer for peer, _ in again.standing()] == ["a"]
    full = started(cfg(max_peers=2), now=100.0)
    assert full.restore_standing([(f"p{i}", 1) for i in range(5)], 100.0) == 2


def test_a_charged_refusal_unproves_a_peer_however_high_its_score_until_an_item_is_accepted() -> None:
    # Red team rt84 F2: a charged refusal only lowered the score, so a peer with a score of 6 or
    # more stayed proven (its junk drawn among proven announcers again) and, once shunned or
    # banned, was still kept as standing and came back proven after a restart.
    core = started()
    credited(core, "a", 0.0)
    core._peers["a"].score = 50
    [pull] = only(Pull, announce(core, "a", [d(1)], 0.0))
    succeed(core, pull, 0.1)
    core.handle(AdmissionResult("a", d(1), False, "bad_signature"), 0.2)
    assert core._peers["a"].score > 0 and not core._proven("a") and core.standing() == []
    [pull] = only(Pull, announce(core, "a", [d(2)], 0.3))
    succeed(core, pull, 0.3)
    core.handle(AdmissionResult("a", d(2), True, "ok"), 0.4)
    assert core._proven("a") and [peer for peer, _ in core.standing()] == ["a"]
    core.handle(PeerBanned("a", 100.0), 0.5)
    assert core.standing() == []  # banned: not kept, whatever its standing


# --- serving ---------------------------------------------------------------------------------


def test_serve_answers_with_own_known_digests_only_deduplicated_and_capped_per_batch() -> None:
    core = started(cfg(max_serve_batch=3))
    for i in range(5):
        core.handle(Publish(d(i), 1), 0.0)
    assert core.handle(PullRequest("p", (d(0), d(99), d(1), d(0))), 0.0)[0] == Serve("p", (d(0), d(1)))
    [serve] = only(Serve, core.handle(PullRequest("q", tuple(d(i) for i in range(5))), 0.0))
    assert serve.digests == (d(0), d(1), d(2))


def test_serve_batches_are_capped_in_bytes() -> None:
    core = started(cfg(max_serve_bytes=250))
    for i in range(3):
        core.handle(Publish(d(i), 100), 0.0)
    assert core.handle(PullRequest("p", (d(0), d(1), d(2))), 0.0)[0] == Serve("p", (d(0), d(1)))


def test_serving_is_rate_limited_per_peer() -> None:
    core = started(cfg(serve_rate=1.0, serve_burst=3.0))
    digests = tuple(d(i) for i in range(5))
    for digest in digests:
        core.handle(Publish(digest, 1), 0.0)
    assert len(core.handle(PullRequest("p", digests), 0.0)[0].digests) == 3
    assert core.handle(PullRequest("p", digests), 0.0)[0].digests == ()
    assert len(core.handle(PullRequest("p", digests), 2.0)[0].digests) == 2
    assert len(core.handle(PullRequest("q", digests), 2.0)[0].digests) == 3  # q has its own bucket


def test_serving_spends_a_byte_budget_per_peer() -> None:
    # Red team rt24 F4: one leeching id was served ~1 GiB of our own items a minute; only items
    # per second limited it. Now bytes too: 100 B/s per peer (burst: one 300-byte answer).
    core = started(cfg(max_serve_bytes=300, serve_bytes_rate=100.0))
    digests = tuple(d(i) for i in range(6))
    for digest in digests:
        core.handle(Publish(digest, 100), 0.0)
    assert len(core.handle(PullRequest("p", digests), 0.0)[0].digests) == 3  # its 300-byte burst
    assert core.handle(PullRequest("p", digests), 0.5)[0].digests == ()  # 50 B refilled: < one item
    assert len(core.handle(PullRequest("p", digests), 1.0)[0].digests) == 1
    # Another puller has its own budget: a leech never uses up what honest pullers get (rt28 F1).
    assert len(core.handle(PullRequest("q", digests), 1.0)[0].digests) == 3
    assert core.stats.bytes_served == 700


def test_peers_that_only_pull_from_us_never_keep_an_announcer_out_of_the_peer_table() -> None:
    # Red team rt24 F5: 1,024 ids pulling our items every 0.5 s kept their serve buckets below
    # full, so none could be forgotten, and an honest announcer's records were ignored.
    core = started(cfg(max_peers=4, serve_rate=1.0, serve_burst=2.0))
    core.handle(Publish(d(0), 10), 0.0)
    core.handle(Publish(d(2), 10), 0.0)
    for t in range(21):  # each takes what its bucket holds: never full, never idle
        for i in range(8):
            core.handle(PullRequest(f"leech{i}", (d(0), d(2))), t * 0.5)
    [pull] = only(Pull, announce(core, "honest", [d(1)], 10.0))
    assert pull.peer == "honest" and core.stats.announcements_ignored == 0
    assert core.sizes().peers <= 4


# --- memory ----------------------------------------------------------------------------------


def test_expiry_frees_the_memory_of_candidates_and_remembered_digests() -> None:
    core = started(cfg(max_inflight_pulls_per_peer=1, max_digests_per_pull=2, pull_rate=0.01, pull_burst=3))
    credited(core, "a", 0.0)
    [pull] = only(Pull, announce(core, "a", [d(i) for i in range(20)], 0.0))
    succeed(core, pull, 0.1)
    for digest in pull.digests:
        core.handle(AdmissionResult("a", digest, True, "ok"), 0.2)
    assert core.sizes().candidates == 18 and core.sizes().remembered == 3
    core.poll(core.config.candidate_ttl)
    assert core.sizes().candidates == 0
    core.poll(0.2 + core.config.remember_ttl)
    assert core.sizes().remembered == 0 and core.sizes().pending_admissions == 0


def test_tables_stay_within_their_caps_under_a_flood_of_announcements() -> None:
    config = cfg(max_candidates=10, max_candidates_per_peer=4, max_peers=3, max_inflight_pulls=1)
    core = started(config)
    for p in range(10):
        announce(core, f"peer{p}", [d(1000 * p + i) for i in range(20)], 0.0)
    sizes = core.sizes()
    assert sizes.candidates <= 10 and sizes.peers <= 3
    assert core.stats.candidates_dropped > 0 and core.stats.announcements_ignored > 0


def test_an_idle_peer_is_forgotten_to_make_room_for_a_new_one() -> None:
    core = started(cfg(max_peers=1))
    [pull] = only(Pull, announce(core, "a", [d(1)], 0.0))
    assert only(Pull, announce(core, "b", [d(2)], 0.0)) == []  # a is busy: no room for b
    succeed(core, pull, 0.1)
    core.handle(AdmissionResult("a", d(1), True, "ok"), 0.1)
    # a's bucket refills, then a is idle and may be forgotten for b.
    assert [p.peer for p in only(Pull, announce(core, "b", [d(2)], 10.0))] == ["b"]


def test_a_paused_peer_forgotten_to_make_room_comes_back_still_paused() -> None:
    # Forgetting an idle peer wiped its pause: a peer on other families (or a junk server) could
    # get forgotten and start over at zero refusals. Its pause is kept aside and restored.
    core = started(cfg(max_peers=1, max_unusable=2, rejection_shun_seconds=100.0))
    for i in range(2):
        [pull] = only(Pull, core.poll(10.0 * i) + announce(core, "a", [d(1 + i)], 10.0 * i))
        succeed(core, pull, 10.0 * i)
        core.handle(AdmissionResult("a", d(1 + i), False, "task_not_allowed", charged=False), 10.0 * i)
    assert core.stats.peers_paused == 1
    # a is idle, so b takes its place in the table of one...
    [pull] = only(Pull, announce(core, "b", [d(10)], 30.0))
    assert pull.peer == "b" and core.sizes().peers == 1
    succeed(core, pull, 31.0)  # (b's pull done, so that b can be forgotten in turn)
    core.handle(AdmissionResult("b", d(10), True, "ok"), 31.0)
    # ...and a, back before its pause ends, is still not pulled from; after it, it is.
    assert only(Pull, announce(core, "a", [d(20)], 50.0)) == []
    assert [p.peer for p in only(Pull, core.poll(111.0) + announce(core, "a", [d(21)], 111.0))] == ["a"]


# --- refused copies (red team F2) and memory under junk (red team F6) ------------------------


def refuse_copy(core: GossipCore, peer: str, digest: bytes, now: float) -> list[GossipAction]:
    """Admission refused ``peer``'s copy before its signature held (e.g. a flipped signature bit)."""
    return core.handle(AdmissionResult(peer, digest, False, "bad_signature", copy_refused=True), now)


def test_a_copy_refused_before_its_signature_held_does_not_close_the_digest_for_the_genuine_one() -> None:
    # "a" races the honest "h" (ties break by peer id) and serves a broken copy under h's id.
    core = started()
    [pull] = only(Pull, announce(core, "a", [d(1)], 0.0) + announce(core, "h", [d(1)], 0.0))
    assert pull.peer == "a"
    assert len(only(Admit, succeed(core, pull, 0.1))) == 1
    [retry] = only(Pull, refuse_copy(core, "a", d(1), 0.2))
    assert (retry.peer, retry.digests) == ("h", (d(1),))
    assert only(Admit, succeed(core, retry, 0.3, payload=b"genuine")) == [Admit("h", d(1), b"genuine" + d(1))]
    assert core.stats.copies_refused == 1 and core.stats.rejected == 1 and core._peers["a"].score < 0


def test_the_server_of_a_refused_copy_is_never_asked_for_that_digest_again() -> None:
    core = started()
    [pull] = only(Pull, announce(core, "a", [d(1)], 0.0))
    succeed(core, pull, 0.1)
    assert only(Pull, refuse_copy(core, "a", d(1), 0.2)) == []  # nobody else offers it: it waits
    for t in (1.0, 2.0, 12.0, 25.0):  # a keeps announcing it, this round and the next ones
        assert only(Pull, core.poll(t) + announce(core, "a", [d(1)], t)) == []
    assert core.sizes().refused_copies == 1
    [pull] = only(Pull, announce(core, "h", [d(1)], 26.0))  # a new announcer: pulled from it
    assert (pull.peer, pull.digests) == ("h", (d(1),))
    assert only(Pull, announce(core, "a", [d(2)], 26.0))[0].digests == (d(2),)  # a's other digests: pulled


def test_each_announcer_of_a_refused_copy_is_asked_once_and_none_uses_up_the_digests_tries() -> None:
    # Red team R9-3: a forged copy is free to make (flip one signature bit of the honest
    # envelope); before, each refused copy used one of the digest's max_attempts, so 4 free ids
    # read before the honest announcer closed the digest.
    core = started(cfg(max_attempts=3, max_announcers_per_digest=8))
    forgers = ["s0", "s1", "s2", "s3", "s4"]
    pulled: list[str] = []
    admitted: list[Admit] = []
    t = 0.0
    actions = core.handle_all([Announced(p, core.current_round(t), (d(1),)) for p in [*forgers, "h"]], t)
    pending = only(Pull, actions)
    while pending:
        pull = pending.pop(0)
        pulled.append(pull.peer)
        result = succeed(core, pull, t)
        if pull.peer == "h":
            admitted += only(Admit, result)
        else:
            result += refuse_copy(core, pull.peer, d(1), t)
        pending += only(Pull, result)
    assert pulled == [*forgers, "h"] and [a.peer for a in admitted] == ["h"]
    assert core.stats.copies_refused == 5 and core.stats.gave_up == 0


def test_a_copy_whose_bytes_do_not_hash_to_its_digest_drops_its_server_without_using_a_try() -> None:
    core = started(cfg(max_attempts=2, max_announcers_per_digest=8), digest_of=sha)
    good = b"the real item"
    pulled: list[str] = []
    actions = core.handle_all([Announced(p, core.current_round(0.0), (sha(good),)) for p in "abch"], 0.0)
    pending = only(Pull, actions)
    admitted: list[Admit] = []
    while pending:
        pull = pending.pop(0)
        pulled.append(pull.peer)
        payload = good if pull.peer == "h" else b"forged"
        result = core.handle(PullSucceeded(pull.request_id, pull.peer, ((sha(good), payload),)), 0.1)
        admitted += only(Admit, result)
        pending += only(Pull, result)
    assert pulled == ["a", "b", "c", "h"] and admitted == [Admit("h", sha(good), good)]
    assert core.stats.items_corrupt == 3 and core.stats.gave_up == 0


def test_ids_with_a_farmed_score_are_asked_first_but_cannot_keep_the_honest_copy_out() -> None:
    # Red team R9-3: ids that first served other signers' intact envelopes (+1 each) rank above
    # the honest announcer; each forged copy now drops its server, not one of the digest's tries.
    core = started(cfg(max_attempts=2))
    farmers = ["z0", "z1", "z2"]
    for k, peer in enumerate(farmers):
        for j in range(3):
            [pull] = only(Pull, announce(core, peer, [d(100 + 10 * k + j)], 0.0))
            succeed(core, pull, 0.0)
            core.handle(AdmissionResult(peer, d(100 + 10 * k + j), True, "accepted"), 0.0)
    t = 1.0
    actions = core.handle_all([Announced(p, core.current_round(t), (d(1),)) for p in ["h", *farmers]], t)
    pending = only(Pull, actions)
    pulled: list[str] = []
    while pending:
        pull = pending.pop(0)
        pulled.append(pull.peer)
        result = succeed(core, pull, t)
        if pull.peer != "h":
            result += refuse_copy(core, pull.peer, d(1), t)
        pending += only(Pull, result)
    assert pulled == [*farmers, "h"] and core.stats.gave_up == 0


def serve_honestly(
    core: GossipCore,
    actions: list[GossipAction],
    now: float,
    answer: Callable[[Pull], list[GossipAction]],
) -> tuple[list[str], list[Admit]]:
    """Drive pulls at one instant: "h" serves each pull intact, every other peer as ``answer`` does.
    Returns the peers pulled, in order, and the Admits of "h"'s items."""
    pending = only(Pull, actions)
    pulled: list[str] = []
    admitted: list[Admit] = []
    while pending:
        pull = pending.pop(0)
        pulled.append(pull.peer)
        if pull.peer == "h":
            admitted += only(Admit, succeed(core, pull, now))
        else:
            pending += only(Pull, answer(pull))
    return pulled, admitted


def test_ids_whose_pulls_fail_cannot_use_up_the_tries_an_untried_honest_announcer_needs() -> None:
    # Four free ids read first accept each pull and never answer: before, their time-outs used up
    # max_attempts = 4 and the honest "h" was never asked.
    core = started(cfg(max_attempts=4, max_announcers_per_digest=8, max_inflight_pulls=1))
    t = 0.0
    events = [Announced(f"z{i}", core.current_round(t), (d(1),)) for i in range(4)]
    actions = core.handle_all([*events, Announced("h", core.current_round(t), (d(1),))], t)
    pulled, admitted = serve_honestly(
        core, actions, t, lambda pull: core.handle(PullFailed(pull.request_id, pull.peer, "timeout"), t)
    )
    assert pulled == ["z0", "z1", "z2", "z3", "h"] and [a.peer for a in admitted] == ["h"]
    assert core.stats.gave_up == 0


def test_an_answer_padded_with_unrequested_items_cannot_pass_off_an_omission_as_the_byte_cap() -> None:
    # Red team R10-4: one id read first answered the honest digest's pull with 16 MiB of items
    # nobody asked for; the omission looked like an honest server's byte cap, was retried without
    # a charge and used up the digest's tries. Only requested items served intact count now, and
    # past max_attempts only announcers never asked are tried.
    core = started(cfg(max_attempts=2, max_announcers_per_digest=8))
    t = 0.0
    events = [Announced("z", core.current_round(t), (d(1),)), Announced("h", core.current_round(t), (d(1),))]
    padding = tuple((d(500 + i), b"p" * (2 * 1024 * 1024)) for i in range(8))
    pulled, admitted = serve_honestly(
        core,
        core.handle_all(events, t),
        t,
        lambda pull: core.handle(PullSucceeded(pull.request_id, pull.peer, padding), t),
    )
    assert pulled == ["z", "h"] and [a.peer for a in admitted] == ["h"]
    assert core.stats.items_unrequested == 8 and core._peers["z"].score < 0


def test_past_its_tries_a_digest_is_asked_only_of_announcers_never_asked() -> None:
    core = started(cfg(max_attempts=1, max_announcers_per_digest=8, max_inflight_pulls=1))
    t = 0.0
    events = [Announced(p, core.current_round(t), (d(1),)) for p in ("z0", "z1", "h")]
    pending = only(Pull, core.handle_all(events, t))
    pulled: list[str] = []
    while pending:
        pull = pending.pop(0)
        pulled.append(pull.peer)
        if pull.peer != "h":
            pending += only(Pull, core.handle(PullFailed(pull.request_id, pull.peer, "timeout"), t))
            pending += only(Pull, core.poll(t + 1.0))  # the failed ones wait out a backoff
    assert pulled == ["z0", "z1", "h"]


def test_refused_copies_of_one_digest_stay_bounded_however_many_ids_serve_them() -> None:
    config = cfg(max_announcers_per_digest=4)
    core = started(config)
    pulled: list[str] = []
    for wave in range(6):  # 4 fresh ids at each read, each serving a refused copy
        t = float(wave)
        events = [Announced(f"s{wave}-{i}", core.current_round(t), (d(1),)) for i in range(4)]
        pending = only(Pull, core.handle_all(events, t))
        while pending:
            pull = pending.pop(0)
            pulled.append(pull.peer)
            pending += only(Pull, succeed(core, pull, t) + refuse_copy(core, pull.peer, d(1), t))
    assert len(pulled) == 2 * config.max_announcers_per_digest and core.stats.gave_up == 1
    assert only(Pull, announce(core, "h", [d(1)], 7.0)) == []  # closed to ids not proven


# --- announced but not served (red team R8-3) -------------------------------------------------


def serve_empty(core: GossipCore, pull: Pull, now: float) -> list[GossipAction]:
    """The peer answers the pull without any of the digests it announced."""
    return core.handle(PullSucceeded(pull.request_id, pull.peer, ()), now)


def pull_until_quiet(core: GossipCore, actions: list[GossipAction], now: float, honest: str) -> list[str]:
    """Drive pulls at one instant: ``honest`` serves, every other peer answers empty. The pulled peers."""
    pulled: list[str] = []
    pending = only(Pull, actions)
    while pending:
        pull = pending.pop(0)
        pulled.append(pull.peer)
        result = succeed(core, pull, now) if pull.peer == honest else serve_empty(core, pull, now)
        pending += only(Pull, result)
    return pulled


@pytest.mark.parametrize("attackers", [[f"a{i}" for i in range(4)], [f"z{i}" for i in range(8)]])
def test_free_ids_that_announce_an_honest_digest_and_serve_nothing_cannot_keep_it_from_being_admitted(
    attackers: list[str],
) -> None:
    # Read before the honest "h" (announced in round current+1, read newest first): 4 ids that
    # sort before "h" used up the 4 shared tries; 8 also took every announcer slot, so "h"'s own
    # record was dropped. Now each answers once, is charged, and leaves its slot.
    core = started(cfg(max_attempts=4, max_announcers_per_digest=8))
    pulled: list[str] = []
    admitted: list[Admit] = []
    for t in (0.0, 1.0, 2.0):  # h and the attackers announce at every read
        r = core.current_round(t)
        events: list[GossipEvent] = [Announced(p, r + 1, (d(1),)) for p in attackers]
        events.append(Announced("h", r, (d(1),)))
        actions = core.handle_all(events, t)
        pending = only(Pull, actions)
        while pending:
            pull = pending.pop(0)
            pulled.append(pull.peer)
            if pull.peer == "h":
                result = succeed(core, pull, t)
                admitted += only(Admit, result)
                result += core.handle(AdmissionResult("h", d(1), True, "accepted"), t)
            else:
                result = serve_empty(core, pull, t)
            pending += only(Pull, result)
    assert [a.peer for a in admitted] == ["h"] and core.stats.accepted == 1
    assert sorted(pulled) == sorted([*attackers, "h"])  # each attacker once, then never again
    assert all(core._peers[p].score < 0 for p in attackers) and core._peers["h"].score > 0
    assert core.stats.gave_up == 0 and not core._bans  # charged like a failure, never banned for it


def test_ties_between_announcers_go_to_the_earliest_not_to_the_smallest_peer_id() -> None:
    core = started()
    [pull] = only(Pull, core.handle_all([Announced(p, 0, (d(1),)) for p in ("h", "a0", "a1")], 0.0))
    assert pull.peer == "h"  # a peer chooses its id, not when its announcement is read


def test_an_announcer_that_does_not_serve_a_digest_is_charged_and_never_asked_for_it_again() -> None:
    core = started()
    credited(core, "a", 0.0)
    [pull] = only(Pull, announce(core, "a", [d(1), d(2)], 0.0))
    actions = core.handle(PullSucceeded(pull.request_id, "a", ((d(2), b"p2"),)), 0.1)
    assert only(Admit, actions) == [Admit("a", d(2), b"p2")] and only(Pull, actions) == []
    assert core.stats.items_missing == 1 and core._peers["a"].score < 0 and core.stats.rejected == 0
    for t in (1.0, 2.0, 12.0):  # a keeps announcing it: not pulled from a again, not given up
        assert only(Pull, core.poll(t) + announce(core, "a", [d(1)], t)) == []
    [pull] = only(Pull, announce(core, "h", [d(1)], 12.5))  # a new announcer: pulled from it
    assert (pull.peer, pull.digests) == ("h", (d(1),)) and core.stats.gave_up == 0


def test_what_a_server_leaves_out_at_its_byte_cap_is_pulled_again_and_not_held_against_it() -> None:
    """R9-4: an honest server stops adding items at ``max_serve_bytes``; large items left out of a
    full answer are not "announced but not served": no charge, and the same peer is asked again."""
    core = started(cfg(max_serve_bytes=10, max_item_bytes=4))
    credited(core, "a", 0.0)
    [pull] = only(Pull, announce(core, "a", [d(1), d(2)], 0.0))
    assert pull.digests == (d(1), d(2))
    actions = core.handle(PullSucceeded(pull.request_id, "a", ((d(1), b"x" * 7),)), 0.1)  # 7 + 4 > 10
    assert only(Admit, actions) == [Admit("a", d(1), b"x" * 7)]
    assert core._peers["a"].score >= 0 and core.stats.rejected == 0
    [again] = only(Pull, actions + core.poll(0.2))
    assert (again.peer, again.digests) == ("a", (d(2),))
    # A short answer far from the cap is still an announcer that did not serve what it announced.
    actions = core.handle(PullSucceeded(again.request_id, "a", ()), 0.3)
    assert core._peers["a"].score < 0 and only(Pull, actions + core.poll(1.0)) == []


def test_pulls_of_one_digest_stay_bounded_however_many_ids_serve_it_empty() -> None:
    config = cfg(max_announcers_per_digest=4)
    core = started(config)
    pulled: list[str] = []
    for wave in range(6):  # 4 fresh ids at each read, each answering empty
        t = float(wave)
        events = [Announced(f"s{wave}-{i}", core.current_round(t), (d(1),)) for i in range(4)]
        pulled += pull_until_quiet(core, core.handle_all(events, t), t, honest="nobody")
    assert len(pulled) == 2 * config.max_announcers_per_digest and core.stats.gave_up == 1
    assert only(Pull, announce(core, "h", [d(1)], 7.0)) == []  # closed to ids not proven


def test_copycats_backed_off_for_other_ids_give_up_an_ids_slots_to_an_announcer_that_can_be_asked() -> None:
    # Red team rt87 P1: copycats re-announced every honest id and failed every pull, uncharged (a
    # stall, an empty answer, a hang-up). Backed off, but never tried on an id, they held all its
    # slots: its author was never asked, and with 32 of them 110 of 224 honest items were lost.
    core = started(cfg(max_announcers_per_digest=2, backoff_base=30.0, backoff_max=30.0))
    for copycat, other in (("c0", d(9)), ("c1", d(8))):
        [pull] = only(Pull, announce(core, copycat, [other], 0.0))
        assert only(Pull, core.handle(PullFailed(pull.request_id, copycat, "closed"), 0.1)) == []
    assert only(Pull, announce(core, "c0", [d(1)], 0.2) + announce(core, "c1", [d(1)], 0.2)) == []
    [pull] = only(Pull, announce(core, "h", [d(1)], 0.3))  # takes a backed-off copycat's slot
    assert (pull.peer, pull.digests) == ("h", (d(1),))
    # A peer that is backed off itself takes no such slot.
    [pull] = only(Pull, announce(core, "c2", [d(7)], 0.4))
    assert only(Pull, core.handle(PullFailed(pull.request_id, "c2", "closed"), 0.5)) == []
    assert only(Pull, announce(core, "c0", [d(2)], 0.6) + announce(core, "c1", [d(2)], 0.6)) == []
    assert only(Pull, announce(core, "c2", [d(2)], 0.7)) == []
    candidate = core._candidates.get(d(2))
    assert candidate is not None and "c2" not in candidate.announcers


def test_an_author_whose_backoff_ended_keeps_its_slot_against_fresh_copycats() -> None:
    # Red team rt88 F1: "stuck" once meant any failure since the last delivery, so after one reset
    # an honest author, its backoff long over, lost its ids' slots to each fresh copycat and,
    # stuck itself, never won them back (30 -> 0 of 36 of its items).
    config = cfg(
        max_announcers_per_digest=2, max_probe_pulls=1, max_attempts=1, backoff_base=1.0, backoff_max=1.0
    )
    core = started(config)
    [pull] = only(Pull, announce(core, "h", [d(9)], 0.0))
    assert only(Pull, core.handle(PullFailed(pull.request_id, "h", "closed"), 0.1)) == []  # backoff to ~1.1
    [busy] = only(Pull, announce(core, "x", [d(8)], 2.0))  # holds the one probe slot: no pull starts
    assert only(Pull, announce(core, "h", [d(1)], 3.0) + announce(core, "c0", [d(1)], 3.0)) == []
    assert only(Pull, announce(core, "c1", [d(1)], 3.1)) == []
    candidate = core._candidates.get(d(1))
    assert candidate is not None and set(candidate.announcers) == {"h", "c0"}
    assert core._peers["h"].failures == 1 and busy.peer == "x"


def test_peers_whose_pull_of_a_digest_failed_give_up_their_slots_to_an_untried_announcer() -> None:
    core = started(cfg(max_announcers_per_digest=2, max_attempts=100, backoff_base=5.0, backoff_max=5.0))
    pulls = only(Pull, announce(core, "a", [d(1)], 0.0) + announce(core, "b", [d(1)], 0.0))
    assert [p.peer for p in pulls] == ["a"]
    [retry] = only(Pull, core.handle(PullFailed(pulls[0].request_id, "a", "x"), 0.1))
    assert retry.peer == "b"
    assert only(Pull, core.handle(PullFailed(retry.request_id, "b", "x"), 0.2)) == []  # both backed off
    [pull] = only(Pull, announce(core, "h", [d(1)], 0.3))  # both slots were taken by failed peers
    assert pull.peer == "h"


def test_a_digest_whose_payload_does_not_match_is_never_pulled_again_from_that_peer() -> None:
    core = started(digest_of=sha)
    [pull] = only(Pull, announce(core, "a", [sha(b"good")], 0.0))
    core.handle(PullSucceeded(pull.request_id, "a", ((sha(b"good"), b"bad"),)), 0.1)
    assert core.stats.items_corrupt == 1
    assert only(Pull, core.poll(5.0) + announce(core, "a", [sha(b"good")], 5.0)) == []
    [pull] = only(Pull, announce(core, "b", [sha(b"good")], 5.1))
    assert pull.peer == "b"


def test_junk_rejections_cannot_make_the_core_forget_an_admitted_digest() -> None:
    # Sybils serve junk until the bounded memory of handled digests overflows; the honest announcer
    # still announces its admitted item, which must not be pulled again (admission would call it a
    # replay, charged to the honest peer, and the core would shun it).
    core = started(cfg(max_remembered=8, max_rejections=1000, peer_download_burst=64 * 1024 * 1024))
    [pull] = only(Pull, announce(core, "h", [d(0)], 0.0))
    succeed(core, pull, 0.0)
    core.handle(AdmissionResult("h", d(0), True, "accepted"), 0.0)
    junk = 0
    for s in range(6):
        t = 0.1 * (s + 1)
        credited(core, f"sybil{s}", t)  # its pulls are full size
        for pull in only(Pull, announce(core, f"sybil{s}", [d(1000 + 16 * s + i) for i in range(16)], t)):
            succeed(core, pull, t)
            for digest in pull.digests:
                junk += 1
                reason, copy = ("bad_signature", True) if digest[0] % 2 else ("invalid_payload", False)
                core.handle(AdmissionResult(pull.peer, digest, False, reason, copy_refused=copy), t)
    assert junk == 96 and core.sizes().remembered <= 8 + 7  # and the 7 admitted: h's, each sybil's first
    assert only(Pull, announce(core, "h", [d(0)], 1.0)) == []
    assert only(Pull, core.poll(30.0) + announce(core, "h", [d(0)], 30.0)) == []  # within remember_ttl


def test_a_replayed_digest_is_remembered_as_safely_as_an_admitted_one() -> None:
    core = started(cfg(max_remembered=1))
    [pull] = only(Pull, announce(core, "h", [d(0)], 0.0))
    succeed(core, pull, 0.0)
    core.handle(AdmissionResult("h", d(0), False, "replay"), 0.0)  # admission holds it as seen
    [pull] = only(Pull, announce(core, "x", [d(1), d(2)], 0.1))
    succeed(core, pull, 0.1)
    for digest in pull.digests:
        core.handle(AdmissionResult("x", digest, False, "invalid_payload"), 0.1)
    assert only(Pull, announce(core, "h", [d(0)], 0.2)) == []


# --- invariants under random event sequences -------------------------------------------------

PEERS = ["p0", "p1", "p2", "p3", "p4"]
DIGESTS = [bytes([i]) * 4 for i in range(24)]
SM_CONFIG = cfg(
    round_seconds=5.0,
    read_interval=1.0,
    keep_rounds=1,
    remember_rounds=3,
    max_own_items=6,
    max_digests_per_announcement=4,
    max_candidates=12,
    max_candidates_per_peer=6,
    max_announcers_per_digest=3,
    max_digests_per_pull=3,
    max_inflight_pulls=3,
    max_inflight_pulls_per_peer=2,
    max_probe_pulls=2,
    probe_timeout=1.5,  # tells a small pull apart in assert_bounds
    pull_timeout=3.0,
    pull_rate=1.0,
    pull_burst=4.0,
    max_attempts=3,
    max_pending_admissions=5,
    max_pending_admissions_per_peer=3,
    overload_pause=0.5,
    admission_timeout=4.0,
    max_rejections=2,
    rejection_shun_seconds=7.0,
    max_remembered=64,  # > len(DIGESTS): forgetting happens by expiry only, so the no-duplicate rule is exact
    max_serve_batch=3,
    serve_rate=1.0,
    serve_burst=2.0,
    max_peers=3,
    max_bans=len(PEERS),
)


def within_rate(entries: list[tuple[float, int]], rate: float, burst: float) -> bool:
    """Every window ending at the newest entry holds at most burst + rate * its length."""
    end, total = entries[-1][0], 0
    for t, n in reversed(entries):
        total += n
        if total > burst + rate * (end - t) + 1e-6:
            return False
    return True


class GossipMachine(RuleBasedStateMachine):
    """Feeds random events and checks every action against the rules, after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.core = GossipCore(SM_CONFIG, "me")
        self.now = 0.0
        self.inflight: dict[int, Pull] = {}
        self.awaiting: dict[bytes, str] = {}
        self.own: set[bytes] = set()
        self.bans: dict[str, float] = {}
        self.overloaded_until = -1.0
        self.last_admit: dict[bytes, float] = {}
        self.pulled: dict[str, list[tuple[float, int]]] = defaultdict(list)
        self.served: dict[str, list[tuple[float, int]]] = defaultdict(list)
        self.apply(self.core.poll(self.now))

    def apply(self, actions: list[GossipAction]) -> None:
        c = SM_CONFIG
        cancelled: list[GossipEvent] = []
        for action in actions:
            match action:
                case Pull(request_id=rid, peer=peer, digests=digests):
                    assert rid not in self.inflight
                    assert 1 <= len(digests) <= c.max_digests_per_pull and len(set(digests)) == len(digests)
                    assert not set(digests) & self.own, "own items are never pulled"
                    assert self.bans.get(peer, -1.0) <= self.now, "banned peers are never pulled from"
                    assert self.now >= self.overloaded_until, "no pull while our admission queue is full"
                    awaiting = {
                        x for x in self.awaiting if self.now - self.last_admit[x] < c.admission_timeout
                    }
                    busy = {x for p in self.inflight.values() for x in p.digests} | awaiting
                    assert not set(digests) & busy, "a digest is in at most one pull or admission"
                    self.inflight[rid] = action
                    self.pulled[peer].append((self.now, len(digests)))
                    assert within_rate(self.pulled[peer], c.pull_rate, c.pull_burst), "pull rate limit"
                case CancelPull(request_id=rid):
                    assert self.inflight.pop(rid).peer == action.peer
                    # As the driver: a cancelled call reports what it had read (nothing here).
                    cancelled.append(PullFailed(rid, action.peer, "cancelled", received=0))
                case Admit(peer=peer, digest=digest):
                    assert digest not in self.own
                    previous = self.last_admit.get(digest)
                    assert previous is None or self.now - previous >= c.remember_ttl, "duplicate Admit"
                    self.last_admit[digest] = self.now
                    self.awaiting[digest] = peer
                case Serve(peer=peer, digests=digests):
                    assert set(digests) <= self.own and len(digests) <= c.max_serve_batch
                    self.served[peer].append((self.now, len(digests)))
                    assert within_rate(self.served[peer], c.serve_rate, c.serve_burst), "serve rate limit"
                case Retire(digest=digest):
                    self.own.discard(digest)
                case Announce(digests=digests):
                    assert 1 <= len(digests) <= c.max_digests_per_announcement
                case ReadAnnouncements(rounds=rounds):
                    assert rounds == (
                        self.core.current_round(self.now),
                        self.core.current_round(self.now) - 1,
                    )
        if cancelled:
            self.apply(self.core.handle_all(cancelled, self.now))
        self.assert_bounds()

    def assert_bounds(self) -> None:
        c = SM_CONFIG
        probes = Counter(p.peer for p in self.inflight.values() if p.timeout == c.probe_timeout)  # small
        assert sum(probes.values()) <= c.max_probe_pulls and max(probes.values(), default=0) <= 1
        assert len(self.inflight) - sum(probes.values()) <= c.max_inflight_pulls
        per_peer = Counter(p.peer for p in self.inflight.values())
        assert max(per_peer.values(), default=0) <= c.max_inflight_pulls_per_peer
        sizes = self.core.sizes()
        assert sizes.inflight_pulls == len(self.inflight)
        assert sizes.own_items <= c.max_own_items and sizes.candidates <= c.max_candidates
        assert sizes.pending_admissions <= c.max_pending_admissions
        pending = Counter(p.peer for p in self.inflight.values() for _ in p.digests)
        pending.update(
            peer
            for digest, peer in self.awaiting.items()
            if self.now - self.last_admit[digest] < c.admission_timeout
        )
        assert max(pending.values(), default=0) <= c.max_pending_admissions_per_peer
        assert (
            sizes.remembered <= c.max_remembered and sizes.peers <= c.max_peers and sizes.bans <= c.max_bans
        )

    def step(self, event: GossipEvent) -> None:
        self.apply(self.core.handle(event, self.now))

    @rule(digest=st.sampled_from(DIGESTS), size=st.integers(0, 100))
    def publish(self, digest: bytes, size: int) -> None:
        actions = self.core.handle(Publish(digest, size), self.now)
        if Retire(digest) not in actions:
            self.own.add(digest)
        self.apply(actions)

    @rule(
        peer=st.sampled_from([*PEERS, "me"]),
        offset=st.integers(-2, 2),
        digests=st.lists(st.sampled_from(DIGESTS), max_size=6),
    )
    def announced(self, peer: str, offset: int, digests: list[bytes]) -> None:
        self.step(Announced(peer, self.core.current_round(self.now) + offset, tuple(digests)))

    @rule(dt=st.floats(0.0, 3.0))
    def time_passes(self, dt: float) -> None:
        self.now += dt
        self.apply(self.core.poll(self.now))
        deadline = self.core.next_deadline()
        assert deadline is None or deadline > self.now, "after a poll nothing is due"

    @precondition(lambda self: self.inflight)
    @rule(data=st.data(), junk=st.booleans())
    def pull_answered(self, data: st.DataObject, junk: bool) -> None:
        pull = self.inflight.pop(data.draw(st.sampled_from(sorted(self.inflight))))
        sent = data.draw(st.lists(st.sampled_from(pull.digests), unique=True))
        items = tuple((x, b"payload" + x) for x in sent) + (((DIGESTS[0], b"junk"),) if junk else ())
        self.step(PullSucceeded(pull.request_id, pull.peer, items))

    @precondition(lambda self: self.inflight)
    @rule(data=st.data())
    def pull_failed(self, data: st.DataObject) -> None:
        pull = self.inflight.pop(data.draw(st.sampled_from(sorted(self.inflight))))
        self.step(PullFailed(pull.request_id, pull.peer, "connection reset"))

    @rule(request_id=st.integers(0, 50), peer=st.sampled_from(PEERS))
    def stray_result(self, request_id: int, peer: str) -> None:
        if request_id not in self.inflight:
            self.step(PullSucceeded(request_id, peer, ((DIGESTS[1], b"x"),)))

    @precondition(lambda self: self.awaiting)
    @rule(data=st.data(), outcome=st.sampled_from(["ok", "bad_reward", "busy", "overloaded"]))
    def verdict(self, data: st.DataObject, outcome: str) -> None:
        digest = data.draw(st.sampled_from(sorted(self.awaiting)))
        peer = self.awaiting.pop(digest)
        accepted, overloaded = outcome == "ok", outcome == "overloaded"
        busy = outcome in ("busy", "overloaded")
        reason = "cpu_budget" if busy else outcome
        result = AdmissionResult(
            peer, digest, accepted, reason, charged=not busy, busy=busy, overloaded=overloaded
        )
        if overloaded and self.now - self.last_admit[digest] < SM_CONFIG.admission_timeout:
            self.overloaded_until = self.now + SM_CONFIG.overload_pause  # (a late verdict is ignored)
            del self.last_admit[digest]  # refused for our load alone: it is pulled and admitted again
        self.step(result)

    @rule(peer=st.sampled_from(PEERS), duration=st.floats(0.0, 20.0))
    def banned(self, peer: str, duration: float) -> None:
        self.bans[peer] = max(self.bans.get(peer, -1.0), self.now + duration)
        self.step(PeerBanned(peer, self.now + duration))

    @rule(peer=st.sampled_from(PEERS), digests=st.lists(st.sampled_from(DIGESTS), max_size=5))
    def pull_requested(self, peer: str, digests: list[bytes]) -> None:
        actions = self.core.handle(PullRequest(peer, tuple(digests)), self.now)
        [serve] = only(Serve, actions)
        if self.bans.get(peer, -1.0) > self.now:
            assert serve.digests == ()
        self.apply(actions)


GossipMachine.TestCase.settings = settings(
    max_examples=120, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_random_event_sequences_never_break_caps_limits_or_dedupe = GossipMachine.TestCase


# --- many cores exchanging: a plain loop with a fake clock -----------------------------------


class LoopbackSwarm:
    """N cores, a dict for the announcement store, a heap of timed deliveries. No threads, no I/O."""

    def __init__(
        self, n: int, config: GossipConfig, *, seed: int, loss: float = 0.0, forger: str = ""
    ) -> None:
        self.config = config
        self.now = 0.0
        self.latency = 0.05
        self.loss = loss
        self.forger = forger  # announces everyone's digests, serves garbage
        self.rng = random.Random(seed)
        self.cores = {f"n{i}": GossipCore(config, f"n{i}", digest_of=sha) for i in range(n)}
        self.payloads: dict[str, dict[bytes, bytes]] = {node: {} for node in self.cores}
        self.records: dict[int, dict[tuple[str, int], tuple[bytes, ...]]] = defaultdict(dict)
        self.queue: list[tuple[float, int, str, Any]] = []
        self.seq = itertools.count()
        self.admitted: Counter[tuple[str, bytes]] = Counter()
        self.pulls_to: Counter[str] = Counter()

    def later(self, delay: float, node: str, message: Any) -> None:
        heapq.heappush(self.queue, (self.now + delay, next(self.seq), node, message))

    def perform(self, node: str, actions: list[GossipAction]) -> None:
        for action in actions:
            match action:
                case Announce():
                    self.records[action.round][(node, action.part)] = action.digests
                case ReadAnnouncements():
                    for r in action.rounds:
                        records = dict(self.records.get(r, {}))
                        if self.forger:  # listed first, so it is the first to offer every digest
                            offered = tuple(x for digests in records.values() for x in digests)
                            records = {(self.forger, 0): offered, **records}
                        read = [Announced(peer, r, digests) for (peer, _), digests in records.items()]
                        self.later(self.latency, node, read)  # one read's records arrive together
                case Pull():
                    self.pulls_to[action.peer] += 1
                    if action.peer == self.forger:
                        items = tuple((x, b"forged") for x in action.digests)
                        self.later(
                            2 * self.latency, node, PullSucceeded(action.request_id, action.peer, items)
                        )
                    elif self.rng.random() < self.loss:
                        self.later(self.latency, node, PullFailed(action.request_id, action.peer, "lost"))
                    else:
                        self.later(self.latency, action.peer, ("request", node, action))
                case Admit():
                    self.admitted[(node, action.digest)] += 1
                    self.later(0.01, node, AdmissionResult(action.peer, action.digest, True, "ok"))
                case Retire():
                    self.payloads[node].pop(action.digest, None)
                case CancelPull():
                    pass  # a late answer is ignored by the core
                case Serve():
                    raise AssertionError("Serve only answers a PullRequest")

    def deliver(self, node: str, message: Any) -> None:
        if isinstance(message, list):
            self.perform(node, self.cores[node].handle_all(message, self.now))
        elif isinstance(message, tuple):  # a pull request reaching the serving node
            _, requester, pull = message
            actions = self.cores[node].handle(PullRequest(requester, pull.digests), self.now)
            [serve] = only(Serve, actions)
            items = tuple((x, self.payloads[node][x]) for x in serve.digests)
            self.later(self.latency, requester, PullSucceeded(pull.request_id, node, items))
            self.perform(node, [a for a in actions if not isinstance(a, Serve)])
        else:
            self.perform(node, self.cores[node].handle(message, self.now))

    def publish(self, node: str, payload: bytes) -> bytes:
        self.payloads[node][sha(payload)] = payload
        self.perform(node, self.cores[node].handle(Publish(sha(payload), len(payload)), self.now))
        return sha(payload)

    def run_until(self, end: float, publications: list[tuple[float, str, bytes]]) -> dict[bytes, str]:
        published: dict[bytes, str] = {}
        pending = sorted(publications)
        while True:
            deadlines = {node: core.next_deadline() for node, core in self.cores.items()}
            times = [t for t in deadlines.values() if t is not None]
            times += [self.queue[0][0]] if self.queue else []
            times += [pending[0][0]] if pending else []
            t = min(times)
            if t > end:
                return published
            self.now = max(self.now, t)
            if pending and pending[0][0] <= self.now:
                _, node, payload = pending.pop(0)
                published[self.publish(node, payload)] = node
            elif self.queue and self.queue[0][0] <= self.now:
                _, _, node, message = heapq.heappop(self.queue)
                self.deliver(node, message)
            else:
                for node, deadline in deadlines.items():
                    if deadline is not None and deadline <= self.now:
                        self.perform(node, self.cores[node].poll(self.now))


def _publications(seed: int, nodes: int, per_node: int, until: float) -> list[tuple[float, str, bytes]]:
    rng = random.Random(seed)
    return [
        (rng.uniform(0.0, until), f"n{i}", b"rollout group %d from n%d" % (k, i))
        for i in range(nodes)
        for k in range(per_node)
    ]


@pytest.mark.parametrize(("loss", "forger"), [(0.0, ""), (0.2, ""), (0.0, "a-forger")])
def test_every_item_published_by_one_of_five_cores_reaches_all_others_exactly_once(
    loss: float, forger: str
) -> None:
    config = cfg(round_seconds=10.0, read_interval=1.0, max_attempts=8, backoff_max=2.0, max_rejections=2)
    swarm = LoopbackSwarm(5, config, seed=7, loss=loss, forger=forger)
    published = swarm.run_until(60.0, _publications(seed=3, nodes=5, per_node=12, until=25.0))
    assert len(published) == 60
    for digest, origin in published.items():
        for node in swarm.cores:
            expected = 0 if node == origin else 1
            assert swarm.admitted[(node, digest)] == expected, (node, origin, digest.hex()[:8])
    assert all(count == 1 for count in swarm.admitted.values())
    if forger:
        assert all(core.stats.items_corrupt > 0 for core in swarm.cores.values())
        # Caught by digest, counted against the forger, which then ranks last: tried once or twice.
        assert swarm.pulls_to[forger] <= 2 * len(swarm.cores)
    if loss:
        assert sum(core.stats.pulls_failed for core in swarm.cores.values()) > 0


def test_accepted_items_between_them_do_not_let_unusable_items_flow_for_good() -> None:
    # Red team rt21: one accepted item (relayable from an honest signer) every max_unusable - 1
    # reset the count, so a peer could keep us downloading items we refuse at the full pull rate.
    core = started(cfg(max_unusable=16, rejection_shun_seconds=600.0))  # max_unusable_per_window 64
    refused = 0
    for i in range(200):
        t = 1.0 + i
        pulls = only(Pull, core.poll(t) + announce(core, "a", [d(1 + i)], t))
        if not pulls:
            continue
        succeed(core, pulls[0], t)
        accepted = i % 16 == 15
        refused += not accepted
        verdict = AdmissionResult(
            "a", d(1 + i), accepted, "ok" if accepted else "task_not_allowed", charged=False
        )
        core.handle(verdict, t)
    assert refused <= 64 and core.stats.peers_paused == 1 and not core.is_banned("a", 201.0)
