"""Relaying (issue #18, ``GossipConfig.relay``): a node serves and announces the items it admitted,
in the round they were announced in and no longer than their author serves them, within bounds of
its own, and its driver keeps exactly the payloads the core relays."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import pytest

from swarmnode.errors import ConfigError
from swarmnode.gossip import (
    AdmissionResult,
    Admit,
    Announce,
    Announced,
    GossipConfig,
    GossipCore,
    Publish,
    Pull,
    PullRequest,
    PullSucceeded,
    Retire,
    Serve,
)
from swarmnode.gossip.core import RELAY_PART
from swarmnode.gossip.intake import ExternalPool, envelope_digest
from swarmnode.train.batch import ScoredGroup

from .test_core import cfg, d, only
from .test_core import started as started_core
from .test_intake import T0, batch_bytes, vectors_receiver

KEY = b"relay test"  # the secret a relay's places are ranked by (``selection_key``)


def started(config: GossipConfig | None = None, now: float = 0.0, **kwargs: Any) -> GossipCore:
    return started_core(config, now, **{"selection_key": KEY, **kwargs})


def relaying(**overrides: Any) -> GossipConfig:
    return cfg(**{"relay": True, "admission_timeout": 30.0, **overrides})


def admitted(
    core: GossipCore,
    author: str,
    digest: bytes,
    now: float,
    *,
    size: int = 100,
    sent_at: float | None = None,
    stale_at: float | None = None,
    record_round: int | None = None,
) -> list[Any]:
    """``author`` announces ``digest`` (in ``record_round``, else the round of ``now``); it is pulled
    at once and accepted at ``now``, signed at ``sent_at`` (else ``now``): the core's actions on the
    verdict."""
    r = core.current_round(now) if record_round is None else record_round
    [pull] = only(Pull, core.handle(Announced(author, r, (digest,)), now))
    admit = only(Admit, core.handle(PullSucceeded(pull.request_id, author, ((digest, b"x" * size),)), now))
    assert [a.digest for a in admit] == [digest]
    signed = now if sent_at is None else sent_at
    return core.handle(AdmissionResult(author, digest, True, "ok", sent_at=signed, stale_at=stale_at), now)


def test_an_admitted_item_is_served_and_announced_in_its_round_until_its_authors_copy_expires() -> None:
    core = started(relaying(keep_rounds=1))
    assert only(Retire, admitted(core, "author", d(1), 12.0)) == []  # round 1
    # Served at once; in a relay part of round 1's record, written when round 1 ends (its places
    # are the best-ranked until then: red team rt73 F2); served until 30 s as the author's copy is.
    assert core.handle(PullRequest("reader", (d(1),)), 13.0) == [Serve("reader", (d(1),))]
    assert only(Announce, core.poll(19.9)) == []
    assert only(Announce, core.poll(20.0)) == [Announce(1, RELAY_PART, (d(1),), 30.0)]
    assert core.stats.relayed == 1
    assert Retire(d(1)) in core.poll(30.0)
    assert core.handle(PullRequest("reader", (d(1),)), 30.0) == [Serve("reader", ())]
    # Never pulled again, whoever announces it.
    assert only(Pull, core.handle(Announced("copy", 2, (d(1),)), 30.5)) == []


def test_an_item_admitted_after_its_round_went_out_of_reading_is_not_relayed() -> None:
    core = started(relaying())
    [pull] = only(Pull, core.handle(Announced("author", 0, (d(1),)), 1.0))
    core.handle(PullSucceeded(pull.request_id, "author", ((d(1), b"x" * 100),)), 1.0)
    # Round 2: round 0 is no longer read (read_back_rounds = 1), so no one would pull it from us.
    verdict = AdmissionResult("author", d(1), True, "ok", sent_at=1.0)
    assert only(Retire, core.handle(verdict, 21.0)) == [Retire(d(1))]
    assert core.stats.relay_dropped == 1
    assert core.handle(PullRequest("reader", (d(1),)), 21.0) == [Serve("reader", ())]


def test_a_verdict_the_core_no_longer_waits_for_retires_the_payload_the_driver_kept() -> None:
    core = started(relaying(admission_timeout=2.0))
    [pull] = only(Pull, core.handle(Announced("author", 0, (d(1),)), 1.0))
    core.handle(PullSucceeded(pull.request_id, "author", ((d(1), b"x"),)), 1.0)
    core.poll(4.0)  # the admission timed out
    assert only(Retire, core.handle(AdmissionResult("author", d(1), True, "ok", sent_at=1.0), 5.0)) == [
        Retire(d(1))
    ]
    # Without relaying the driver keeps nothing, and nothing is retired.
    plain = started(cfg(admission_timeout=2.0))
    [pull] = only(Pull, plain.handle(Announced("author", 0, (d(1),)), 1.0))
    plain.handle(PullSucceeded(pull.request_id, "author", ((d(1), b"x"),)), 1.0)
    plain.poll(4.0)
    assert only(Retire, plain.handle(AdmissionResult("author", d(1), True, "ok"), 5.0)) == []


def test_without_relaying_an_admitted_item_is_neither_served_nor_announced() -> None:
    core = started(cfg())
    assert admitted(core, "author", d(1), 2.0) == []
    assert only(Announce, core.poll(3.0)) == []
    assert core.handle(PullRequest("reader", (d(1),)), 3.0) == [Serve("reader", ())]


def test_relays_take_at_most_half_the_own_items_so_own_publications_still_go_out() -> None:
    core = started(relaying(max_own_items=4))
    actions = [only(Retire, admitted(core, f"author{i}", d(i), 2.0)) for i in range(3)]
    # A bound over every round (never reached with the defaults: 3 rounds of 64 places), not ranked.
    assert actions == [[], [], [Retire(d(2))]]
    assert core.stats.relayed == 2 and core.stats.relay_dropped == 1
    assert core.handle(Publish(d(10), 10), 2.0) == []
    assert core.handle(Publish(d(11), 10), 2.0) == []
    assert core.sizes().own_items == 4


def test_a_round_holds_at_most_one_record_part_of_relayed_ids() -> None:
    core = started(relaying(max_digests_per_announcement=2))
    actions = [admitted(core, f"author{i}", d(i), 2.0) for i in range(3)]
    out = worst(core, d(0), d(1), d(2))
    kept = tuple(x for x in (d(0), d(1), d(2)) if x != out)
    assert [r for a in actions for r in only(Retire, a)] == [Retire(out)]
    assert only(Announce, core.poll(10.0)) == [Announce(0, RELAY_PART, kept, 30.0)]
    assert core.handle(PullRequest("r", (d(0), d(1), d(2))), 10.0) == [Serve("r", kept)]
    assert only(Retire, admitted(core, "author7", d(7), 12.0)) == []  # the next round has room again


def test_relayed_payload_bytes_are_bounded_by_max_relay_bytes_and_freed_as_items_expire() -> None:
    core = started(relaying(max_relay_bytes=250, keep_rounds=0))
    sizes = [100, 100, 100]
    actions = [only(Retire, admitted(core, f"author{i}", d(i), 2.0, size=s)) for i, s in enumerate(sizes)]
    # 96 payload bytes each (the 4-byte prefix is not kept): two fit, the best-ranked two
    assert [r for a in actions for r in a] == [Retire(worst(core, d(0), d(1), d(2)))]
    core.poll(10.0)  # round 0's items expire (keep_rounds = 0)
    assert only(Retire, admitted(core, "author9", d(9), 11.0, size=100)) == []


def test_the_driver_keeps_an_admitted_payload_for_the_core_to_serve_and_drops_what_it_retires() -> None:
    from swarmnode.admit.intake import Intake
    from swarmnode.gossip.driver import GossipDriver
    from swarmnode.net.hivemind_runtime import HivemindRuntime
    from swarmnode.ops.metrics import Metrics

    data = batch_bytes()
    digest = envelope_digest(data)
    assert digest is not None
    runtime = cast(HivemindRuntime, None)  # not touched: no pull, no announcement performed

    def scored(admitted: object) -> ScoredGroup:
        return cast(ScoredGroup, SimpleNamespace(source="alice", rewards=[1.0, 0.0]))

    def judged(core: GossipCore, admit: Admit) -> tuple[GossipDriver, list[Any]]:
        admission = vectors_receiver()
        intake = Intake(admission, clock=lambda: T0)  # the vectors' receiver judges at T0
        driver = GossipDriver(core, runtime, admission, ExternalPool(), scored, Metrics(), "s", intake=intake)
        try:
            asyncio.run(driver._admit(admit))
        finally:
            driver.intake.close()
        assert driver.own_payloads == {digest: data}  # kept before the core decides
        return driver, core.handle_all(driver._pending, T0)  # type: ignore[arg-type]

    # Pulled and awaited by the core: relayed, the bytes served are the author's signed envelope.
    core = GossipCore(GossipConfig(relay=True, round_seconds=60.0), "me", selection_key=KEY)
    core.poll(T0)
    [pull] = only(Pull, core.handle(Announced("author", core.current_round(T0), (digest,)), T0))
    [admit] = only(Admit, core.handle(PullSucceeded(pull.request_id, "author", ((digest, data),)), T0))
    driver, actions = judged(core, admit)
    assert only(Retire, actions) == [] and core.stats.relayed == 1
    assert core.handle(PullRequest("reader", (digest,)), T0) == [Serve("reader", (digest,))]
    assert driver.own_payloads[digest] == data

    # A verdict the core did not wait for: retired, and the driver lets the bytes go.
    stray = GossipCore(GossipConfig(relay=True, round_seconds=60.0), "me", selection_key=KEY)
    stray.poll(T0)
    driver, actions = judged(stray, Admit("author", digest, data))
    assert actions == [Retire(digest)]
    for action in actions:
        driver._perform(action)
    assert driver.own_payloads == {}


def test_the_relay_round_is_the_envelopes_signed_round_whatever_round_listed_it() -> None:
    # Red team rt71 F2: a copycat listed an author's round-0 id in round 1; the relay announced it
    # there and served it 10 s past the author's copy, to readers that had judged it already.
    core = started(relaying(keep_rounds=1))
    assert only(Retire, admitted(core, "copycat", d(1), 12.0, sent_at=5.0, record_round=1)) == []
    assert only(Announce, core.poll(13.0)) == [Announce(0, RELAY_PART, (d(1),), 20.0)]
    assert Retire(d(1)) in core.poll(20.0)
    # Signed in a round no longer read: not relayed at all.
    late = started(relaying())
    assert only(Retire, admitted(late, "copycat", d(2), 22.0, sent_at=5.0, record_round=2)) == [Retire(d(2))]


def test_an_envelope_that_turns_too_old_before_its_last_reader_could_judge_it_is_not_relayed() -> None:
    # Red team rt71 F1: an author signed envelopes 280 s old (max_age 300 s); readers refused them
    # from the relay as too old, charged the relay, and banned it.
    core = started(relaying(keep_rounds=1))  # round 0's copy served until 20 s
    judged_by = 20.0 + core.config.pull_timeout + core.config.admission_timeout
    assert only(Retire, admitted(core, "a", d(1), 2.0, sent_at=1.0, stale_at=judged_by - 0.1)) == [
        Retire(d(1))
    ]
    assert only(Retire, admitted(core, "b", d(2), 2.0, sent_at=1.0, stale_at=judged_by)) == []
    assert core.stats.relay_dropped == 1 and core.stats.relayed == 1


def test_relay_parts_are_written_at_most_once_a_read_interval() -> None:
    # Red team rt71 F3: each relayed admission rewrote the whole part 0.5 s later: 192 stores.
    core = started(relaying())
    stores: list[Announce] = []
    for i in range(6):  # signed in round 0, admitted in round 1 at 12.0, 12.3, ... 13.5; read_interval 1 s
        stores += only(Announce, admitted(core, f"a{i}", d(i), 12.0 + 0.3 * i, sent_at=2.0))
        stores += only(Announce, core.poll(12.1 + 0.3 * i))
    stores += only(Announce, core.poll(15.0))
    assert [(a.part, len(a.digests)) for a in stores] == [(RELAY_PART, 4), (RELAY_PART, 6)]


def test_with_a_demand_a_relays_ids_are_never_its_offers_only_more_sources_of_ids_drawn() -> None:
    # Red team rt71 F4: relayed ids took their relay's turns in the fair draw; 32 honest relays of
    # one attacker's 8 ids gave it 60% of a reader's picks.
    core = started(cfg(round_demand=2, select_at=0.0), selection_key=b"k")
    listed = core.handle(Announced("relay", 0, (d(1), d(2)), relayed=True), 1.0)
    assert only(Pull, listed + core.poll(2.0)) == [] and core._sampler.offers_of(0) == 0
    # Its author's record makes d(1) an offer; drawn, it is pulled from both.
    [pull] = only(Pull, core.handle(Announced("author", 0, (d(1),)), 2.5))
    assert pull.digests == (d(1),)
    core.handle(Announced("relay", 0, (d(1), d(2)), relayed=True), 3.0)
    in_flight = core._inflight.get(pull.request_id)
    assert in_flight is not None and set(in_flight.digests[d(1)].announcers) == {"author", "relay"}
    assert core._sampler.offers_of(0) == 0  # d(2) is still no offer


def test_a_record_is_a_relays_when_its_subkey_is_a_part_from_relay_part_on() -> None:
    from swarmnode.gossip.driver import is_relay_part

    assert is_relay_part(b"part%d" % RELAY_PART) and is_relay_part(b"part9999")
    for subkey in (b"part0", b"part999", b"part", b"partx1000", b"record", b"1000", b"part-1000"):
        assert not is_relay_part(subkey), subkey


def test_a_verdict_without_the_envelopes_send_time_is_not_relayed() -> None:
    core = started(relaying())
    [pull] = only(Pull, core.handle(Announced("author", 0, (d(1),)), 1.0))
    core.handle(PullSucceeded(pull.request_id, "author", ((d(1), b"x"),)), 1.0)
    assert only(Retire, core.handle(AdmissionResult("author", d(1), True, "ok"), 2.0)) == [Retire(d(1))]
    assert core.stats.relay_dropped == 1


def test_an_envelope_dated_ahead_of_the_relays_clock_is_not_relayed() -> None:
    # Red team rt72 F-A: 64 envelopes signed for the next round filled its relaying before it began;
    # F-D: one dated ahead was listed a round after its author's, re-pulled and charged as a replay.
    core = started(relaying())
    assert only(Retire, admitted(core, "a", d(1), 8.0, sent_at=11.0)) == [Retire(d(1))]
    assert only(Retire, admitted(core, "b", d(2), 8.0, sent_at=8.5)) == [Retire(d(2))]
    assert only(Retire, admitted(core, "c", d(3), 8.0, sent_at=7.5)) == []


def test_a_round_relays_a_few_envelopes_of_each_signer_and_its_share_of_the_bytes() -> None:
    # Red team rt72 F-A: one signer (or a few) filled every relay place and all 64 MiB.
    core = started(relaying(max_relay_per_signer=2))
    signed = [
        core.handle(
            AdmissionResult(*pulled(core, "via", d(i), 2.0), True, "ok", sent_at=2.0, signer="s"), 2.0
        )
        for i in range(3)
    ]
    assert [only(Retire, a) for a in signed] == [[], [], [Retire(d(2))]]
    # 600 bytes over the 3 rounds an item lives (keep_rounds 2): 200 a round, 96 bytes an item.
    shared = started(relaying(max_relay_bytes=600))
    kept = [only(Retire, admitted(shared, f"a{i}", d(i), 2.0)) for i in range(3)]
    assert [r for a in kept for r in a] == [Retire(worst(shared, d(0), d(1), d(2)))]
    assert only(Retire, admitted(shared, "a9", d(9), 12.0)) == []  # the next round has its own share


def worst(core: GossipCore, *digests: bytes) -> bytes:
    """The worst-ranked of ``digests`` for a relay place (``GossipCore._relay_rank``)."""
    return max(digests, key=core._relay_rank)


def pulled(core: GossipCore, peer: str, digest: bytes, now: float) -> tuple[str, bytes]:
    """``peer`` announces ``digest`` and serves it at once: the ``(peer, digest)`` awaiting a verdict."""
    [pull] = only(Pull, core.handle(Announced(peer, core.current_round(now), (digest,)), now))
    core.handle(PullSucceeded(pull.request_id, peer, ((digest, b"x" * 100),)), now)
    return peer, digest


def test_an_admitted_id_is_remembered_while_its_signed_round_is_read() -> None:
    # Red team rt73 F1: with 10-s rounds, an envelope dated 30 s ahead (admission's allowance) was
    # forgotten by a reader before its signed round stopped being read; a relay listing it there
    # was asked for it again, and the reader's admission charged the relay with a replay.
    core = started(cfg(remember_rounds=4), now=100.0)  # remembered for 40 s
    [pull] = only(Pull, core.handle(Announced("author", 10, (d(1),)), 100.5))
    core.handle(PullSucceeded(pull.request_id, "author", ((d(1), b"x"),)), 100.5)
    core.handle(AdmissionResult("author", d(1), True, "ok", sent_at=130.4), 100.5)  # signed in round 13
    assert only(Pull, core.handle(Announced("relay", 13, (d(1),), relayed=True), 141.0)) == []
    assert only(Pull, core.handle(Announced("relay", 13, (d(1),)), 149.0)) == []  # round 13 read until 150


def test_a_rounds_relay_places_go_to_the_best_ranked_items_not_the_first_to_come() -> None:
    # Red team rt73 F2: 16 new identities, each with 4 tiny valid batches dated at the round's
    # start, took a relay's 64 places of the round before any honest batch came; all 20 honest
    # batches of the round were then not relayed.
    core = started(relaying(round_seconds=30.0, read_interval=5.0))
    sybil = [d(1000 + i) for i in range(64)]
    honest = [d(i) for i in range(20)]
    retired: list[Retire] = []
    for i, digest in enumerate(sybil):
        retired += only(
            Retire, admitted(core, f"sybil{i // 4}", digest, 1.0 + 0.05 * i, size=200, sent_at=1.0)
        )
    assert retired == [] and core.stats.relayed == 64
    for i, digest in enumerate(honest):
        retired += only(Retire, admitted(core, f"honest{i}", digest, 10.0 + i, size=64 * 1024))
    # The round's 64 places hold the 64 best-ranked of the 84 items, whatever order they came in:
    # the attacker's share is its share of the items (unsteerable: the order is keyed and secret).
    best = sorted(sybil + honest, key=core._relay_rank)[:64]
    assert {r.digest for r in retired} == set(sybil + honest) - set(best)
    [part] = only(Announce, core.poll(30.0))  # listed when the round ends, not before
    assert set(part.digests) == set(best)
    relayed_honest = len(set(honest) & set(part.digests))
    assert relayed_honest == 17  # of 20 (before: 0); 64 x 20 / 84 = 15.2 expected
    assert core.stats.relay_displaced + core.stats.relay_dropped == 84 - 64  # each retired once
    served = core.handle(PullRequest("reader", tuple(honest[:16])), 30.0)
    assert set(served[0].digests) == set(honest[:16]) & set(best)  # a displaced id is no longer served


def test_a_listed_relay_id_is_never_displaced_and_a_displaced_one_was_never_listed() -> None:
    core = started(relaying(max_digests_per_announcement=2))
    first, second, better = sorted((d(i) for i in range(3)), key=core._relay_rank)[::-1]  # worst first
    assert only(Retire, admitted(core, "a", first, 2.0)) == []
    assert only(Retire, admitted(core, "b", second, 3.0)) == []
    # Before the round's part is written, a better-ranked item takes the worst one's place; that
    # one was served, never announced, and is retired (the driver drops its payload).
    assert only(Retire, admitted(core, "c", better, 4.0)) == [Retire(first)]
    assert core.handle(PullRequest("r", (first, second, better)), 4.0) == [Serve("r", (second, better))]
    assert only(Announce, core.poll(10.0)) == [Announce(0, RELAY_PART, (second, better), 30.0)]
    # Listed, they stay until they expire: a better-ranked item after that is not relayed.
    best = min((d(i) for i in range(3, 40)), key=core._relay_rank)
    assert core._relay_rank(best) < core._relay_rank(second)
    assert only(Retire, admitted(core, "e", best, 11.0, sent_at=5.0)) == [Retire(best)]
    assert core.handle(PullRequest("r", (second, better, best)), 11.0) == [Serve("r", (second, better))]


def test_relaying_without_a_selection_key_is_an_error() -> None:
    # The places are ranked by a keyed hash: without a secret anyone could grind ids that rank first.
    with pytest.raises(ConfigError, match="selection_key"):
        GossipCore(relaying(), "me")
