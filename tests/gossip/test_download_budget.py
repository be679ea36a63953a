"""Specification of the download budget for peers not proven (GossipConfig.unproven_download_*).

Red team rt28: 2-MiB envelopes of an unknown protocol version count only toward a pause, so each
free identity made a node download ~32 MiB before it stopped pulling from it (512 ids: ~8 GiB a
minute); stalling just under the charged size cost ~10 MiB a minute per id for ever. All peers
not proven now share one byte budget, and a free id that served nothing intact comes after one
that did not fail us."""

from __future__ import annotations

import hashlib
import itertools

import pytest

from swarmnode.core import PeerBanned
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
    Serve,
)

MiB = 1024 * 1024
ITEM = 2 * MiB + 4  # the most one asked-for item may cost: max_item_bytes and its length prefix
_ids = itertools.count()


def fresh(n: int) -> tuple[bytes, ...]:
    return tuple(hashlib.sha256(b"digest-%d" % next(_ids)).digest() for _ in range(n))


def pulls(actions: list[GossipAction]) -> list[Pull]:
    return [a for a in actions if isinstance(a, Pull)]


def core_with(**overrides: float) -> GossipCore:
    times = dict(round_seconds=10.0, read_interval=1.0, pull_timeout=5.0, backoff_max=8.0)
    config = GossipConfig(**times, **overrides)
    core = GossipCore(config, "me")
    core.poll(0.0)
    return core


def announce(core: GossipCore, peer: str, digests: tuple[bytes, ...], now: float) -> list[Pull]:
    return pulls(core.handle(Announced(peer, core.current_round(now), digests), now))


def serve_valid(core: GossipCore, pull: Pull, now: float) -> list[Pull]:
    """``pull``'s server answers with every asked-for item, each of 100 bytes, all accepted."""
    items = tuple((digest, b"v" * 100) for digest in pull.digests)
    actions = core.handle(PullSucceeded(pull.request_id, pull.peer, items, received=104 * len(items)), now)
    for digest in pull.digests:
        actions += core.handle(AdmissionResult(pull.peer, digest, True, "accepted"), now)
    return pulls(actions)


def reserved(core: GossipCore) -> int:
    """What the pulls in flight hold of the download budget."""
    return sum(pull.reserved for _, pull in core._inflight.items())


def proven(core: GossipCore, peer: str, now: float) -> None:
    """``peer`` serves an item that is accepted, and nothing of it failed: it is proven."""
    [first] = announce(core, peer, fresh(1), now)
    assert serve_valid(core, first, now) == []
    assert core._proven(peer)


def test_the_budget_must_hold_one_item_or_no_peer_could_prove_itself() -> None:
    with pytest.raises(ConfigError, match="unproven_download_burst"):
        GossipConfig(unproven_download_burst=2 * MiB)
    with pytest.raises(ConfigError, match="unproven_download_rate"):
        GossipConfig(unproven_download_rate=0.0)
    GossipConfig(unproven_download_burst=ITEM)


def test_free_ids_serving_envelopes_of_an_unknown_version_download_no_more_than_the_budget() -> None:
    core = core_with(unproven_download_rate=MiB, unproven_download_burst=8 * MiB)
    ids = [f"free{i}" for i in range(32)]
    served = 0
    seconds = 60
    for now in range(seconds):
        waiting = []
        for peer in ids:  # every id announces new digests each second and answers each pull at once
            waiting += announce(core, peer, fresh(8), float(now))
        while waiting:
            pull = waiting.pop()
            n = len(pull.digests)  # one 2-MiB envelope of version 9 per asked-for id
            if pull.max_bytes is not None:  # a probe: the driver stops reading at its limit
                served += pull.max_bytes
                rid, peer = pull.request_id, pull.peer
                answer: GossipEvent = PullFailed(rid, peer, "too_large", False, pull.max_bytes)
            else:
                served += n * ITEM
                answer = PullSucceeded(pull.request_id, pull.peer, (), ("unsupported_version",) * n, n * ITEM)
            waiting += pulls(core.handle(answer, float(now)))
    budget = 8 * MiB + seconds * MiB
    assert core.stats.bytes_pulled == served
    assert budget - 2 * ITEM <= served <= budget  # without it: 16 in a row each before a pause, ~1 GiB


def test_an_answer_of_one_valid_item_and_junk_ends_its_servers_standing() -> None:
    # Its valid item is accepted, so its score rises and no item of it stays refused; before the
    # standing counted the bytes of the last answer, that made the next pull free of the budget.
    core = core_with(credit_per_accepted_byte=1e5)  # credit enough for any answer
    proven(core, "a", 0.0)
    [pull] = announce(core, "a", fresh(1), 1.0)  # free of the budget: "a" is proven
    assert pull.max_bytes is None
    [(digest,)] = [pull.digests]
    junk = ("unsupported_version",)
    answer = PullSucceeded(pull.request_id, "a", ((digest, b"v" * 100),), junk, 104 + ITEM)
    core.handle(answer, 1.0)
    core.handle(AdmissionResult("a", digest, True, "accepted"), 1.0)
    assert not core._proven("a")
    spent = core.stats.bytes_unvouched
    [again] = announce(core, "a", fresh(1), 2.0)
    serve_valid(core, again, 2.1)
    assert core.stats.bytes_unvouched == spent + 104  # its next pull went through the download budget


def test_a_peer_whose_last_pull_failed_is_pulled_after_a_fresh_announcer_read_later() -> None:
    core = core_with(max_unproven_pulls=1, max_probe_pulls=1)  # all three are sent probes (below)
    [pull] = announce(core, "stalls", fresh(1), 0.0)
    core.handle(PullFailed(pull.request_id, "stalls", "timeout", received=STALL), 5.0)
    [busy] = announce(core, "busy", fresh(1), 6.5)  # its backoff is over; the one slot is taken
    assert announce(core, "stalls", fresh(4), 7.0) == []
    assert announce(core, "newcomer", fresh(1), 7.5) == []
    [first] = serve_valid(core, busy, 8.0)  # the slot is free again...
    assert first.peer == "newcomer"  # ...and goes to the newcomer; before, to the oldest candidates'
    assert [p.peer for p in serve_valid(core, first, 8.1)] == ["stalls"]  # then "stalls" gets its turn


