"""A weight-broadcast receiver that lies: every slice it relays has its first byte flipped.

Used by ``bench/broadcast.py`` (the corrupt-chunk adversary table) and
``tests/broadcast/test_broadcast_swarm.py`` (the relay is caught, blamed and banned).
"""

from __future__ import annotations

from swarmnode.broadcast.driver import BroadcastNode
from swarmnode.net.dataplane import Reply
from swarmnode.wire.envelope import Envelope
from swarmnode.wire.messages import ChunkData, Message


class CorruptingNode(BroadcastNode):
    """A receiver that relays every slice it serves with its first byte flipped.

    Its answers are signed and well-formed, so only the chunk hash in the publisher's manifest
    tells them apart."""

    async def _on_chunk_request(self, sender: str, envelope: Envelope, message: Message) -> Reply:
        reply = await super()._on_chunk_request(sender, envelope, message)
        data = reply.answer
        assert isinstance(data, ChunkData)
        bad = bytes([data.data[0] ^ 0xFF]) + data.data[1:]
        return Reply(ChunkData(data.manifest_digest, data.chunk_index, data.offset, bad), reply.after)
