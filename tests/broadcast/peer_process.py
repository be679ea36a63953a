"""A broadcast peer in its own process, for tests that kill one mid-transfer.

    python -m tests.broadcast.peer_process SEED_HEX PORT PEERS_JSON MANIFEST_FILE OUT_FILE [RATE]

Receives the version named by MANIFEST_FILE (an encoded manifest envelope) from the peers in
PEERS_JSON ([[peer_id, "host:port"], ...]), writes the blob's SHA-256 to OUT_FILE, then keeps
relaying until killed.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from pathlib import Path

from swarmnode.broadcast.core import BroadcastConfig
from swarmnode.broadcast.driver import BroadcastNode
from swarmnode.identity import NodeIdentity
from swarmnode.net.dataplane import DataPlane
from swarmnode.wire.envelope import Envelope, decode_envelope


async def main(seed: bytes, port: int, peers: Path, manifest: Path, out: Path, rate: float | None) -> None:
    identity = NodeIdentity.from_seed(seed)
    dp = DataPlane(identity, port=port, upload_rate=rate)
    node = BroadcastNode(identity, dp, BroadcastConfig(request_timeout=5.0, failure_backoff=0.2))
    await dp.start()
    await node.start()
    for peer_id, address in json.loads(peers.read_text()):
        node.add_peer(peer_id, address)
    envelope = decode_envelope(manifest.read_bytes())
    assert isinstance(envelope, Envelope)
    blob = await node.receive(envelope, timeout=120)
    out.write_text(hashlib.sha256(blob).hexdigest())
    await asyncio.Event().wait()


if __name__ == "__main__":
    a = sys.argv[1:]
    rate = float(a[5]) if len(a) > 5 else None
    asyncio.run(main(bytes.fromhex(a[0]), int(a[1]), Path(a[2]), Path(a[3]), Path(a[4]), rate))