STALL = MiB - 1  # just under what the driver charges as a stall (driver.STALLED_ANSWER_BYTES)


def test_a_peer_neither_established_nor_on_credit_is_pulled_small_and_slow_starts() -> None:
    # A small pull asks for as many items as its peer ever served intact (1 or 2), reads at most
    # 128 KiB of each and gives up after probe_timeout: each free id that serves junk costs that
    # much (red team rt28), and one that stalls holds one slot of the probe pool for that long
    # (rt45 F1, rt46 F1). Established (8 accepted items), its pulls are full size.
    core = core_with(probe_timeout=2.0)
    [pull] = announce(core, "newcomer", fresh(20), 0.0)
    seen = [[(1, 128 * 1024, 2.0)]]
    for now in range(1, 6):
        more = serve_valid(core, pull, float(now))  # the next pull opens at the answer
        seen.append([(len(p.digests), p.max_bytes, p.timeout) for p in more])
        pull = more[0]
    kib = 1024
    assert seen == [
        [(1, 128 * kib, 2.0)],  # one at a time...
        [(1, 128 * kib, 2.0)],
        [(2, 256 * kib, 2.0)],
        [(2, 256 * kib, 2.0)],
        [(2, 256 * kib, 2.0)],
        # ...and established by the 5th pull's verdicts (8 items accepted): full size, as much as
        # its download rate leaves room for (16 MiB, less what it read and what is in flight)
        [(2, 256 * kib, 2.0), (7, None, 5.0)],
    ]


def test_stalled_probes_hold_a_pool_of_their_own_and_only_for_the_probe_timeout() -> None:
    # Red team rt45 F1: in the 8 slots of peers not proven, 10 s each, 16 free ids every 5 s whose
    # pulls stalled to the timeout held all of them, and honest newcomers lost 67% of their items.
    core = core_with(max_probe_pulls=4, max_unproven_pulls=2, probe_timeout=1.0, credit_per_accepted_byte=1e6)
    proven(core, "served", 0.0)  # on credit
    probes = [p for i in range(6) for p in announce(core, f"free{i}", fresh(1), 0.0)]
    assert len(probes) == 4  # the probe pool is full...
    assert len(announce(core, "served", fresh(2), 0.1)) == 1  # ...but not the pulls of peers on credit
    actions = core.poll(1.1)  # the core's expiry: probe_timeout and 10%
    assert sorted(a.peer for a in actions if isinstance(a, CancelPull)) == [f"free{i}" for i in range(4)]
    assert sorted(p.peer for p in pulls(actions)) == ["free4", "free5"]


def test_an_honest_item_larger_than_a_probe_costs_its_server_nothing() -> None:
    core = core_with(probe_timeout=1.0)
    [probe] = announce(core, "big", fresh(1), 1.0)
    assert (probe.max_bytes, probe.timeout) == (128 * 1024, 1.0)
    # The driver read 128 KiB of a 1-MiB envelope and gave up (CallFailure.TOO_LARGE), uncharged.
    cut = PullFailed(probe.request_id, "big", "too_large", charged=True, received=probe.max_bytes)
    [full] = pulls(core.handle(cut, 1.2))  # no backoff: one item a pull, read whole
    assert core.stats.pulls_refused == 0 and core._peers["big"].rejections == 0
    assert full.peer == "big" and full.digests == probe.digests and full.max_bytes is None
    # Read whole, in probe_timeout while it never served an item intact (red team rt49 F1: free
    # ids outgrowing on purpose held a whole item of the budget for 10 s each)...
    assert full.timeout == 1.0
    cut = PullFailed(full.request_id, "big", "timeout", received=0)
    core.handle(cut, 2.3)
    [again] = pulls(core.poll(3.4))  # (after its backoff)
    core.handle(PullSucceeded(again.request_id, "big", ((again.digests[0], b"v" * 100),)), 3.5)
    # ...and in pull_timeout once it did: in probe_timeout, an honest 1.5-MiB item on a
    # 256-KiB/s link timed out past 1 MiB read, charged, and its server was shunned (rt48 F2).
    [whole] = announce(core, "big", fresh(1), 3.6)
    assert (whole.max_bytes, whole.timeout) == (None, 5.0)


def test_a_pull_that_fails_with_nothing_read_gives_its_reservation_back() -> None:
    core = core_with(unproven_download_rate=1.0, unproven_download_burst=ITEM)
    for now in (0.0, 20.0):  # after the backoff, its reservation is there again
        [pull] = announce(core, "slow", fresh(1), now)
        core.handle(PullFailed(pull.request_id, "slow", "timeout", received=0), now + 5.0)
        assert core._download.available(now + 5.0) == ITEM
    assert core.stats.bytes_unvouched == 0
    [pull] = announce(core, "slow", fresh(1), 40.0)
    core.handle(PullFailed(pull.request_id, "slow", "unreachable"), 45.0)  # bytes read unknown: the most
    assert core.stats.bytes_unvouched == pull.max_bytes == 128 * 1024


def test_items_refused_busy_spend_the_budget_and_end_their_servers_standing() -> None:
    # Red team rt29 F1: a proven peer served 2-MiB envelopes of fresh signers that the
    # new-identity budget refused (busy, held against nobody): ~1 GiB a minute, budget untouched.
    core = core_with(credit_per_accepted_byte=1e5)  # credit enough for any answer
    proven(core, "a", 0.0)
    [pull] = announce(core, "a", fresh(1), 1.0)
    [(digest,)] = [pull.digests]
    core.handle(PullSucceeded(pull.request_id, "a", ((digest, b"v" * (2 * MiB)),), received=ITEM), 1.0)
    assert core._proven("a")  # every byte of the answer was an asked-for item
    core.handle(AdmissionResult("a", digest, False, "new_identity_limit", charged=False, busy=True), 1.1)
    assert not core._proven("a")  # 2 MiB of waste to repay, at 64 KiB/s
    spent = core.stats.bytes_unvouched
    [again] = announce(core, "a", fresh(1), 2.0)
    serve_valid(core, again, 2.1)
    assert core.stats.bytes_unvouched == spent + 104  # its next pull went through the download budget


