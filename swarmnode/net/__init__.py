"""Network runtimes that drive the sans-IO cores.

Owns: talking to other peers (libp2p via hivemind: DHT records and
streams), the libp2p identity, and the bootstrap daemon.
Must not: decide protocol behaviour (what to announce, whom to pull from,
what to admit): that is ``swarmnode.core`` and ``swarmnode.admit``.

Modules (import them directly; this package imports nothing heavy):
- ``hivemind_runtime``: HivemindRuntime (P2P + DHTNode in the caller's loop)
- ``config``: NetConfig, peers-file reader
- ``records``: owned DHT records and their validators
- ``framing``: size-limited request/response frames on streams
- ``libp2p_identity``, ``identity_lock``: the persistent libp2p key
- ``child_guard``: p2pd dies with the node, SIGKILL included
- ``bootstrap``: the bootstrap daemon (``python -m swarmnode.roles.bootstrap``)
- ``errors``: NetError, PeerCallError, CallFailure
"""
