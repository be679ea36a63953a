"""Relaying (issue #18, ``GossipConfig.relay``): a node serves and announces the items it admitted,
in the round they were announced in and no longer than their author serves them, within bounds of
its own, and its driver keeps exactly the payloads the core relays."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

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
from swarmnode.gossip.intake import ExternalPool, envelope_digest
from swarmnode.train.batch import ScoredGroup

from .test_core import cfg, d, only, started
from .test_intake import T0, batch_bytes, vectors_receiver


def relaying(**overrides: Any) -> GossipConfig:
    return cfg(**{"relay": True, "admission_timeout": 30.0, **overrides})


def admitted(core: GossipCore, author: str, digest: bytes, now: float, *, size: int = 100) -> list[Any]:
    """``author`` announces ``digest`` in the round of ``now``; it is pulled at once and accepted
    at ``now``: the core's actions on the verdict."""
    [pull] = only(Pull, core.handle(Announced(author, core.current_round(now), (digest,)), now))
    admit = only(Admit, core.handle(PullSucceeded(pull.request_id, author, ((digest, b"x" * size),)), now))
    assert [a.digest for a in admit] == [digest]
    return core.handle(AdmissionResult(author, digest, True, "ok"), now)


def test_an_admitted_item_is_served_and_announced_in_its_round_until_its_authors_copy_expires() -> None:
    core = started(relaying(keep_rounds=1))
    assert only(Retire, admitted(core, "author", d(1), 12.0)) == []  # round 1
    assert only(Announce, core.poll(12.5)) == [Announce(1, 0, (d(1),), 30.0)]  # as the author's
    assert core.handle(PullRequest("reader", (d(1),)), 13.0) == [Serve("reader", (d(1),))]
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
    assert only(Retire, core.handle(AdmissionResult("author", d(1), True, "ok"), 21.0)) == [Retire(d(1))]
    assert core.stats.relay_dropped == 1
    assert core.handle(PullRequest("reader", (d(1),)), 21.0) == [Serve("reader", ())]


def test_a_verdict_the_core_no_longer_waits_for_retires_the_payload_the_driver_kept() -> None:
    core = started(relaying(admission_timeout=2.0))
    [pull] = only(Pull, core.handle(Announced("author", 0, (d(1),)), 1.0))
    core.handle(PullSucceeded(pull.request_id, "author", ((d(1), b"x"),)), 1.0)
    core.poll(4.0)  # the admission timed out
    assert only(Retire, core.handle(AdmissionResult("author", d(1), True, "ok"), 5.0)) == [Retire(d(1))]
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
    assert actions == [[], [], [Retire(d(2))]]
    assert core.stats.relayed == 2 and core.stats.relay_dropped == 1
    assert core.handle(Publish(d(10), 10), 2.0) == []
    assert core.handle(Publish(d(11), 10), 2.0) == []
    assert core.sizes().own_items == 4


def test_a_round_holds_at_most_one_record_part_of_relayed_ids() -> None:
    core = started(relaying(max_digests_per_announcement=2))
    actions = [admitted(core, f"author{i}", d(i), 2.0) for i in range(3)]
    assert [only(Retire, a) for a in actions] == [[], [], [Retire(d(2))]]
    assert only(Announce, actions[1]) == [Announce(0, 0, (d(0), d(1)), 30.0)]  # a full part: at once
    assert core.handle(PullRequest("r", (d(0), d(1), d(2))), 3.0) == [Serve("r", (d(0), d(1)))]
    assert only(Retire, admitted(core, "author7", d(7), 12.0)) == []  # the next round has room again


def test_relayed_payload_bytes_are_bounded_by_max_relay_bytes_and_freed_as_items_expire() -> None:
    core = started(relaying(max_relay_bytes=250, keep_rounds=0))
    sizes = [100, 100, 100]
    actions = [only(Retire, admitted(core, f"author{i}", d(i), 2.0, size=s)) for i, s in enumerate(sizes)]
    assert actions == [[], [], [Retire(d(2))]]  # 96 payload bytes each (the 4-byte prefix is not kept)
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
    core = GossipCore(GossipConfig(relay=True, round_seconds=60.0), "me")
    core.poll(T0)
    [pull] = only(Pull, core.handle(Announced("author", core.current_round(T0), (digest,)), T0))
    [admit] = only(Admit, core.handle(PullSucceeded(pull.request_id, "author", ((digest, data),)), T0))
    driver, actions = judged(core, admit)
    assert only(Retire, actions) == [] and core.stats.relayed == 1
    assert core.handle(PullRequest("reader", (digest,)), T0) == [Serve("reader", (digest,))]
    assert driver.own_payloads[digest] == data

    # A verdict the core did not wait for: retired, and the driver lets the bytes go.
    stray = GossipCore(GossipConfig(relay=True, round_seconds=60.0), "me")
    stray.poll(T0)
    driver, actions = judged(stray, Admit("author", digest, data))
    assert actions == [Retire(digest)]
    for action in actions:
        driver._perform(action)
    assert driver.own_payloads == {}