def test_a_pull_request_is_answered_without_a_scheduling_pass() -> None:
    # Red team rt29 F2: each 32-byte request ran a pass over the candidate table, ~50 ms of CPU
    # when it is full: about 21 requests a second took a core.
    core = core_with()
    [pull] = announce(core, "a", fresh(1), 0.0)
    core.handle(PullFailed(pull.request_id, "a", "timeout", received=0), 1.0)  # backs off for 1 s
    answer = core.handle(PullRequest("b", fresh(1)), 2.5)
    assert [type(a) for a in answer] == [Serve]  # the backoff is over, yet no pull opens here...
    assert [p.peer for p in pulls(core.poll(2.5))] == ["a"]  # ...but at the next poll


def test_a_pull_that_waits_only_for_the_budget_wakes_the_core_when_it_is_there() -> None:
    core = core_with(unproven_download_rate=MiB, unproven_download_burst=ITEM)
    [junk] = announce(core, "junk", fresh(1), 0.0)
    core.handle(PullSucceeded(junk.request_id, "junk", (), ("unsupported_version",), ITEM), 0.1)
    assert announce(core, "newcomer", fresh(1), 0.2) == []  # the budget is spent
    wake = core.next_deadline()
    assert (
        wake is not None and 0.2 < wake <= 0.1 + 128 * 1024 / MiB + 1e-6
    )  # a probe's worth, not a read later
    [probe] = pulls(core.poll(wake))
    assert (probe.peer, probe.max_bytes) == ("newcomer", 128 * 1024)


def test_pulls_cancelled_by_a_ban_spend_what_arrived_when_the_driver_reports_it() -> None:
    # Red team rt29 F3: a free id whose third rejection shunned it while two pulls were in flight
    # spent 30 MiB of the budget with ~15 bytes: a cancelled pull was charged the most it could
    # hold. Red team rt30 F1: charged nothing, a pull streamed to near its end and then cancelled
    # by its server's own ban read 16 MiB free. Its cost is what the cancelled call had read.
    core = core_with(
        max_inflight_pulls_per_peer=3,
        max_digests_per_pull=4,
        unproven_download_burst=64 * MiB,
        peer_download_burst=64 * MiB,  # three pulls of 8 MiB at once
    )
    for _ in range(8):
        proven(core, "junk", 0.0)  # established: full-size pulls through the budget
    base = core.stats.bytes_unvouched
    first, *others = announce(core, "junk", fresh(12), 0.0)
    assert len(others) == 2
    items = tuple((digest, b"j") for digest in first.digests[:3])
    core.handle(PullSucceeded(first.request_id, "junk", items, received=15), 0.1)
    for digest, _ in items:  # charged: the third rejection shuns it...
        actions = core.handle(AdmissionResult("junk", digest, False, "bad_group"), 0.2)
        assert not [a for a in actions if isinstance(a, CancelPull)]  # ...its pulls run to their end
    assert core.is_banned("junk", 0.2) and core.stats.bytes_unvouched == base + 15
    # Their items are still judged: admission bans senders (below: a ban cancels).
    answer = ((others[0].digests[0], b"j"),)
    core.handle(PullSucceeded(others[0].request_id, "junk", answer, received=5), 0.3)
    assert core.stats.admits == 8 + 3 + 1 and core.stats.bytes_unvouched == base + 15 + 5
    cancels = core.handle(PeerBanned("junk", until=100.0), 0.4)
    assert [a.request_id for a in cancels if isinstance(a, CancelPull)] == [others[1].request_id]
    core.handle(PullFailed(others[1].request_id, "junk", "cancelled", received=8 * MiB), 0.5)
    assert core.stats.bytes_unvouched == base + 15 + 5 + 8 * MiB  # what the cancelled call read
    late = ((others[1].digests[0], b"j"),)
    core.handle(PullSucceeded(others[1].request_id, "junk", late, received=5), 0.5)  # too late
    assert core.stats.admits == 8 + 3 + 1  # nothing from an answer of a banned peer


def test_a_ban_on_a_signer_it_delivered_stops_new_pulls_but_not_the_peers_pulls_in_flight() -> None:
    # tests/swarm/test_adversary.py, about one run in three: a pull split in two, the first half
    # banned the signer, and the ban cancelled the second half, whose items (the transport peer's
    # bad signature among them) were never judged.
    core = core_with(
        max_inflight_pulls_per_peer=3,
        max_digests_per_pull=4,
        unproven_download_burst=64 * MiB,
        peer_download_burst=64 * MiB,
    )
    for _ in range(8):
        proven(core, "relay", 0.0)
    first, second, *_ = announce(core, "relay", fresh(8), 0.0)
    actions = core.handle(PeerBanned("relay", until=100.0, for_signer=True), 0.1)
    assert not [a for a in actions if isinstance(a, CancelPull)] and core.is_banned("relay", 0.1)
    assert pulls(announce(core, "relay", fresh(4), 0.2)) == []  # nothing new from it
    answer = tuple((digest, b"r") for digest in second.digests)
    actions = core.handle(PullSucceeded(second.request_id, "relay", answer, received=4), 0.3)
    assert [a.digest for a in actions if isinstance(a, Admit)] == list(second.digests)  # all judged
    # A ban on the peer itself cancels what it still has in flight.
    cancels = core.handle(PeerBanned("relay", until=100.0), 0.4)
    assert [a.request_id for a in cancels if isinstance(a, CancelPull)] == [first.request_id]


def test_a_scheduling_pass_reserves_no_more_than_each_peer_announces() -> None:
    # Red team rt30 F4: a batch reserved 16 items for the one its peer announced, and gave the rest
    # back only when it started: of 8 peers of one item each, a pass opened pulls to 2.
    core = core_with()
    read = [Announced(f"p{i}", 0, fresh(1)) for i in range(8)]
    assert len(pulls(core.handle_all(read, 0.0))) == 8


