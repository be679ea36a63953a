"""Bounded DHT answers: how much one find request, and all of them together, may make a node send.

Why (red team, issue 19): hivemind answers a ``FindRequest`` with every key it names, duplicates
included, each a whole dictionary value. One ~100-byte request naming a full key (256 x 4 KB)
20 times made a bootstrap build a 20 MiB answer (no client can even receive it: hivemind caps a
message at 4 MiB), and 40 such requests at a time grew the bootstrap from 415 MiB to 8.5 GiB,
held after the flood. The record rules bound what is *stored*; these rules bound what is *sent*.

Rules, per request (``AnswerRules``):

* a key named more than once is looked up once; its later copies are answered NOT_FOUND;
* at most ``max_keys`` distinct keys are looked up; the rest are answered NOT_FOUND;
* the values of one answer total at most ``max_answer_bytes`` (under hivemind's 4 MiB cap);

and across all requests, every value sent is paid from one token bucket of ``rate`` bytes/s
(burst ``burst``). A value beyond any of these is answered NOT_FOUND *with* its nearest
neighbours, so an honest reader goes on to the other replicas of the key. Sizes are estimated
from the stored bytes before anything is serialized: refusing costs no serialization.

Owns: ``bounded_find`` (a replacement for ``DHTProtocol.rpc_find``) and ``install``, which
swaps it in for a running node's handler. Must not: store anything or know what values mean.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DictionaryDHTValue
from hivemind.p2p import P2PContext
from hivemind.proto import dht_pb2

from swarmnode.core.limits import TokenBucket

log = logging.getLogger(__name__)
MiB = 1024 * 1024
MAX_PENDING_PINGS = 64
ENTRY_OVERHEAD = 32  # bytes per dictionary entry beyond value and subkey (expiration, msgpack)


@dataclass(frozen=True)
class AnswerRules:
    max_keys: int = 64  # hivemind's own reads ask ~sqrt(keys) per call: a handful
    max_answer_bytes: int = 3 * MiB  # a full key (256 records, ~1.3 MiB) fits twice
    rate: float = 16 * MiB  # value bytes per second, all requesters together
    burst: float = 32 * MiB


DEFAULT_ANSWER_RULES = AnswerRules()


@dataclass
class AnswerStats:
    requests: int = 0
    values_sent: int = 0
    bytes_sent: int = 0
    duplicate_keys: int = 0
    keys_over_limit: int = 0
    values_over_answer_cap: int = 0
    values_over_budget: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


def value_size(value: Any) -> int:
    """Bytes a stored value takes on the wire, estimated without serializing it."""
    if isinstance(value, DictionaryDHTValue):
        return sum(
            len(entry.value) + len(subkey) + ENTRY_OVERHEAD
            for subkey, entry in value.data.items()
            if isinstance(entry.value, bytes) and isinstance(subkey, bytes)
        )
    return len(value) if isinstance(value, bytes) else 0


def _finished_ping(pings: set[asyncio.Task[Any]]) -> Callable[[asyncio.Task[Any]], None]:
    def done(task: asyncio.Task[Any]) -> None:
        pings.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("routing-table ping failed: %r", task.exception())

    return done


FindHandler = Callable[[dht_pb2.FindRequest, P2PContext], Awaitable[dht_pb2.FindResponse]]


def bounded_find(
    protocol: DHTProtocol,
    rules: AnswerRules = DEFAULT_ANSWER_RULES,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[FindHandler, AnswerStats]:
    """``protocol``'s ``rpc_find`` under ``rules`` (module docstring), and its counters."""
    bucket = TokenBucket(rules.rate, rules.burst, updated=clock())
    stats = AnswerStats()
    pings: set[asyncio.Task[Any]] = set()

    async def rpc_find(request: dht_pb2.FindRequest, context: P2PContext) -> dht_pb2.FindResponse:
        stats.requests += 1
        if request.peer and len(pings) < MAX_PENDING_PINGS:
            # As hivemind: a requester that names itself is pinged into the routing table; bounded,
            # so a flood of requests cannot pile up tasks.
            task = asyncio.create_task(protocol.rpc_ping(dht_pb2.PingRequest(peer=request.peer), context))
            pings.add(task)
            task.add_done_callback(_finished_ping(pings))
        response = dht_pb2.FindResponse(results=[], peer=protocol.node_info)
        seen: set[bytes] = set()
        answer_bytes = 0
        exclude = DHTID.from_bytes(request.peer.node_id) if request.peer.node_id else None
        for raw_key in request.keys:
            key_id = DHTID.from_bytes(raw_key)
            item = dht_pb2.FindResult(type=dht_pb2.NOT_FOUND)
            if raw_key in seen:
                stats.duplicate_keys += 1
                response.results.append(item)  # no neighbours either: the first copy has them
                continue
            seen.add(raw_key)
            if len(seen) > rules.max_keys:
                stats.keys_over_limit += 1
                response.results.append(item)
                continue
            found = protocol.storage.get(key_id)
            cached = protocol.cache.get(key_id)
            if cached is not None and (found is None or cached.expiration_time > found.expiration_time):
                found = cached
            if found is not None:
                size = value_size(found.value)
                if answer_bytes + size > rules.max_answer_bytes:
                    stats.values_over_answer_cap += 1
                elif not bucket.take(clock(), float(size)):
                    stats.values_over_budget += 1
                else:
                    answer_bytes += size
                    stats.values_sent += 1
                    stats.bytes_sent += size
                    if isinstance(found.value, DictionaryDHTValue):
                        item = dht_pb2.FindResult(
                            type=dht_pb2.FOUND_DICTIONARY,
                            value=protocol.serializer.dumps(found.value),
                            expiration_time=found.expiration_time,
                        )
                    else:
                        item = dht_pb2.FindResult(
                            type=dht_pb2.FOUND_REGULAR,
                            value=found.value,
                            expiration_time=found.expiration_time,
                        )
            for node_id, peer_id in protocol.routing_table.get_nearest_neighbors(
                key_id, k=protocol.bucket_size, exclude=exclude
            ):
                item.nearest_node_ids.append(node_id.to_bytes())
                item.nearest_peer_ids.append(peer_id.to_bytes())
            response.results.append(item)
        return response

    return rpc_find, stats


async def install(protocol: DHTProtocol, rules: AnswerRules = DEFAULT_ANSWER_RULES) -> AnswerStats | None:
    """Serve ``protocol``'s find requests with ``bounded_find`` from now on; None for a client-mode
    node (it serves nothing). hivemind registered its own handler when the node was created (a
    bound method, so it cannot be swapped in place): remove it and register ours under its name."""
    if protocol.client_mode:
        return None
    handler, stats = bounded_find(protocol, rules)
    name = protocol._get_handle_name(None, "rpc_find")
    await protocol.p2p.remove_protobuf_handler(name)
    await protocol.p2p.add_protobuf_handler(name, handler, dht_pb2.FindRequest)
    return stats
