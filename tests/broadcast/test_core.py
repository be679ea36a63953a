"""Specification of the sans-IO broadcast core (swarmnode/broadcast/core.py). Each test name is a rule."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmnode.broadcast.core import (
    Action,
    Blame,
    BroadcastConfig,
    BroadcastCore,
    ChunkLayout,
    ChunkReceived,
    ChunkRequested,
    Completed,
    Fetch,
    FetchFailed,
    Have,
    ManifestAccepted,
    PeerHave,
    PeerLeft,
    Publish,
    Refuse,
    Retire,
    Upload,
    UploadFinished,
)
from swarmnode.core.events import PeerBanned
from swarmnode.errors import ConfigError

D = b"\x01" * 32
LAYOUT = ChunkLayout(total_bytes=10 * 100, chunk_size=100)  # 10 chunks


def of(actions: list[Action], kind: type) -> list[Any]:
    return [a for a in actions if isinstance(a, kind)]


def receiver(me: str = "r", publisher: str = "pub", **overrides: Any) -> tuple[BroadcastCore, list[Action]]:
    core = BroadcastCore(me, BroadcastConfig(**overrides))
    return core, core.handle(ManifestAccepted(D, LAYOUT, publisher), 0.0)


# --------------------------------------------------------------------------- config and layout


def test_layout_counts_chunks_and_a_short_last_chunk() -> None:
    layout = ChunkLayout(total_bytes=250, chunk_size=100)
    assert layout.n_chunks == 3
    assert [layout.length(i) for i in range(3)] == [100, 100, 50]
    with pytest.raises(IndexError):
        layout.length(3)


@pytest.mark.parametrize("field_name", ["max_inflight", "upload_slots", "max_streams_per_peer"])
def test_config_rejects_zero_limits_naming_the_field(field_name: str) -> None:
    with pytest.raises(ConfigError, match=field_name):
        BroadcastConfig(**{field_name: 0})


def test_config_rejects_nonpositive_timeouts() -> None:
    with pytest.raises(ConfigError, match="request_timeout"):
        BroadcastConfig(request_timeout=math.nan)


# --------------------------------------------------------------------------- fetching


def test_receiver_fetches_from_the_publisher_within_stream_and_inflight_bounds() -> None:
    _, actions = receiver(max_streams_per_peer=3, max_inflight=8)
    fetches = of(actions, Fetch)
    assert len(fetches) == 3  # one peer known: bounded by streams per peer
    assert {f.peer for f in fetches} == {"pub"}
    assert len({f.index for f in fetches}) == 3


def test_inflight_bound_holds_across_many_sources() -> None:
    core, _ = receiver(max_streams_per_peer=1, max_inflight=4)
    actions = []
    for n in range(10):
        actions += core.handle(PeerHave(f"p{n}", D, frozenset(range(10))), 0.0)
    assert core.inflight() == 4


def test_receivers_start_on_different_chunks() -> None:
    firsts = set()
    for n in range(8):
        _, actions = receiver(me=f"r{n}", max_streams_per_peer=1)
        firsts.add(of(actions, Fetch)[0].index)
    assert len(firsts) >= 4


def test_rarest_chunk_is_fetched_first_and_from_a_relay_not_the_publisher() -> None:
    core, actions = receiver(max_streams_per_peer=1, max_inflight=1)
    (first,) = of(actions, Fetch)
    assert first.peer == "pub" and first.index != 9
    # Chunks 0..8 are held by two relays, chunk 9 by one: 9 is the rarest.
    core.handle(PeerHave("a", D, frozenset(range(9))), 0.0)
    core.handle(PeerHave("b", D, frozenset(range(10))), 0.0)
    out = core.handle(ChunkReceived("pub", D, first.index, True, 100, 0.1), 0.0)
    assert of(out, Fetch) == [Fetch("b", D, 9, core.config.request_timeout)]


def test_relays_are_preferred_over_the_publisher_for_chunks_they_hold() -> None:
    core = BroadcastCore("r", BroadcastConfig(max_streams_per_peer=4, max_inflight=4))
    core.handle(PeerHave("a", D, frozenset(range(10))), 0.0)  # unknown digest yet: ignored
    actions = core.handle(ManifestAccepted(D, LAYOUT, "pub"), 0.0)
    assert {f.peer for f in of(actions, Fetch)} == {"pub"}
    core2 = BroadcastCore("r", BroadcastConfig(max_streams_per_peer=4, max_inflight=8))
    core2.handle(ManifestAccepted(D, ChunkLayout(100, 100), "pub"), 0.0)  # 1 chunk, fetch in flight
    core3 = BroadcastCore("r", BroadcastConfig(max_streams_per_peer=2, max_inflight=8))
    core3.handle(ManifestAccepted(D, LAYOUT, "pub"), 0.0)
    actions = core3.handle(PeerHave("a", D, frozenset(range(10))), 0.0)
    assert {f.peer for f in of(actions, Fetch)} == {"a"}


def test_a_publisher_knows_when_a_peer_has_announced_every_chunk() -> None:
    core = BroadcastCore("pub")
    core.handle(Publish(D, LAYOUT), 0.0)
    assert not core.peer_has_all(D, "a")
    core.handle(PeerHave("a", D, frozenset(range(9))), 0.0)
    assert not core.peer_has_all(D, "a")
    core.handle(PeerHave("a", D, frozenset({9})), 0.0)
    assert core.peer_has_all(D, "a") and not core.peer_has_all(D, "b")
    core.handle(Retire(D), 0.0)
    assert not core.peer_has_all(D, "a")


def test_source_choice_follows_measured_rate() -> None:
    core, _ = receiver(max_streams_per_peer=2, max_inflight=2)
    core.handle(PeerHave("slow", D, frozenset(range(10))), 0.0)
    core.handle(PeerHave("fast", D, frozenset(range(10))), 0.0)
    # Measure both relays once: slow delivers 100 B in 1 s, fast 100 B in 0.01 s.
    for index, fetch in list(core._transfers[D].inflight.items()):
        core.handle(FetchFailed(fetch.peer, D, index, "busy"), 0.0)
    core.handle(ChunkReceived("slow", D, 0, True, 100, 1.0), 0.0)
    core.handle(ChunkReceived("fast", D, 1, True, 100, 0.01), 0.0)
    for index, fetch in list(core._transfers[D].inflight.items()):
        core.handle(FetchFailed(fetch.peer, D, index, "busy"), 0.0)
    out = core.poll(10.0)
    assert out and {f.peer for f in of(out, Fetch)} == {"fast"}  # 10_000/(1+streams) beats 100 and 1e6/2


def test_ewma_rate_moves_towards_new_samples() -> None:
    core, actions = receiver(rate_alpha=0.5, max_streams_per_peer=4)
    fetches = of(actions, Fetch)
    core.handle(ChunkReceived("pub", D, fetches[0].index, True, 1000, 1.0), 0.0)
    assert core.peer_rate("pub") == 1000
    core.handle(ChunkReceived("pub", D, fetches[1].index, True, 3000, 1.0), 0.0)
    assert core.peer_rate("pub") == 2000


def test_valid_chunk_is_announced_at_once_pipelined() -> None:
    core, actions = receiver()
    f = of(actions, Fetch)[0]
    out = core.handle(ChunkReceived("pub", D, f.index, True, 100, 0.1), 1.0)
    assert Have(D, f.index) in out
    assert core.holding(D) == [f.index]
    assert not of(out, Completed)


def test_completed_only_when_every_chunk_is_verified_and_only_once() -> None:
    core = BroadcastCore("r", BroadcastConfig(max_streams_per_peer=16, max_inflight=16))
    actions = core.handle(ManifestAccepted(D, LAYOUT, "pub"), 0.0)
    fetches = of(actions, Fetch)
    assert len(fetches) == 10
    completed: list[Action] = []
    for n, f in enumerate(fetches):
        valid = n != 3
        out = core.handle(ChunkReceived("pub", D, f.index, valid, 100, 0.1), 0.0)
        completed += of(out, Completed)
    assert completed == []  # one chunk was invalid
    assert not core.is_complete(D) and core.progress(D) == (9, 10)  # what a worker's page shows
    assert core.progress(b"\x00" * 32) is None
    refetch = [f for f in core.poll(0.0) if isinstance(f, Fetch)] + of(out, Fetch)
    assert refetch == [] or all(f.index == fetches[3].index for f in refetch)
    # The publisher sent one bad chunk (below max_bad_chunks=2): it may be asked again, but not
    # for that chunk; a relay holding it serves it.
    out = core.handle(PeerHave("a", D, frozenset(range(10))), 0.0)
    (again,) = of(out, Fetch)
    assert again == Fetch("a", D, fetches[3].index, core.config.request_timeout)
    out = core.handle(ChunkReceived("a", D, again.index, True, 100, 0.1), 0.0)
    assert of(out, Completed) == [Completed(D)]
    assert core.is_complete(D)
    out = core.handle(ChunkReceived("a", D, again.index, True, 100, 0.1), 0.0)
    assert of(out, Completed) == []


def test_invalid_chunk_is_dropped_blamed_and_refetched_elsewhere() -> None:
    core, _ = receiver(max_streams_per_peer=1, max_inflight=1)
    core.handle(PeerHave("evil", D, frozenset(range(10))), 0.0)
    core.handle(PeerHave("good", D, frozenset(range(10))), 0.0)
    transfer = core._transfers[D]
    (index, fetch) = next(iter(transfer.inflight.items()))
    out = core.handle(ChunkReceived(fetch.peer, D, index, False, 100, 0.1), 0.0)
    assert of(out, Blame) == [Blame(fetch.peer, D, index, of(out, Blame)[0].reason)]
    assert index not in core.holding(D)
    assert not of(out, Have)
    refetch = [f for f in of(out, Fetch) if f.index == index]
    if refetch:
        assert refetch[0].peer != fetch.peer


def test_peer_with_too_many_bad_chunks_is_never_fetched_from_again() -> None:
    core, _ = receiver(max_streams_per_peer=4, max_inflight=4, max_bad_chunks=2)
    core.handle(PeerHave("evil", D, frozenset(range(10))), 0.0)
    for i in range(10):
        out = core.handle(ChunkReceived("evil", D, i, False, 100, 0.1), 0.0)
        if core.is_banned("evil"):
            break
    assert core.is_banned("evil")
    assert "never" in of(out, Blame)[0].reason
    # Everything else keeps going: no fetch ever goes to the banned peer.
    for _ in range(30):
        t = core._transfers[D]
        if not t.inflight:
            break
        i, f = next(iter(t.inflight.items()))
        assert f.peer != "evil"
        core.handle(ChunkReceived(f.peer, D, i, True, 100, 0.1), 0.0)
    assert core.is_complete(D)


def test_fetch_times_out_via_poll_and_goes_elsewhere() -> None:
    core, actions = receiver(max_streams_per_peer=1, max_inflight=2, request_timeout=5.0)
    (f,) = of(actions, Fetch)
    assert core.next_deadline() == 5.0
    core.handle(PeerHave("a", D, frozenset([f.index])), 1.0)
    assert core.poll(4.9) == []
    out = core.poll(5.0)
    assert Fetch("a", D, f.index, 5.0) in out
    assert core.stats.fetch_timeouts == 1
    assert core.peer_rate("pub") == core.config.rate_prior * core.config.failure_rate_factor
    # A late FetchFailed for the expired fetch is ignored; a late valid chunk is still taken.
    core.handle(FetchFailed("pub", D, f.index, "timeout"), 6.0)
    assert core.stats.fetch_failures == 0 and core.stats.late_results == 1
    out = core.handle(ChunkReceived("pub", D, f.index, True, 100, 6.0), 6.0)
    assert Have(D, f.index) in out


def test_busy_refusal_backs_off_briefly_then_asks_again() -> None:
    core, actions = receiver(max_streams_per_peer=1, max_inflight=1, busy_backoff=0.5)
    (f,) = of(actions, Fetch)
    out = core.handle(FetchFailed("pub", D, f.index, "busy"), 1.0)
    assert of(out, Fetch) == []
    assert core.next_deadline() == 1.5
    out = core.poll(1.5)
    assert len(of(out, Fetch)) == 1


def test_not_peer_refusal_is_no_failure_and_asks_again_after_a_fixed_pause() -> None:
    # A learner lists a worker it activated a few seconds after telling it of a version: until
    # then it answers "not_peer". Red team rt93: that counted as a failure (rate halved, backoff
    # doubling to 30 s), so the worker applied the version 3.6-11.6 s after being listed.
    core, actions = receiver(max_streams_per_peer=1, max_inflight=1, not_peer_backoff=0.5)
    (f,) = of(actions, Fetch)
    for attempt in range(5):
        now = 1.0 + attempt
        out = core.handle(FetchFailed("pub", D, f.index, "not_peer"), now)
        assert of(out, Fetch) == []
        assert core.next_deadline() == now + 0.5  # the same pause each time: no doubling
        (f,) = of(core.poll(now + 0.5), Fetch)
        assert f.peer == "pub"
    assert core.stats.fetch_not_peer == 5 and core.stats.fetch_failures == 0
    assert core.peer_rate("pub") is None  # never measured, and not cut as a failure would


def test_a_refusal_later_than_an_honest_server_gives_it_is_a_failure() -> None:
    # Red team rt94 F1: "not_peer" sent just before the 60-s request timeout held the chunk a
    # minute, unpenalised, every time; a late "busy" did the same. An honest server says
    # "not_peer" at once and "busy" by its queue timeout: later, either is a failure.
    cfg = {"max_streams_per_peer": 1, "max_inflight": 1, "refusal_grace": 2.0, "queue_timeout": 20.0}
    for reason, prompt, late in (("not_peer", 1.9, 2.1), ("busy", 21.9, 22.1)):
        core, actions = receiver(**cfg)
        (f,) = of(actions, Fetch)
        core.handle(FetchFailed("pub", D, f.index, reason), prompt)  # in time: no failure
        assert core.stats.fetch_failures == 0 and core.peer_rate("pub") is None
        (f,) = of(core.poll(prompt + 30.0), Fetch)
        started = prompt + 30.0
        core.handle(FetchFailed("pub", D, f.index, reason), started + late)
        assert core.stats.fetch_failures == 1, reason
        assert core.peer_rate("pub") == core.config.rate_prior * core.config.failure_rate_factor


def test_a_relay_saying_not_peer_is_left_alone_longer_than_the_publisher() -> None:
    # The publisher's "not_peer" is rt93's honest case (asked again after 0.5 s); a relay's costs us
    # nothing to skip (the publisher stands in) and, re-asked every 0.5 s, a hostile relay took a
    # fetch slot back each time (rt94 F1).
    core, _ = receiver(max_streams_per_peer=1, max_inflight=1, not_peer_relay_backoff=10.0)
    transfer = core._transfers[D]
    for i, f in list(transfer.inflight.items()):
        core.handle(FetchFailed(f.peer, D, i, "busy"), 0.0)  # the publisher busy for a moment
    (f,) = of(core.handle(PeerHave("relay", D, frozenset(range(10))), 0.0), Fetch)
    assert f.peer == "relay"
    out = core.handle(FetchFailed("relay", D, f.index, "not_peer"), 0.1)
    out += core.poll(1.0)
    assert {a.peer for a in of(out, Fetch)} == {"pub"}  # the publisher is asked meanwhile
    assert core._peers["relay"].backoff_until == 10.1 and core.stats.fetch_failures == 0


def test_missing_answer_forgets_that_peer_as_holder_of_that_chunk() -> None:
    core, _ = receiver(max_streams_per_peer=1, max_inflight=1, publisher="pub")
    core.handle(PeerHave("a", D, frozenset([7])), 0.0)
    transfer = core._transfers[D]
    i, f = next(iter(transfer.inflight.items()))
    core.handle(FetchFailed(f.peer, D, i, "missing"), 0.0)
    if f.peer == "a":
        assert "a" not in transfer.holders[7]


def test_peer_leaving_mid_transfer_fails_over_its_fetches() -> None:
    core = BroadcastCore("r", BroadcastConfig(max_streams_per_peer=2, max_inflight=2))
    core.handle(ManifestAccepted(D, LAYOUT, "pub"), 0.0)
    t = core._transfers[D]
    for i, f in list(t.inflight.items()):
        core.handle(FetchFailed(f.peer, D, i, "busy"), 0.0)  # publisher busy: backs off
    out = core.handle(PeerHave("a", D, frozenset(range(10))), 0.0)
    assert {f.peer for f in of(out, Fetch)} == {"a"}
    out = core.handle(PeerLeft("a"), 0.01)
    assert core.inflight() == 0 or all(f.peer != "a" for f in t.inflight.values())
    out = core.poll(1.0)
    assert {f.peer for f in of(out, Fetch)} == {"pub"}
    assert all(not t.holders[i] for i in range(10))


def test_banned_peer_is_not_fetched_from_nor_served() -> None:
    core, _ = receiver(max_streams_per_peer=1, max_inflight=4)
    core.handle(PeerBanned("a", until=100.0), 0.0)
    out = core.handle(PeerHave("a", D, frozenset(range(10))), 0.0)
    assert all(f.peer != "a" for f in of(out, Fetch))
    pub = BroadcastCore("pub")
    pub.handle(Publish(D, LAYOUT), 0.0)
    pub.handle(PeerBanned("a", until=100.0), 0.0)
    (refuse,) = pub.handle(ChunkRequested("a", D, 0, 1), 1.0)
    assert refuse == Refuse("a", D, 0, 1, "banned")


# --------------------------------------------------------------------------- serving


def publisher(**overrides: Any) -> BroadcastCore:
    core = BroadcastCore("pub", BroadcastConfig(**overrides))
    assert core.handle(Publish(D, LAYOUT), 0.0) == []
    return core


def test_request_for_a_chunk_not_held_is_refused_missing() -> None:
    core, _ = receiver()
    assert core.handle(ChunkRequested("x", D, 0, 7), 0.0) == [Refuse("x", D, 0, 7, "missing")]
    assert core.handle(ChunkRequested("x", b"other", 0, 8), 0.0) == [Refuse("x", b"other", 0, 8, "missing")]


def test_upload_slots_are_bounded_and_freed_by_upload_finished() -> None:
    core = publisher(upload_slots=2, upload_queue=4)
    ups = [core.handle(ChunkRequested(f"p{n}", D, n, n), 0.0) for n in range(3)]
    assert [len(of(u, Upload)) for u in ups] == [1, 1, 0]
    assert core.uploads_active() == 2
    out = core.handle(UploadFinished(0), 1.0)
    assert out == [Upload("p2", D, 2, 2)]


def test_requests_beyond_slots_and_queue_are_refused_busy() -> None:
    core = publisher(upload_slots=1, upload_queue=1)
    assert of(core.handle(ChunkRequested("a", D, 0, 1), 0.0), Upload)
    assert core.handle(ChunkRequested("b", D, 1, 2), 0.0) == []  # queued
    out = core.handle(ChunkRequested("c", D, 1, 3), 0.0)  # same chunk as b, later: worse
    assert out == [Refuse("c", D, 1, 3, "busy")]


def test_queue_serves_the_chunk_with_fewest_replicas_first_super_seeding() -> None:
    core = publisher(upload_slots=1, upload_queue=8)
    core.handle(ChunkRequested("a", D, 0, 1), 0.0)  # chunk 0 now has one replica in progress
    core.handle(ChunkRequested("b", D, 0, 2), 0.0)  # a duplicate of chunk 0
    core.handle(PeerHave("x", D, frozenset([1])), 0.0)
    core.handle(ChunkRequested("c", D, 1, 3), 0.0)  # chunk 1: one holder known
    core.handle(ChunkRequested("d", D, 5, 4), 0.0)  # chunk 5: nobody has it
    order = []
    for rid in (1, 4, 2, 3):
        out = core.handle(UploadFinished(rid), 1.0)
        order += [u.request_id for u in of(out, Upload)]
    assert order[0] == 4  # the never-served chunk jumps the queue


def test_queue_is_fair_between_peers() -> None:
    core = publisher(upload_slots=2, upload_queue=8)
    core.handle(ChunkRequested("greedy", D, 0, 1), 0.0)  # slot 1
    core.handle(ChunkRequested("greedy", D, 1, 2), 0.0)  # slot 2
    core.handle(ChunkRequested("greedy", D, 2, 3), 0.0)
    core.handle(ChunkRequested("polite", D, 3, 4), 0.0)
    out = core.handle(UploadFinished(1), 1.0)
    assert [u.peer for u in of(out, Upload)] == ["polite"]


def test_queued_request_waits_at_most_queue_timeout_then_busy() -> None:
    core = publisher(upload_slots=1, upload_queue=4, queue_timeout=2.0, upload_timeout=100.0)
    core.handle(ChunkRequested("a", D, 0, 1), 0.0)
    core.handle(ChunkRequested("b", D, 1, 2), 0.0)
    assert core.next_deadline() == 2.0
    assert core.poll(2.0) == [Refuse("b", D, 1, 2, "busy")]


def test_upload_slot_is_reclaimed_if_finish_never_comes() -> None:
    core = publisher(upload_slots=1, upload_timeout=3.0, queue_timeout=10.0)
    core.handle(ChunkRequested("a", D, 0, 1), 0.0)
    core.handle(ChunkRequested("b", D, 1, 2), 0.0)
    assert core.poll(3.0) == [Upload("b", D, 1, 2)]
    assert core.handle(UploadFinished(1), 4.0) == []  # late: ignored


def test_queued_requests_of_a_departed_peer_are_refused_gone() -> None:
    core = publisher(upload_slots=1)
    core.handle(ChunkRequested("a", D, 0, 1), 0.0)
    core.handle(ChunkRequested("b", D, 1, 2), 0.0)
    assert core.handle(PeerLeft("b"), 0.0) == [Refuse("b", D, 1, 2, "gone")]


def test_retire_forgets_the_version_and_refuses_its_queue() -> None:
    core = publisher(upload_slots=1)
    core.handle(ChunkRequested("a", D, 0, 1), 0.0)
    core.handle(ChunkRequested("b", D, 1, 2), 0.0)
    assert core.handle(Retire(D), 0.0) == [Refuse("b", D, 1, 2, "missing")]
    assert core.holding(D) == []


def test_receiver_serves_a_chunk_as_soon_as_it_is_verified() -> None:
    core, actions = receiver()
    f = of(actions, Fetch)[0]
    assert core.handle(ChunkRequested("x", D, f.index, 1), 0.0) == [Refuse("x", D, f.index, 1, "missing")]
    core.handle(ChunkReceived("pub", D, f.index, True, 100, 0.1), 0.0)
    assert core.handle(ChunkRequested("x", D, f.index, 2), 0.0) == [Upload("x", D, f.index, 2)]


# --------------------------------------------------------------------------- a swarm, driven with no bytes


@dataclass
class _Up:
    src: str
    dst: str
    index: int
    rid: int
    left: float


@dataclass
class FluidSwarm:
    """Every node's upload is ``bandwidth`` bytes/s shared equally by its active uploads."""

    n: int
    layout: ChunkLayout
    bandwidth: float
    config: BroadcastConfig
    cores: dict[str, BroadcastCore] = field(default_factory=dict)
    ups: list[_Up] = field(default_factory=list)
    requests: dict[int, tuple[str, str, int, float]] = field(default_factory=dict)
    done_at: dict[str, float] = field(default_factory=dict)
    corrupt: set[str] = field(default_factory=set)
    dead: set[str] = field(default_factory=set)
    rid: int = 0
    pending: list[tuple[str, Action]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cores["pub"] = BroadcastCore("pub", self.config)
        self.cores["pub"].handle(Publish(D, self.layout), 0.0)
        for i in range(self.n):
            self.cores[f"r{i}"] = BroadcastCore(f"r{i}", self.config)

    def start(self) -> None:
        for name, core in self.cores.items():
            if name != "pub":
                self.run(name, core.handle(ManifestAccepted(D, self.layout, "pub"), 0.0), 0.0)

    def run(self, me: str, actions: list[Action], now: float) -> None:
        work = [(me, a) for a in actions]
        while work:
            who, a = work.pop(0)
            if who in self.dead:
                continue
            if isinstance(a, Fetch):
                if a.peer in self.dead:
                    out = self.cores[who].handle(FetchFailed(a.peer, D, a.index, "error"), now)
                    work += [(who, x) for x in out]
                    continue
                self.rid += 1
                self.requests[self.rid] = (who, a.peer, a.index, now)
                out = self.cores[a.peer].handle(ChunkRequested(who, D, a.index, self.rid), now)
                work += [(a.peer, x) for x in out]
            elif isinstance(a, Upload):
                self.ups.append(_Up(who, a.peer, a.index, a.request_id, self.layout.length(a.index)))
            elif isinstance(a, Refuse):
                req, _, index, _ = self.requests.pop(a.request_id)
                out = self.cores[req].handle(FetchFailed(who, D, index, a.reason), now)
                work += [(req, x) for x in out]
            elif isinstance(a, Have):
                for name, core in self.cores.items():
                    if name != who and name not in self.dead:
                        work += [(name, x) for x in core.handle(PeerHave(who, D, frozenset([a.index])), now)]
            elif isinstance(a, Completed):
                self.done_at[who] = now

    def simulate(self, limit: float = 1e6) -> float:
        now = 0.0
        self.start()
        while len(self.done_at) < self.n - len(self.dead):
            rates: dict[str, float] = {}
            for u in self.ups:
                rates[u.src] = rates.get(u.src, 0) + 1
            next_up = min((u.left * rates[u.src] / self.bandwidth for u in self.ups), default=math.inf)
            deadlines = [c.next_deadline() for n, c in self.cores.items() if n not in self.dead]
            next_poll = min((d for d in deadlines if d is not None), default=math.inf)
            step = min(next_up, max(next_poll - now, 0.0))
            assert step < math.inf, "deadlock: nothing to wait for"
            now += step
            assert now < limit
            for u in self.ups:
                u.left -= step * self.bandwidth / rates[u.src]
            finished = [u for u in self.ups if u.left <= 1e-6]
            self.ups = [u for u in self.ups if u.left > 1e-6]
            for u in finished:
                self.run(u.src, self.cores[u.src].handle(UploadFinished(u.rid), now), now)
                req, _, index, started = self.requests.pop(u.rid)
                valid = u.src not in self.corrupt
                nbytes = self.layout.length(index)
                received = ChunkReceived(u.src, D, index, valid, nbytes, now - started)
                out = self.cores[req].handle(received, now)
                self.run(req, out, now)
            for name, core in self.cores.items():
                if name not in self.dead:
                    self.run(name, core.poll(now), now)
        return max(self.done_at.values())


def test_swarm_of_eight_approaches_the_chain_bound_and_beats_a_star() -> None:
    layout = ChunkLayout(total_bytes=32 * 100, chunk_size=100)
    n, bw = 8, 100.0
    swarm = FluidSwarm(n, layout, bw, BroadcastConfig(rate_prior=bw))  # default knobs
    t = swarm.simulate()
    chain = (layout.n_chunks + n - 1) * layout.chunk_size / bw
    star = n * layout.total_bytes / bw
    assert t <= 1.3 * chain, (t, chain)
    assert star / t >= 4
    star_cfg = BroadcastConfig(publisher_only=True, upload_slots=1, rate_prior=bw)
    star_swarm = FluidSwarm(n, layout, bw, star_cfg)
    assert star_swarm.simulate() >= 0.99 * star


def test_swarm_completes_byte_identical_despite_a_corrupting_relay() -> None:
    layout = ChunkLayout(total_bytes=16 * 100, chunk_size=100)
    swarm = FluidSwarm(4, layout, 100.0, BroadcastConfig(upload_slots=1, max_bad_chunks=2))
    swarm.corrupt.add("r1")
    swarm.n = 4
    swarm.simulate()
    # r1 itself completes too (it receives valid chunks); the others all blamed and banned it.
    assert len(swarm.done_at) == 4
    assert any(c.is_banned("r1") for name, c in swarm.cores.items() if name not in ("r1", "pub"))
    assert all(c.stats.chunks_invalid <= 2 for c in swarm.cores.values())


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 6),
    chunks=st.integers(1, 12),
    slots=st.integers(1, 3),
    streams=st.integers(1, 3),
    inflight=st.integers(1, 6),
    queue=st.integers(0, 4),
)
def test_any_small_swarm_completes_within_bounds(
    n: int, chunks: int, slots: int, streams: int, inflight: int, queue: int
) -> None:
    cfg = BroadcastConfig(
        upload_slots=slots, max_streams_per_peer=streams, max_inflight=inflight, upload_queue=queue
    )
    swarm = FluidSwarm(n, ChunkLayout(chunks * 10, 10), 10.0, cfg)
    swarm.simulate(limit=1e5)
    for core in swarm.cores.values():
        assert core.is_complete(D)
        assert core.inflight() == 0
        assert core.uploads_active() <= slots