def test_an_accepted_item_proves_a_peer_again_only_once_its_waste_is_repaid() -> None:
    # Red team rt29 F1: one item of the attacker's own accepted now and then, between answers
    # refused busy, kept it proven: ~480 MiB a minute free of the budget.
    core = core_with(waste_repay_rate=MiB, credit_per_accepted_byte=1e5)  # on credit once proven
    proven(core, "a", 0.0)
    [pull] = announce(core, "a", fresh(2), 1.0)
    small, large = pull.digests
    items = ((small, b"v" * 100), (large, b"v" * (2 * MiB)))
    core.handle(PullSucceeded(pull.request_id, "a", items, received=104 + ITEM), 1.0)
    core.handle(AdmissionResult("a", large, False, "new_identity_limit", charged=False, busy=True), 1.0)
    core.handle(AdmissionResult("a", small, True, "accepted"), 1.0)
    [clean] = announce(core, "a", fresh(1), 1.1)
    serve_valid(core, clean, 1.2)  # accepted, and nothing of the answer wasted
    assert not core._proven("a")  # 2 MiB to repay at 1 MiB/s
    core.poll(3.1)
    assert core._proven("a")


def test_a_pull_on_credit_asks_for_no_more_items_than_the_credit_covers_whole() -> None:
    # Red team rt30 F2: proven is cheap (one accepted item), and each free id proven so read a
    # 16-MiB answer of junk outside the budget: ~1 GiB in 2 minutes from 64 ids. A pull on credit
    # is never cut at the credit either (rt36 F1, rt37 F1, rt38 F1): it asks for fewer items.
    core = core_with(credit_per_accepted_byte=65000.0)  # one 104-byte item: ~6.4 MiB, 3 whole items
    proven(core, "a", 0.0)
    [pull] = announce(core, "a", fresh(16), 1.0)  # (what its credit then leaves covers no whole item)
    assert len(pull.digests) == 3 and pull.max_bytes is None
    spent = core.stats.bytes_unvouched
    serve_valid(core, pull, 1.1)
    assert core.stats.bytes_unvouched == spent  # on credit, outside the download budget
    small = core_with()  # one 104-byte item: 3,328 bytes of credit, not one whole item
    proven(small, "b", 0.0)
    [pull] = announce(small, "b", fresh(16), 1.0)
    assert (len(pull.digests), pull.max_bytes) == (1, 128 * 1024)  # small, through the download budget
    assert reserved(small) == 128 * 1024


def test_a_peer_with_a_long_record_is_never_pulled_after_ids_proven_by_one_item() -> None:
    # Red team rt30 F3: ids proven by one accepted heartbeat each took every pull slot with stalled
    # pulls, oldest candidates first: 1,000 of them delayed an honest proven peer's items 34 s.
    # Their pulls are small now, in a pool of their own.
    core = core_with(max_inflight_pulls=1, max_probe_pulls=1)
    for _ in range(8):
        proven(core, "honest", 0.0)  # 8 items accepted: an established score
    proven(core, "cheap", 0.0)
    proven(core, "busy", 0.0)
    [busy] = announce(core, "busy", fresh(1), 1.0)  # the one small pull's slot is taken
    assert busy.max_bytes == 128 * 1024
    assert announce(core, "cheap", fresh(1), 1.1) == []
    [first] = announce(core, "honest", fresh(1), 1.2)
    assert first.peer == "honest" and first.max_bytes is None  # before: after "cheap"


def test_two_pulls_in_flight_share_their_peers_credit_and_its_waste_stays_off_the_budget() -> None:
    # Red team rt31 F1: each of a proven peer's two pulls in flight read its whole credit, and its
    # junk was spent from the download budget: 256 MiB of junk left it 226 MiB in debt.
    core = core_with(max_digests_per_pull=1, credit_per_accepted_byte=30000.0)  # ~1.5 whole items
    proven(core, "a", 0.0)
    [first] = announce(core, "a", fresh(2), 1.0)  # on credit, holding one item's worth of it...
    assert first.max_bytes is None and not core._on_credit("a")  # ...so the second waits
    spent = core.stats.bytes_unvouched
    junk = ("unsupported_version",)
    core.handle(PullSucceeded(first.request_id, "a", (), junk, received=32 * 104), 1.1)
    assert core.stats.bytes_unvouched == spent  # its waste, its credit and debt: not the budget
    assert not core._proven("a")


def test_empty_announcements_from_many_ids_never_make_a_peer_with_standing_forgotten() -> None:
    # Red team rt31 F2: a thousand free ids' empty records pushed an established honest peer out
    # of the full peer table; it came back with no score and no credit.
    core = core_with(max_peers=3)
    for _ in range(8):
        proven(core, "honest", 0.0)
    for i in range(10):
        core.handle(Announced(f"free{i}", 0, ()), 1.0 + i)
    assert core._tier("honest") == 0 and core._peers["honest"].score == 8


def test_one_fast_peer_is_never_handed_more_than_admission_queues_for_it() -> None:
    # Red team rt31 F3: the core capped pending admissions only in all (256) while admission queues
    # 32 per peer: a fast honest peer's items past 32 were refused busy, lost, and counted as its
    # waste, so it fell to the last tier. Its pulls now wait for verdicts past its share.
    mib = 1024.0 * 1024.0
    core = core_with(
        pull_rate=1000.0,
        pull_burst=1000.0,
        max_inflight_pulls_per_peer=8,
        unproven_download_burst=320 * mib,
        peer_download_burst=320 * mib,  # room for 8 pulls of 16 at once
    )
    for _ in range(8):
        proven(core, "a", 0.0)  # established: full-size pulls through the budget
    share = core.config.max_pending_admissions_per_peer
    first = announce(core, "a", fresh(200), 1.0)
    assert sum(len(p.digests) for p in first) == share  # not 8 pulls of 16
    items = [(d, b"v" * 100) for p in first for d in p.digests]
    for pull in first:
        answer = tuple((d, b"v" * 100) for d in pull.digests)
        answered = PullSucceeded(pull.request_id, "a", answer, received=104 * len(answer))
        assert pulls(core.handle(answered, 1.1)) == []
    assert core.sizes().pending_admissions == share  # all awaiting a verdict: nothing more pulled
    [(digest, _), *_] = items
    [more] = pulls(core.handle(AdmissionResult("a", digest, True, "accepted"), 1.2))
    assert more.peer == "a" and len(more.digests) == 1  # one verdict frees one place
    assert core._proven("a") and core.stats.refused_busy == 0


