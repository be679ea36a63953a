"""Specification of the sans-IO weight receiver (swarmnode/broadcast/receiver.py). Each test name is a rule.

Only the core is driven here, with plain calls: a manifest is ``(version, digest)`` and the
driver's handle ``M`` is the version's name.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmnode.broadcast.receiver import (
    AbandonReceive,
    Action,
    ChunkBlamed,
    Close,
    Install,
    Installed,
    ManifestArrived,
    ReceiveComplete,
    ReceiveFailed,
    ReceiverCore,
    Release,
    StartReceive,
)
from swarmnode.errors import ConfigError

S = 2


def digest(version: int) -> bytes:
    return f"v{version}".encode().ljust(32, b"\x00")


def manifest(version: int) -> ManifestArrived[str]:
    return ManifestArrived(version, digest(version), f"manifest v{version}")


def core(staleness_bound: int = S, installed: int = -1) -> ReceiverCore[str]:
    return ReceiverCore(staleness_bound, installed=installed)


def install(c: ReceiverCore[str], version: int) -> list[Action]:
    """Complete the receive of ``version`` and perform the Install it asks for."""
    actions = c.handle(ReceiveComplete(version, digest(version)))
    assert actions == [Install(version, digest(version))]
    return c.handle(Installed(version, digest(version)))


# --------------------------------------------------------------------------- which manifest


def test_a_manifest_newer_than_the_installed_version_starts_its_receive() -> None:
    c = core()
    assert c.handle(manifest(0)) == [StartReceive(0, digest(0), "manifest v0")]
    assert c.receiving == [0]


@pytest.mark.parametrize("version", [3, 4])
def test_a_manifest_not_newer_than_the_installed_version_is_ignored(version: int) -> None:
    c = core(installed=4)
    assert c.handle(manifest(version)) == []
    assert c.receiving == [] and c.stats.manifests_ignored == 1


def test_a_duplicate_of_the_manifest_in_flight_is_ignored() -> None:
    c = core()
    c.handle(manifest(0))
    assert c.handle(manifest(0)) == []
    assert c.receiving == [0] and c.status()["pending"] is None


def test_a_newer_manifest_within_s_waits_for_the_receive_in_flight() -> None:
    c = core()
    c.handle(manifest(0))
    assert c.handle(manifest(1)) == []
    assert c.receiving == [0] and c.status()["pending"] == 1


def test_only_the_newest_waiting_manifest_is_kept() -> None:
    c = core()
    c.handle(manifest(0))
    c.handle(manifest(2))
    assert c.handle(manifest(1)) == []  # older than the one waiting: ignored
    assert c.status()["pending"] == 2
    c.handle(manifest(2))
    assert c.status()["pending"] == 2


# --------------------------------------------------------------------------- abandoning


def test_a_manifest_more_than_s_newer_abandons_the_receive_in_flight_and_starts_at_once() -> None:
    c = core()
    c.handle(manifest(0))
    c.handle(manifest(1))  # waiting
    actions = c.handle(manifest(S + 1))
    assert actions == [
        AbandonReceive(0, digest(0), newer=S + 1),
        Release(digest(0)),  # the learner no longer serves it; neither do we
        StartReceive(S + 1, digest(S + 1), f"manifest v{S + 1}"),
    ]
    assert c.receiving == [S + 1] and c.status()["pending"] is None  # v1 is older than v(S+1)
    assert c.stats.receives_abandoned == 1


def test_exactly_s_newer_is_not_enough_to_abandon() -> None:
    c = core()
    c.handle(manifest(0))
    assert c.handle(manifest(S)) == []
    assert c.receiving == [0] and c.stats.receives_abandoned == 0


def test_events_of_an_abandoned_receive_are_ignored() -> None:
    c = core()
    c.handle(manifest(0))
    c.handle(manifest(S + 1))
    assert c.handle(ReceiveComplete(0, digest(0))) == []
    assert c.handle(ReceiveFailed(0, digest(0), "cancelled")) == []
    assert c.receiving == [S + 1] and c.installed == -1


# --------------------------------------------------------------------------- completion and install


def test_a_complete_version_is_installed_and_then_the_waiting_one_starts() -> None:
    c = core()
    c.handle(manifest(0))
    c.handle(manifest(1))
    assert c.handle(ReceiveComplete(0, digest(0))) == [Install(0, digest(0))]
    assert c.installed == -1  # not until the driver says it swapped it in
    assert c.handle(Installed(0, digest(0))) == [StartReceive(1, digest(1), "manifest v1")]
    assert c.installed == 0 and c.receiving == [1]


def test_the_newest_two_installed_versions_stay_served_and_older_ones_are_released() -> None:
    c = core()
    for version in range(2):
        c.handle(manifest(version))
        assert install(c, version) == []
    c.handle(manifest(2))
    assert install(c, 2) == [Release(digest(0))]
    assert list(c.served) == [1, 2]


def test_a_version_completed_after_a_newer_one_was_installed_is_released_not_installed() -> None:
    c = ReceiverCore[str](S, installed=-1)
    c.handle(manifest(0))
    c.installed = 5  # e.g. installed by another path meanwhile
    assert c.handle(ReceiveComplete(0, digest(0))) == [Release(digest(0))]
    assert c.receiving == [] and c.stats.receives_superseded == 1


def test_a_complete_event_for_another_digest_of_the_same_version_is_ignored() -> None:
    c = core()
    c.handle(manifest(0))
    assert c.handle(ReceiveComplete(0, b"other".ljust(32, b"\x00"))) == []
    assert c.receiving == [0]


# --------------------------------------------------------------------------- failures and blame


def test_a_failed_receive_releases_its_bytes_and_starts_the_waiting_manifest() -> None:
    c = core()
    c.handle(manifest(0))
    c.handle(manifest(1))
    assert c.handle(ReceiveFailed(0, digest(0), "timeout")) == [
        Release(digest(0)),
        StartReceive(1, digest(1), "manifest v1"),
    ]
    assert c.stats.receives_failed == 1 and c.installed == -1


def test_a_failed_install_counts_as_a_failed_receive() -> None:
    c = core()
    c.handle(manifest(0))
    c.handle(ReceiveComplete(0, digest(0)))
    assert c.handle(ReceiveFailed(0, digest(0), "state_dict does not fit")) == [Release(digest(0))]
    assert c.installed == -1 and c.receiving == [] and c.handle(Installed(0, digest(0))) == []


def test_a_failed_receive_with_nothing_waiting_leaves_the_receiver_ready_for_the_next_manifest() -> None:
    c = core()
    c.handle(manifest(0))
    c.handle(ReceiveFailed(0, digest(0), "timeout"))
    assert c.handle(manifest(0)) == [StartReceive(0, digest(0), "manifest v0")]  # a re-send retries


def test_blames_are_counted_per_peer_and_do_not_stop_the_receive() -> None:
    c = core()
    c.handle(manifest(0))
    assert c.handle(ChunkBlamed("mallory")) == []
    c.handle(ChunkBlamed("mallory"))
    c.handle(ChunkBlamed("eve"))
    assert c.status()["blamed"] == {"mallory": 2, "eve": 1}
    assert c.receiving == [0]
    assert install(c, 0) == []


# --------------------------------------------------------------------------- closing and config


def test_closing_abandons_the_receive_in_flight_without_counting_it_and_ignores_later_manifests() -> None:
    c = core()
    c.handle(manifest(0))
    c.handle(manifest(1))
    assert c.handle(Close()) == [AbandonReceive(0, digest(0), newer=None), Release(digest(0))]
    assert c.stats.receives_abandoned == 0
    assert c.handle(manifest(5)) == [] and c.receiving == []


def test_a_negative_staleness_bound_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="staleness_bound"):
        ReceiverCore(-1)


# --------------------------------------------------------------------------- invariants


EVENTS = st.lists(
    st.tuples(st.sampled_from(["manifest", "complete", "installed", "failed"]), st.integers(0, 8)),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(EVENTS, st.integers(0, 3))
def test_invariants_hold_for_any_event_sequence(steps: list[tuple[str, int]], bound: int) -> None:
    """At most one receive, and only of a version newer than the installed one; installs only go
    forward; a manifest waits only behind a receive in flight; the installed version is never
    released while it is served."""
    c: ReceiverCore[str] = ReceiverCore(bound)
    installed: list[int] = []
    for kind, version in steps:
        event: Any
        if kind == "manifest":
            event = manifest(version)
        elif kind == "complete":
            event = ReceiveComplete(version, digest(version))
        elif kind == "installed":
            event = Installed(version, digest(version))
        else:
            event = ReceiveFailed(version, digest(version), "timeout")
        for action in c.handle(event):
            if isinstance(action, StartReceive):
                assert c.receiving == [action.version]
            elif isinstance(action, Install):
                assert action.version > c.installed
            elif isinstance(action, Release):
                assert action.digest != digest(c.installed) or c.installed not in c.served
        if isinstance(event, Installed) and c.installed == version and version not in installed:
            installed.append(version)
        assert len(c.receiving) <= 1
        assert c.receiving == [] or c.receiving[0] > c.installed
        pending = c.status()["pending"]
        assert pending is None or (c.receiving and pending > c.installed and pending != c.receiving[0])
    assert installed == sorted(installed)
