"""Settings of the hivemind runtime, and the peers-file format.

Owns: ``NetConfig`` (what ``HivemindRuntime.start`` needs), checking multiaddrs
early with messages that name the bad value, and reading a peers file.
Must not: read TOML or environment variables (``swarmnode.config`` does, then
builds a NetConfig), or start anything.

Peers file: one multiaddr per line, each ending in ``/p2p/<peer id>``; ``#``
starts a comment (whole line or after the address); blank lines are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hivemind.dht.validation import RecordValidatorBase
from hivemind.utils.multiaddr import Multiaddr

from swarmnode.errors import ConfigError
from swarmnode.net.record_rules import DEFAULT_RULES, RecordRules
from swarmnode.net.records import DEFAULT_MAX_VALUE_BYTES


def default_identity_path(home: Path) -> Path:
    """Where a node or bootstrap home keeps its libp2p identity (``swarmnode.home.Home.p2p``)."""
    return home / "p2p" / "libp2p.key"


@dataclass(frozen=True)
class NetConfig:
    """Everything the runtime needs; defaults suit a node on one machine (loopback)."""

    # libp2p identity key file (created on first start). None: a throwaway identity
    # in a private temporary directory, deleted on stop (tests, one-off tools).
    identity_path: Path | None = None
    host_maddrs: tuple[str, ...] = ("/ip4/127.0.0.1/tcp/0",)  # where p2pd listens
    announce_maddrs: tuple[str, ...] = ()  # what peers are told to dial (explicit ports only)
    initial_peers: tuple[str, ...] = ()  # full multiaddrs ending in /p2p/<peer id>
    peers_file: Path | None = None  # more initial peers, one per line (module docstring)
    # Behind NAT: serve no DHT requests and do not expect inbound connections.
    client_mode: bool = False
    use_relay: bool = True  # may dial peers through libp2p circuit relays
    use_auto_relay: bool = False  # look for a relay to become reachable behind NAT
    # Before starting with an existing identity, check that no live peer uses it
    # (hivemind's guard against two nodes sharing a key; costs one extra short-lived p2pd).
    check_identity_free: bool = True
    ensure_bootstrap_success: bool = True  # start() fails if no initial peer answers
    startup_timeout: float = 30.0  # p2pd start, identity check and DHT bootstrap, each
    dht_rpc_timeout: float = 5.0  # one DHT RPC to one peer (hivemind's wait_timeout)
    shutdown_timeout: float = 10.0
    rejoin_interval: float = 30.0  # when the routing table is empty, ping initial peers this often
    max_record_bytes: int = DEFAULT_MAX_VALUE_BYTES
    # Expiration caps, subkeys per owner, records per key and owner, storage size (record_rules).
    record_rules: RecordRules = DEFAULT_RULES
    extra_validators: tuple[RecordValidatorBase, ...] = field(default=(), compare=False)

    def all_initial_peers(self) -> list[str]:
        """``initial_peers`` plus the peers file, checked and without duplicates, in order."""
        peers = list(self.initial_peers)
        if self.peers_file is not None:
            peers += read_peers_file(self.peers_file)
        for peer in peers:
            check_peer_maddr(peer, where="initial_peers")
        return list(dict.fromkeys(peers))

    def check(self) -> None:
        """Raise ConfigError for any malformed address or limit, naming it."""
        if not self.host_maddrs:
            raise ConfigError("host_maddrs is empty: give at least one address to listen on")
        for maddr in self.host_maddrs:
            _parse(maddr, where="host_maddrs")
        for maddr in self.announce_maddrs:
            parsed = _parse(maddr, where="announce_maddrs")
            if ("tcp" in parsed and parsed["tcp"] == "0") or ("udp" in parsed and parsed["udp"] == "0"):
                raise ConfigError(f"announce_maddrs: {maddr} has port 0; announce the real port")
        self.all_initial_peers()
        for name in ("startup_timeout", "dht_rpc_timeout", "shutdown_timeout", "rejoin_interval"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0 seconds")
        if self.max_record_bytes <= 0:
            raise ConfigError("max_record_bytes must be > 0")


def read_peers_file(path: Path) -> list[str]:
    """Multiaddrs listed in a peers file; ConfigError naming ``path:line`` for a bad line."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read peers file {path}: {e}") from e
    peers = []
    for number, line in enumerate(text.splitlines(), start=1):
        maddr = line.split("#", 1)[0].strip()
        if maddr:
            check_peer_maddr(maddr, where=f"{path}:{number}")
            peers.append(maddr)
    return peers


def check_peer_maddr(maddr: str, *, where: str) -> None:
    """A dialable peer address must parse and end with /p2p/<peer id>."""
    parsed = _parse(maddr, where=where)
    if "p2p" not in parsed:
        raise ConfigError(f"{where}: {maddr} lacks /p2p/<peer id>; copy the full address the peer printed")


def _parse(maddr: str, *, where: str) -> Multiaddr:
    try:
        return Multiaddr(maddr)
    except (ValueError, TypeError) as e:  # multiaddr's parse errors are ValueErrors
        raise ConfigError(f"{where}: {maddr!r} is not a valid multiaddr ({e})") from e