def test_a_copy_refused_for_our_load_leaves_its_server_first_in_line_for_the_id() -> None:
    # Refused overloaded, a newcomer's item ranked its server after untried announcers: free ids
    # announcing the id were asked first, took its slot, and their failures used up the id.
    core = core_with()
    proven(core, "newcomer", 0.0)  # one item accepted: not established
    [pull] = announce(core, "newcomer", fresh(1), 1.0)
    [digest] = pull.digests
    answer = PullSucceeded(pull.request_id, "newcomer", ((digest, b"v" * 100),), received=104)
    assert pulls(core.handle(answer, 1.1)) == []
    overloaded = AdmissionResult("newcomer", digest, False, "busy", busy=True, overloaded=True)
    assert pulls(core.handle(overloaded, 1.2)) == []
    [again] = announce(core, "free0", (digest,), 2.5)  # after the overload pause
    assert again.peer == "newcomer"  # before: "free0"


def test_free_ids_that_fail_an_id_cannot_give_it_up_while_its_announcer_waits_for_our_caps() -> None:
    # Red team rt39 F1: while admission held an honest peer's 32 items, free ids that announced its
    # ids were pulled instead, and their failures used up the ids' _max_unserved: given up before
    # it was asked (60 of 320 lost). Past that bound the id now takes no new ids not proven, and
    # is given up only when no announcer is left. (Waiting for the established peer instead let
    # one at its own limits hold everyone's ids: rt40 F1/F2, rt41 F1.)
    core = core_with(max_pending_admissions_per_peer=1)
    for _ in range(8):
        proven(core, "honest", 0.0)
    first, second = fresh(2)
    [held] = announce(core, "honest", (first, second), 1.0)
    answer = PullSucceeded(held.request_id, "honest", ((first, b"v" * 100),), received=104)
    assert pulls(core.handle(answer, 1.1)) == []  # awaiting our verdict: the peer is at its cap
    failed = 0
    for i in range(40):  # each fresh id is pulled and answers with broken framing
        waiting = announce(core, f"free{i}", (second,), 1.2)
        while waiting:
            pull = waiting.pop()
            failed += 1
            waiting += pulls(core.handle(PullFailed(pull.request_id, pull.peer, "protocol", True, 0), 1.2))
    assert core.stats.gave_up == 0 and failed <= 16 + 8  # _max_unserved + the slots it held then
    [next_pull] = pulls(core.handle(AdmissionResult("honest", first, True, "accepted"), 1.3))
    assert next_pull.peer == "honest" and next_pull.digests == (second,)


def test_proven_ids_rejoining_a_closed_id_keep_it_open_one_lifetime_more_at_most() -> None:
    # Red team rt43 F3: each proven id that announced a closed id renewed its lifetime: 200 of them
    # kept one id open 2.8 hours and had it pulled 216 times.
    core = core_with(remember_rounds=10)  # a candidate lives 20 s; a closed one is kept 100 s
    target = fresh(1)
    for i in range(16):  # free ids that answer without it close the id (16 failed announcers)
        for pull in announce(core, f"free{i}", target, 1.0):
            core.handle(PullSucceeded(pull.request_id, pull.peer, (), received=0), 1.0)
    pulled_at = []
    for k in range(19):  # a proven id every 5 s while the closed id is kept
        now = 2.0 + 5.0 * k
        proven(core, f"p{k}", now)
        for pull in announce(core, f"p{k}", target, now):
            pulled_at.append(now)
            core.handle(PullSucceeded(pull.request_id, pull.peer, (), received=0), now)
    assert pulled_at and max(pulled_at) < 1.0 + 2 * 20.0  # before: every 5 s until 92 s


def test_while_an_established_peer_has_candidates_others_hold_half_the_pending_places() -> None:
    # Red team rt43 F2: first come, free ids' items, slow to judge, held all 256 places awaiting a
    # verdict, and an established peer's ids expired waiting for one (28-85% lost).
    core = core_with(max_pending_admissions=8, max_inflight_pulls_per_peer=1, max_digests_per_pull=1)
    for _ in range(8):
        proven(core, "honest", 0.0)
    [_] = announce(core, "honest", fresh(2), 1.0)  # one in flight, one waiting for it
    taken = 0
    for i in range(8):
        for pull in announce(core, f"free{i}", fresh(1), 1.1):
            answer = tuple((d, b"v" * 100) for d in pull.digests)
            core.handle(PullSucceeded(pull.request_id, pull.peer, answer, received=104 * len(answer)), 1.1)
            taken += len(answer)  # awaiting a verdict
    assert taken == 4  # half of 8; before: 7, all the honest peer's pull left
    assert announce(core, "late", fresh(1), 1.2) == []


def test_while_others_have_candidates_established_peers_open_at_most_three_quarters_of_pulls() -> None:
    # Red team rt44 F1: pulled first, 8 established ids on credit, each with ids waiting and
    # answering every pull, took all 16 pull slots: newcomers lost 95% of their items.
    # On credit after their first items, with room for two full pulls each.
    core = core_with(credit_per_accepted_byte=1e6, peer_download_burst=64 * MiB)
    for k in range(8):
        for _ in range(8):
            proven(core, f"relay{k}", 0.0)
    assert all(core._tier(f"relay{k}") == 0 and core._on_credit(f"relay{k}") for k in range(8))
    first = [p for k in range(8) for p in announce(core, f"relay{k}", fresh(64), 1.0)]
    assert len(first) == 16  # nobody else waits: every slot
    proven(core, "newcomer", 1.1)  # (a probe has a pool of its own)
    assert announce(core, "newcomer", fresh(1), 1.1) == []  # none free: it waits...
    [done, *_] = first
    answer = tuple((d, b"v" * 100) for d in done.digests)
    [freed] = pulls(
        core.handle(PullSucceeded(done.request_id, done.peer, answer, received=104 * len(answer)), 1.2)
    )
    assert freed.peer == "newcomer"  # ...for the first slot freed; before: the relay again


