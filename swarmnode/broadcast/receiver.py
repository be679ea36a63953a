"""A worker's weight receiver as a sans-IO state machine: which policy version to fetch, drop, install.

Owns
    One receiver's decisions about the versions its publisher (a worker's learner) sends manifests
    of: which manifest to act on (newer than the version installed and the one in flight; older or
    duplicate ones are ignored), one receive at a time plus the newest manifest waiting, abandoning
    the receive in flight once a manifest more than ``staleness_bound`` versions newer arrives,
    installing a version whose every chunk verified (unless a newer one is installed already),
    what a failed receive does (release its bytes, start the waiting manifest), which installed
    versions stay served (the newest ``keep_installed``), blame counts per peer, and its status.

Must not
    Check signatures or chunk hashes (the driver hands in manifests it verified, and reports a
    receive complete only when every chunk verified), move bytes, read a clock or touch a model.
    Its drivers: ``swarmnode.broadcast.weights.WeightReceiver`` (asyncio; a worker's model under
    its lock) and ``swarmnode.sim.broadcast`` (virtual time; every simulated receiver).

Why one receive at a time
    Receives of every version the learner publishes would share the worker's link and the
    learner's upload, and each would arrive later than one alone (and be thrown away when a
    newer one lands first). Why abandon beyond S: the learner serves its last S + 1 versions
    only, and everything generated with a version more than S behind would be dropped as stale.

Driving it
    ``handle(event)`` returns actions; the driver performs them in order. There are no timers
    (the receive timeout is the driver's, reported as ``ReceiveFailed``), so there is no ``now``.
    An event about a receive that is no longer in flight (abandoned meanwhile) is ignored.
    ``M`` is whatever the driver needs to start a receive (the node: its ``OpenedManifest``;
    the simulator: a chunk layout); the core only carries it.

    ====================  =====================================================================
    event                 meaning
    ====================  =====================================================================
    ``ManifestArrived``   a verified manifest of ``version`` (named ``digest`` among peers)
    ``ReceiveComplete``   every chunk of the receive in flight verified; ready to install
    ``Installed``         the driver installed the version ``Install`` named
    ``ReceiveFailed``     the receive in flight (or its install) failed: timeout, retired...
    ``ChunkBlamed``       ``peer`` sent an invalid chunk (counted; the broadcast core bans)
    ``Close``             shutting down: nothing starts any more
    ====================  =====================================================================

    ====================  =====================================================================
    action                driver does
    ====================  =====================================================================
    ``StartReceive``      fetch ``digest``'s chunks; feed ``ReceiveComplete`` or ``ReceiveFailed``
    ``AbandonReceive``    stop the receive of ``digest`` (``newer``: the version that made it
                          stale, ``None`` when closing); a ``Release`` of it follows
    ``Install``           swap ``version`` in atomically (between batches); feed ``Installed``,
                          or ``ReceiveFailed`` if the install failed
    ``Release``           stop holding and serving ``digest``'s bytes
    ====================  =====================================================================
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any, Generic, TypeAlias, TypeVar

from swarmnode.core.events import Digest, PeerId
from swarmnode.errors import ConfigError

M = TypeVar("M")

#: Installed versions whose bytes a receiver keeps serving (peers may still be fetching them).
KEEP_INSTALLED = 2


# --------------------------------------------------------------------------- events


@dataclass(frozen=True)
class ManifestArrived(Generic[M]):
    version: int
    digest: Digest
    manifest: M


@dataclass(frozen=True)
class ReceiveComplete:
    version: int
    digest: Digest


@dataclass(frozen=True)
class Installed:
    version: int
    digest: Digest


@dataclass(frozen=True)
class ReceiveFailed:
    version: int
    digest: Digest
    reason: str


@dataclass(frozen=True)
class ChunkBlamed:
    peer: PeerId


@dataclass(frozen=True)
class Close:
    pass


Event: TypeAlias = ManifestArrived[Any] | ReceiveComplete | Installed | ReceiveFailed | ChunkBlamed | Close


# --------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class StartReceive(Generic[M]):
    version: int
    digest: Digest
    manifest: M


@dataclass(frozen=True)
class AbandonReceive:
    version: int
    digest: Digest
    newer: int | None  # the manifest that made it stale; None: the receiver is closing


@dataclass(frozen=True)
class Install:
    version: int
    digest: Digest


@dataclass(frozen=True)
class Release:
    digest: Digest


Action: TypeAlias = StartReceive[Any] | AbandonReceive | Install | Release


@dataclass
class ReceiverStats:
    """Monotonic counters, for metrics, tests and the simulator."""

    manifests_ignored: int = 0  # older than installed or in flight, or a duplicate
    receives_started: int = 0
    receives_abandoned: int = 0  # superseded by a manifest more than S newer (not closing)
    receives_failed: int = 0
    receives_superseded: int = 0  # complete, but a newer version was installed meanwhile
    installed: int = 0
    blames: collections.Counter[PeerId] = field(default_factory=collections.Counter)


class ReceiverCore(Generic[M]):
    """Which version a receiver fetches, abandons and installs; see the module docstring."""

    def __init__(
        self, staleness_bound: int, *, installed: int = -1, keep_installed: int = KEEP_INSTALLED
    ) -> None:
        if staleness_bound < 0:
            raise ConfigError(f"staleness_bound must be >= 0, got {staleness_bound!r}")
        if keep_installed < 1:
            raise ConfigError(f"keep_installed must be >= 1, got {keep_installed!r}")
        self.staleness_bound = staleness_bound
        self.keep_installed = keep_installed
        self.installed = installed  # the version the driver swapped in last (-1: none yet)
        self.in_flight: ManifestArrived[M] | None = None
        self.installing = False  # Install emitted for ``in_flight``, Installed not yet fed
        self.pending: ManifestArrived[M] | None = None  # the newest manifest that arrived meanwhile
        self.closed = False
        # Installed versions still served, oldest first.
        self.served: collections.OrderedDict[int, Digest] = collections.OrderedDict()
        self.stats = ReceiverStats()

    # ------------------------------------------------------------------ queries

    @property
    def receiving(self) -> list[int]:
        return [] if self.in_flight is None else [self.in_flight.version]

    def status(self) -> dict[str, Any]:
        return {
            "installed": self.installed,
            "receiving": self.receiving,
            "pending": self.pending.version if self.pending is not None else None,
            "blamed": dict(self.stats.blames),
        }

    # ------------------------------------------------------------------ events

    def handle(self, event: Event) -> list[Action]:
        out: list[Action] = []
        if isinstance(event, ManifestArrived):
            self._on_manifest(event, out)
        elif isinstance(event, ReceiveComplete):
            self._on_complete(event, out)
        elif isinstance(event, Installed):
            self._on_installed(event, out)
        elif isinstance(event, ReceiveFailed):
            self._on_failed(event, out)
        elif isinstance(event, ChunkBlamed):
            self.stats.blames[event.peer] += 1  # the broadcast core already bans repeat offenders
        elif isinstance(event, Close):
            self._on_close(out)
        return out

    def _is_current(self, version: int, digest: Digest) -> bool:
        f = self.in_flight
        return f is not None and f.version == version and f.digest == digest

    def _on_manifest(self, event: ManifestArrived[M], out: list[Action]) -> None:
        if self.closed:
            return
        f = self.in_flight
        if event.version <= self.installed or (f is not None and event.version == f.version):
            self.stats.manifests_ignored += 1
            return
        if f is not None and not self.installing and event.version - f.version > self.staleness_bound:
            if self.pending is not None and self.pending.version > event.version:
                event = self.pending  # out of order: the newest manifest wins
            self._abandon(event.version, out)
        if self.in_flight is not None:
            if self.pending is None or event.version > self.pending.version:
                self.pending = event
            else:
                self.stats.manifests_ignored += 1
            return
        self._start(event, out)

    def _abandon(self, newer: int | None, out: list[Action]) -> None:
        f = self.in_flight
        if f is not None:
            if newer is not None:
                self.stats.receives_abandoned += 1
            out.append(AbandonReceive(f.version, f.digest, newer))
            out.append(Release(f.digest))
            self.in_flight = None
            self.installing = False
        self.pending = None

    def _start(self, event: ManifestArrived[M], out: list[Action]) -> None:
        self.in_flight = event
        self.stats.receives_started += 1
        out.append(StartReceive(event.version, event.digest, event.manifest))

    def _on_complete(self, event: ReceiveComplete, out: list[Action]) -> None:
        if not self._is_current(event.version, event.digest) or self.installing:
            return
        if event.version <= self.installed:
            self.stats.receives_superseded += 1
            out.append(Release(event.digest))
            self._next(out)
            return
        self.installing = True
        out.append(Install(event.version, event.digest))

    def _on_installed(self, event: Installed, out: list[Action]) -> None:
        if not (self._is_current(event.version, event.digest) and self.installing):
            return
        self.installed = event.version
        self.stats.installed += 1
        self.served[event.version] = event.digest
        while len(self.served) > self.keep_installed:
            _, old = self.served.popitem(last=False)
            out.append(Release(old))
        self._next(out)

    def _on_failed(self, event: ReceiveFailed, out: list[Action]) -> None:
        if not self._is_current(event.version, event.digest):
            return
        self.stats.receives_failed += 1
        out.append(Release(event.digest))
        self._next(out)

    def _next(self, out: list[Action]) -> None:
        """The receive in flight ended: start the manifest that waited, if it is still newer."""
        self.in_flight = None
        self.installing = False
        pending, self.pending = self.pending, None
        if pending is not None and pending.version > self.installed and not self.closed:
            self._start(pending, out)

    def _on_close(self, out: list[Action]) -> None:
        self.closed = True
        self._abandon(None, out)