def test_peers_sent_probes_or_backed_off_leave_established_peers_every_pull() -> None:
    # Red team rt45 F2: idle free ids in backoff, with ids waiting, kept established peers to 3/4
    # of the pulls under overload for nothing. Nor do probes, which have a pool of their own.
    core = core_with(credit_per_accepted_byte=1e6, peer_download_burst=64 * MiB)  # two full pulls each
    for k in range(8):
        for _ in range(8):
            proven(core, f"relay{k}", 0.0)
    [_] = announce(core, "free", fresh(4), 0.5)  # first contact: one probe, three waiting
    proven(core, "failed", 0.5)
    [pull] = announce(core, "failed", fresh(1), 0.6)
    core.handle(PullFailed(pull.request_id, "failed", "timeout", received=0), 0.7)  # backed off 1 s
    announce(core, "failed", fresh(4), 0.8)
    assert core._peers["free"].candidates == 3 and core._peers["failed"].candidates > 0
    first = [p for k in range(8) for p in announce(core, f"relay{k}", fresh(64), 1.0)]
    assert len(first) == 16  # before: 12


def test_established_peers_not_on_credit_reserve_at_most_half_the_budget() -> None:
    # Red team rt41 F2: four established ids whose credit stayed below one item answered their
    # pulls through the budget just before the timeout and held all 8 of its slots: newcomers got
    # no pull and lost 81% of their items. Established peers now reserve at most half of its
    # burst (or one full answer, if more), and newcomers' pulls are small, in a pool of their own.
    core = core_with()  # 8 slots, a 32-MiB burst
    for k in range(4):
        for _ in range(8):
            proven(core, f"relay{k}", 0.0)  # established: pulled before any other
    stalled = [p for k in range(4) for p in announce(core, f"relay{k}", fresh(4), 1.0)]
    full = [p for p in stalled if p.max_bytes is None]
    assert sum(len(p.digests) for p in full) * ITEM <= 16 * MiB + 64  # before: 4 x 4 items
    # Past their share, established peers' pulls are small (red team rt47 F1: two established
    # ids stalling full pulls held the share, and established peers not on credit got nothing).
    assert all(p.max_bytes == 128 * 1024 * len(p.digests) for p in stalled if p not in full)
    assert len(full) < len(stalled)
    [newcomer] = announce(core, "newcomer", fresh(1), 1.1)
    assert newcomer.peer == "newcomer" and newcomer.max_bytes == 128 * 1024


def test_free_ids_spend_no_budget_that_an_established_peer_not_on_credit_waits_for() -> None:
    # Red team rt39 F2: a proven peer's small items earn less credit than one whole item, so its
    # pulls go through the budget and need a whole item's reservation, while free ids' probes need
    # 128 KiB: answering each with junk, they kept the budget below 2 MiB and its items expired.
    core = core_with(unproven_download_burst=2 * ITEM, unproven_download_rate=1.0 * MiB)
    for _ in range(8):
        proven(core, "honest", 0.0)  # established; 8 x 100 bytes earn far less than one item
    assert core._tier("honest") == 0 and not core._on_credit("honest")
    started: list[tuple[float, str]] = []

    def answer_junk(actions: list[GossipAction], now: float) -> None:
        for pull in pulls(actions):
            started.append((now, pull.peer))
            if pull.peer != "honest":  # as large as it may be read: spent from the budget
                junk = PullFailed(pull.request_id, pull.peer, "too_large", True, pull.max_bytes)
                answer_junk(core.handle(junk, now), now)

    for i in range(2):
        answer_junk(core.handle(Announced(f"drain{i}", 0, fresh(1)), 1.0), 1.0)  # the burst spent
    answer_junk(core.handle(Announced("honest", 0, fresh(1)), 1.1), 1.1)
    for i in range(60):  # fresh ids keep announcing; each would be sent a 128-KiB probe
        answer_junk(core.handle(Announced(f"free{i}", 0, fresh(1)), 1.1 + 0.05 * i), 1.1 + 0.05 * i)
    honest = [when for when, peer in started if peer == "honest"]
    assert honest and honest[0] <= 3.2  # the budget refills to one item in ~2 s; before: never
    assert all(peer.startswith("drain") for when, peer in started if when < honest[0])


def test_an_item_refused_for_our_overload_keeps_its_server_proven_and_is_pulled_again_later() -> None:
    # A queue full with every peer's work is our load, not the server's waste (rt31 F3); pulling
    # more before it drains would only meet it again. The item is not lost: it goes back among the
    # candidates. Its bytes are paid from the server's credit, or a proven peer whose items meet
    # that load is downloaded without end, ~1 GiB a minute (rt32 F3).
    core = core_with(overload_pause=1.0)
    proven(core, "a", 0.0)
    credit = core._peers["a"].credit
    [pull] = announce(core, "a", fresh(1), 1.0)
    [(digest,)] = [pull.digests]
    core.handle(PullSucceeded(pull.request_id, "a", ((digest, b"v" * 100),), received=104), 1.0)
    refused = AdmissionResult("a", digest, False, "cpu_budget", charged=False, busy=True, overloaded=True)
    assert core.handle(refused, 1.1) == []
    assert core._proven("a") and core._tier("a") <= 1
    assert core._peers["a"].credit == credit - 32 * 104  # as accepted bytes earn it
    assert core.stats.refused_overloaded == 1
    assert announce(core, "a", fresh(1), 1.5) == []  # no pull while the pause lasts...
    deadline = core.next_deadline()
    assert deadline is not None and deadline <= 2.1
    later = pulls(core.poll(2.1))  # ...and the core wakes for what waits when it ends
    assert {p.peer for p in later} == {"a"} and digest in {d for p in later for d in p.digests}


def test_items_refused_for_the_receivers_own_reasons_are_paid_from_their_servers_credit() -> None:
    # Red team rt32 F1: credit earned by accepted items bought unusable ones (another family, say)
    # without end: ~75 MiB per 10 minutes per id, free of the download budget.
    core = core_with()
    proven(core, "a", 0.0)
    credit = core._peers["a"].credit
    [pull] = announce(core, "a", fresh(1), 1.0)
    [(digest,)] = [pull.digests]
    core.handle(PullSucceeded(pull.request_id, "a", ((digest, b"v" * 100),), received=104), 1.0)
    core.handle(AdmissionResult("a", digest, False, "task_not_allowed", charged=False), 1.1)
    assert core._peers["a"].credit == credit - 32 * 104  # as accepted bytes earn it
    assert core.stats.peers_shunned == 0  # held against nobody
    # What the credit does not cover is waste to repay before the peer is proven again (rt34 F2:
    # one accepted MiB and 15 unusable ones per pull earned more credit than they spent).
    [again] = announce(core, "a", fresh(1), 2.0)
    [(other,)] = [again.digests]
    core.handle(PullSucceeded(again.request_id, "a", ((other, b"v" * 2000),), received=2004), 2.0)
    core.handle(AdmissionResult("a", other, False, "task_not_allowed", charged=False), 2.0)
    assert core._peers["a"].waste.available(2.0) < 0 and not core._proven("a")


def test_no_peer_makes_us_download_faster_than_its_own_rate_even_with_accepted_items() -> None:
    # Red team rt34: a peer can make accepted items of no value at will (a self-signed batch of
    # wrong answers); 16 proven ids serving only those made a node download 18.8 GiB in 10 minutes.
    core = core_with(peer_download_rate=1000.0, peer_download_burst=3000.0)
    proven(core, "a", 0.0)  # 104 bytes read
    [pull] = announce(core, "a", fresh(1), 1.0)
    [(digest,)] = [pull.digests]
    big = ((digest, b"v" * 3000),)
    core.handle(PullSucceeded(pull.request_id, "a", big, received=3004), 1.0)
    core.handle(AdmissionResult("a", digest, True, "accepted"), 1.0)
    assert core._proven("a")  # accepted, proven, with credit to spare...
    assert announce(core, "a", fresh(1), 1.0) == []  # ...but its rate is spent
    deadline = core.next_deadline()
    assert deadline is not None and deadline <= 1.0 + 110 / 1000.0  # back in debt's refill time
    [later] = pulls(core.poll(1.2))
    assert later.peer == "a"


def test_credit_that_would_pay_for_items_awaiting_a_verdict_is_held_until_it_comes() -> None:
    # Red team rt35 F2: returned in full when the answer arrived, the credit was lent again before
    # any verdict, and read ~64 MiB of items refused for our reasons per accepted MiB.
    core = core_with(credit_per_accepted_byte=10.0)
    proven(core, "a", 0.0)  # credit 10 x 104
    credit = core._peers["a"].credit
    [pull] = announce(core, "a", fresh(1), 1.0)
    [(digest,)] = [pull.digests]
    core.handle(PullSucceeded(pull.request_id, "a", ((digest, b"v" * 50),), received=54), 1.0)
    assert core._peers["a"].credit == credit - 10 * 54  # held while admission judges it
    core.handle(AdmissionResult("a", digest, False, "bad_reward"), 1.1)  # held against it: returned
    assert core._peers["a"].credit == credit
    [again] = announce(core, "a", fresh(1), 2.0)
    [(other,)] = [again.digests]
    core.handle(PullSucceeded(again.request_id, "a", ((other, b"v" * 50),), received=54), 2.0)
    core.handle(AdmissionResult("a", other, False, "task_not_allowed", charged=False), 2.1)
    assert core._peers["a"].credit == credit - 10 * 54  # refused for our reasons: the hold paid


def test_a_peer_whose_credit_is_all_held_for_a_slow_verdict_is_pulled_through_the_budget() -> None:
    # Red team rt36 F1: with its credit held for an item awaiting a verdict, an established honest
    # peer's next pull read 1 byte, failed, and the peer became suspect: 28 of 39 batches lost.
    core = core_with()
    for _ in range(8):
        proven(core, "h", 0.0)  # established, credit 8 x 32 x 104
    [pull] = announce(core, "h", fresh(1), 1.0)
    [(digest,)] = [pull.digests]
    big = b"v" * int(core._peers["h"].credit // 32 + 1000)  # paying for it would take all the credit
    core.handle(PullSucceeded(pull.request_id, "h", ((digest, big),), received=len(big) + 4), 1.0)
    assert core._peers["h"].credit == 0  # held until the verdict
    [nxt] = announce(core, "h", fresh(1), 1.1)
    assert nxt.max_bytes is None  # read whole, through the download budget, not 1 byte
    serve_valid(core, nxt, 1.2)
    assert not core._suspect("h") and core._peers["h"].failures == 0


def test_an_oversized_answer_to_a_pull_on_credit_is_its_servers_failure() -> None:
    # Red teams rt37 F1, rt38 F1: answers cut at the credit were forgiven, and a free id that
    # answered each pull on credit with an oversized frame header kept honest ids from their
    # announcer, or used up their tries. A pull on credit is never cut, so that is a failure.
    core = core_with(credit_per_accepted_byte=1e6)
    for _ in range(3):
        proven(core, "mallory", 0.0)  # outranks the honest announcer
    proven(core, "honest", 0.0)
    ids = fresh(1)
    [first] = announce(core, "mallory", ids, 1.0)
    assert announce(core, "honest", ids, 1.0) == [] and first.max_bytes is None  # read whole
    cut = PullFailed(first.request_id, "mallory", "too_large", charged=True, received=0)
    [second] = pulls(core.handle(cut, 1.1))
    assert second.peer == "honest" and second.digests == ids
    assert core._peers["mallory"].failures == 1 and core.stats.pulls_refused == 1


def test_answers_that_break_the_rules_drop_their_server_for_the_id_and_use_up_none_of_its_tries() -> None:
    # Red team rt38 F1: three proven ids that answered with an oversized frame header used up an
    # honest item's tries after one failed try of its own announcer: 12 of 100 honest items lost.
    core = core_with(max_attempts=4, credit_per_accepted_byte=1e6)
    for relay in ("m1", "m2", "m3"):
        proven(core, relay, 0.0)  # on credit: full-size pulls, never cut
    ids = fresh(1)
    [first] = announce(core, "honest", ids, 0.0)
    core.handle(PullFailed(first.request_id, "honest", "timeout", received=0), 0.1)  # a try of its own
    [pull] = [p for relay in ("m1", "m2", "m3") for p in announce(core, relay, ids, 0.2)]
    tried = []
    while pull.peer != "honest":  # each relay in turn (untried first), each answering oversized
        tried.append(pull.peer)
        cut = PullFailed(pull.request_id, pull.peer, "too_large", charged=True, received=0)
        [pull] = pulls(core.handle(cut, 0.3)) or pulls(core.poll(1.2))
    assert sorted(tried) == ["m1", "m2", "m3"]  # four failed tries in all, one the honest one's
    assert pull.digests == ids and core.stats.gave_up == 0  # before: given up


def test_free_ids_answering_their_probes_oversized_use_up_none_of_an_ids_tries() -> None:
    # An answer over a probe's limit is not charged (an honest item may be up to 2 MiB), so any id
    # can give one at will: counted as tries, three free ids' after one failed try of the honest
    # announcer had the id given up, as proven ids' oversized answers did in rt38 F1.
    core = core_with(max_attempts=4)
    ids = fresh(1)
    [first] = announce(core, "honest", ids, 0.0)
    core.handle(PullFailed(first.request_id, "honest", "timeout", received=0), 0.1)  # a try of its own
    [pull] = [p for free in ("f1", "f2", "f3") for p in announce(core, free, ids, 0.2)]
    tried = []
    while pull.peer != "honest":  # each free id in turn answers oversized
        tried.append(pull.peer)
        # Small: cut at its limit, as an honest large item is. Else one whole item, read whole:
        # more is broken, and drops it as the id's announcer.
        read = pull.max_bytes or 0
        answer = PullFailed(pull.request_id, pull.peer, "too_large", charged=True, received=read)
        [pull] = pulls(core.handle(answer, 0.3)) or pulls(core.poll(1.2))
    assert sorted(tried) == ["f1", "f1", "f2", "f2", "f3", "f3"]
    assert pull.digests == ids and core.stats.gave_up == 0  # before: given up
    assert all(core._peers[f].outgrew_small for f in tried)  # their next small pulls read one item whole


def test_pulls_to_one_server_never_ask_for_more_than_its_serving_budget_for_us_holds() -> None:
    # Red team rt46 F4: with room for two answers of 16 MiB at once, the second pull of a server's
    # 1-MiB items came back empty from its 16-MiB serving budget, and the server was charged for
    # ids it did not serve (backed off, suspect, dropped as their announcer). Real cores on both
    # sides: the server publishes 32 items of 1 MiB a round, the receiver accepts all it gets.
    times = dict(round_seconds=30.0, read_interval=1.0)
    server = GossipCore(GossipConfig(**times), "server")
    client = GossipCore(GossipConfig(**times, credit_per_accepted_byte=1e6), "client")
    sizes = {}
    for i in range(32):
        digest = hashlib.sha256(b"large-%d" % i).digest()
        sizes[digest] = MiB
        server.handle(Publish(digest, MiB), 0.0)
    records = [a for a in server.poll(1.0) if isinstance(a, Announce)]
    events: list[tuple[float, int, GossipEvent | None]] = [
        (1.0, 0, Announced("server", r.round, r.digests)) for r in records
    ]
    order = itertools.count(1)
    admitted = 0
    now = 1.0
    while events and now < 120.0:
        events.sort(key=lambda e: (e[0], e[1]))
        now, _, event = events.pop(0)
        for action in (client.handle(event, now) if event else []) + client.poll(now):  # None: a timer
            if isinstance(action, Pull):
                [serve] = [
                    a
                    for a in server.handle(PullRequest("client", action.digests), now)
                    if isinstance(a, Serve)
                ]
                items = tuple((d, b"v" * sizes[d]) for d in serve.digests)
                events.append((now + 0.5, next(order), PullSucceeded(action.request_id, "server", items)))
                for d in serve.digests:
                    events.append((now + 0.6, next(order), AdmissionResult("server", d, True, "accepted")))
                    admitted += 1
        if not events and client.next_deadline() is not None:
            events.append((max(now, client.next_deadline() or now), next(order), None))
    assert server.stats.serve_limited == 0 and client.stats.items_missing == 0  # before: 53 backoffs
    assert admitted == 32 and client._tier("server") == 0


def test_established_peers_past_their_share_take_at_most_half_the_small_pulls() -> None:
    # Red team rt48 F1: past their share of the budget, established peers' pulls are small, and
    # ~80 established ids stalling them held the whole pool: newcomers lost 16-64% of their items.
    core = core_with(max_probe_pulls=4)
    for k in range(6):
        for _ in range(8):
            proven(core, f"relay{k}", 0.0)  # established, not on credit
    pulls_ = [p for k in range(6) for p in announce(core, f"relay{k}", fresh(16), 1.0)]
    small = [p for p in pulls_ if p.max_bytes is not None]
    assert len(small) == 2  # half the pool; before: all 4
    [newcomer] = announce(core, "newcomer", fresh(1), 1.1)
    assert newcomer.max_bytes == 128 * 1024


def test_a_shun_does_not_grant_again_the_pulls_a_ban_cancelled() -> None:
    # Red team rt48 F3: banned by admission, then shunned for the rejections of items it had
    # served before, a peer had its cancelled pulls granted again, and their items admitted.
    core = core_with(max_inflight_pulls_per_peer=3, max_digests_per_pull=3, peer_download_burst=64 * MiB)
    for _ in range(8):
        proven(core, "junk", 0.0)
    first, *others = announce(core, "junk", fresh(9), 0.0)
    assert others
    items = tuple((digest, b"j") for digest in first.digests)
    core.handle(PullSucceeded(first.request_id, "junk", items, received=15), 0.1)
    core.handle(PeerBanned("junk", until=100.0), 0.2)  # cancels the others
    for digest, _ in items:  # the third rejection: a shun
        core.handle(AdmissionResult("junk", digest, False, "bad_group"), 0.3)
    assert core.stats.peers_shunned == 1
    admits = core.stats.admits
    late = ((others[0].digests[0], b"j"),)
    core.handle(PullSucceeded(others[0].request_id, "junk", late, received=5), 0.4)
    assert core.stats.admits == admits  # before: admitted
