"""An adversarial swarm peer for tests: speaks the gossip wire format, offers poison.

Run as ``python -m swarmnode.testing.adversary --home DIR --peer BOOTSTRAP_MADDR --round-seconds S``.
It joins the DHT through the bootstrap peer with a ``HivemindRuntime``, serves
``swarmnode.pull.v1`` exactly as ``swarmnode.gossip.driver.GossipDriver`` does (request:
32-byte envelope ids; response: length-prefixed envelopes), and writes
announcement records under ``swarmnode/<swarm>/round/<r>``. The test drives it
through files in ``--home``:

``ready.json``   written once up: its libp2p peer id and the Ed25519 ids it signs with.
``go-phase1``    (created by the test) -> the adversary pulls one honest envelope from
                 the swarm (kept for a replay) and announces one valid envelope whose
                 group claims reward 1 for wrong answers; writes ``phase1.json``.
``go-phase2``    (created by the test) -> announces the poison below in one record and
                 serves it in this order, whatever order it is asked in (phase 1's
                 items still served after it); writes
                 ``phase2.json`` with each item's digest and the verdict an honest node
                 must reach.

Each phase's record is written again in the 2 rounds after its own (``Adversary.announce``).
Order matters, because bans are sticky: every item gets its own verdict only if the
items that ban a signer or the transport peer come after the ones they would mask.
Signers: ``main`` (the adversary's identity), ``forger`` (a bad signature),
``sybil`` (a fresh identity used after the transport peer is banned).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarmnode.core.rounds import round_at, round_start
from swarmnode.gossip.driver import (
    DIGEST_BYTES,
    MAX_PULL_REQUEST,
    MAX_PULL_RESPONSE,
    PULL_HANDLER,
    announcement_key,
    decode_items,
    encode_items,
)
from swarmnode.gossip.intake import envelope_digest
from swarmnode.identity import NodeIdentity
from swarmnode.net.config import NetConfig
from swarmnode.net.errors import NetError, PeerCallError
from swarmnode.net.hivemind_runtime import HivemindRuntime
from swarmnode.tasks import Task, default_mixture, score_completion
from swarmnode.wire import (
    Announce,
    Completion,
    Envelope,
    Kind,
    RolloutBatch,
    RolloutGroup,
    WireError,
    decode_envelope,
    decode_payload,
    encode_envelope,
    encode_payload,
    seal,
    seal_payload,
    to_ms,
)
from swarmnode.wire.limits import MAX_ENVELOPE_BYTES
from swarmnode.wire.messages import TaskId as WireTaskId

log = logging.getLogger("adversary")

SWARM = "default"
MODEL_ID = "adversary/inflated"
CALL_TIMEOUT = 10.0
REANNOUNCE_ROUNDS = 2  # rounds after its own that a phase's record is written again
# A payload that is an envelope's bytes to no one: field number 0 makes the envelope scan fail.
MALFORMED = b"\x00\x00 not an envelope " * 8
OVERSIZED = b"\x0a" * (MAX_ENVELOPE_BYTES + 1)
# Parses as a RolloutBatch field that holds a truncated RolloutGroup: the payload decoder refuses it.
BROKEN_PAYLOAD = b"\x0a\x03abc"


@dataclass
class Item:
    name: str
    data: bytes
    digest: bytes
    expected: str  # the admission verdict: "accepted" or a RejectReason value
    detail: dict[str, Any]


def _group(task: Task, prompt: str, round_index: int) -> tuple[RolloutGroup, list[float], list[float]]:
    """One correct completion claimed wrong, three wrong ones claimed right."""
    answer = str(task.entry["answer"])
    texts = [answer, *(str(int(answer) + k) for k in (1, 2, 3))]
    claimed = [0.0, 1.0, 1.0, 1.0]
    local = [score_completion(task, t) for t in texts]
    assert local == [1.0, 0.0, 0.0, 0.0], (task.id, texts, local)
    completions = tuple(
        Completion(text=t, token_count=len(t) + 1, mean_logprob=-0.05, claimed_reward_informational=c)
        for t, c in zip(texts, claimed, strict=True)
    )
    t = task.id
    group = RolloutGroup(
        task=WireTaskId(t.dataset, t.config, t.seed, t.index, t.prompt_format),
        prompt=prompt,
        completions=completions,
        model_id=MODEL_ID,
        policy_version=0,
        round=round_index,
        batch_reward_mean=1.0,
    )
    return group, claimed, local


class Adversary:
    def __init__(self, runtime: HivemindRuntime, home: Path, round_seconds: float) -> None:
        self.runtime = runtime
        self.home = home
        self.round_seconds = round_seconds
        self.main = NodeIdentity.generate()
        self.forger = NodeIdentity.generate()
        self.sybil = NodeIdentity.generate()
        self.tasks = default_mixture(777).sample(0, 16)
        self.items: list[Item] = []  # this phase's, served in this order
        # Earlier phases' items, still served after this phase's (as a peer serves what it
        # announced): cleared at phase 2, a node that had not yet pulled phase 1 got empty answers,
        # backed off, and did not pull phase 2 within the dashboard test's 120 s.
        self.earlier: list[Item] = []
        self.served: dict[str, int] = {}  # requesting peer -> items served
        self._latest: int | None = None  # the round of the latest phase's first record
        self._reannouncing: asyncio.Task[None] | None = None  # held: a task no one refers to may be collected

    # -- building items ------------------------------------------------------------------

    def _now_round(self) -> int:
        return round_at(time.time(), self.round_seconds)

    def _seal_group(
        self, signer: NodeIdentity, task: Task, prompt: str | None = None, sent_at: float | None = None
    ) -> tuple[bytes, dict[str, Any]]:
        group, claimed, local = _group(task, task.prompt if prompt is None else prompt, self._now_round())
        envelope = seal(
            signer, RolloutBatch(groups=(group,)), to_ms(time.time() if sent_at is None else sent_at)
        )
        detail = {"task": task.id.key(), "texts": [c.text for c in group.completions]}
        return encode_envelope(envelope), {**detail, "claimed": claimed, "local": local}

    def _add(self, name: str, data: bytes, expected: str, detail: dict[str, Any] | None = None) -> Item:
        digest = envelope_digest(data) or hashlib.sha256(data).digest()
        item = Item(name, data, digest, expected, detail or {})
        self.items.append(item)
        return item

    def _bad_signature(self, task: Task) -> bytes:
        data, _ = self._seal_group(self.forger, task)
        envelope = decode_envelope(data)
        assert isinstance(envelope, Envelope)
        signature = bytes([envelope.signature[0] ^ 0xFF]) + envelope.signature[1:]
        forged = Envelope(
            envelope.version,
            envelope.kind,
            envelope.sender_key,
            envelope.sent_at_ms,
            envelope.payload,
            signature,
        )
        return encode_envelope(forged)

    # -- phases --------------------------------------------------------------------------

    async def capture_honest_envelope(self, deadline: float) -> tuple[bytes, dict[str, Any]]:
        """Pull one envelope an honest node announced (the adversary's copy for a replay)."""
        while time.time() < deadline:
            current = self._now_round()
            for round_index in (current, current - 1):
                records = await self.runtime.dht_get(
                    announcement_key(SWARM, round_index), timeout=CALL_TIMEOUT
                )
                for record in records:
                    if record.owner == self.runtime.peer_id:
                        continue
                    announce = decode_payload(Kind.ANNOUNCE, record.value)
                    if not isinstance(announce, Announce) or not announce.rollout_digests:
                        continue
                    digest = announce.rollout_digests[-1]
                    try:
                        response = await self.runtime.call_stream(
                            record.owner,
                            PULL_HANDLER,
                            digest,
                            timeout=CALL_TIMEOUT,
                            max_response_bytes=MAX_PULL_RESPONSE,
                        )
                    except PeerCallError as exc:
                        log.info("capture from %s failed: %s", record.owner, exc)
                        continue
                    items = decode_items(response, 1)
                    if items and envelope_digest(items[0]) == digest:
                        envelope = decode_envelope(items[0])
                        assert isinstance(envelope, Envelope)
                        return items[0], {
                            "owner": record.owner,
                            "signer": envelope.sender_id,
                            "round": announce.round,
                            "digest": digest.hex(),
                            "sent_at": envelope.sent_at_ms / 1000.0,
                        }
            await asyncio.sleep(0.5)
        raise TimeoutError("no honest announcement to capture")

    async def announce(self, items: list[Item]) -> int:
        """Announce ``items`` in this round's record, and again in the next ``REANNOUNCE_ROUNDS``
        rounds' (in the background): a node whose pull of some of them failed pulls them again
        from a later round's record. A node that judged them remembers them for 4 rounds, longer
        than the records are read, so none is pulled twice (a clean-clone CI run failed when one
        node's pull of 2 of the 8 phase-1 items failed and they were not pulled again in 240 s)."""
        r = self._now_round()
        await self._store(r, items)
        self._latest = r
        self._reannouncing = asyncio.create_task(self._reannounce(r, items))
        return r

    async def _store(self, r: int, items: list[Item]) -> None:
        value = encode_payload(Announce(round=r, rollout_digests=tuple(i.digest for i in items)))
        stored = await self.runtime.dht_store(
            announcement_key(SWARM, r),
            b"part0",
            value,
            self.runtime.dht_time() + 3 * self.round_seconds,
            timeout=CALL_TIMEOUT,
        )
        if not stored:
            raise RuntimeError(f"announcement of round {r} was not stored")

    async def _reannounce(self, r: int, items: list[Item]) -> None:
        for later in range(r + 1, r + 1 + REANNOUNCE_ROUNDS):
            await asyncio.sleep(max(0.0, round_start(later, self.round_seconds) - time.time()) + 0.05)
            if self._latest != r:
                return  # the next phase began: its items replace these
            try:
                await self._store(later, items)
            except (RuntimeError, NetError, OSError) as exc:
                log.info("re-announcement of round %d failed: %s", later, exc)

    async def phase1(self) -> dict[str, Any]:
        honest, captured = await self.capture_honest_envelope(time.time() + 120)
        self.captured = honest
        data, detail = self._seal_group(self.main, self.tasks[0])
        self.phase1_bytes = data
        items = [self._add("inflated_phase1", data, "accepted", detail)]
        # Seven more, accepted too: with 8 items accepted, every node pulls this peer's phase-2
        # items at full size, all of them before the verdicts that ban it. With fewer, its pulls
        # are small (one or two items each) and the node stops pulling once it is banned.
        for k in range(8, 15):
            more, more_detail = self._seal_group(self.main, self.tasks[k])
            items.append(self._add(f"inflated_phase1_{k}", more, "accepted", more_detail))
        r = await self.announce(items)
        return {
            "time": time.time(),
            "round": r,
            "captured": captured,
            "item": _describe(items[0]),
            "items": [_describe(i) for i in items],
        }

    async def phase2(self) -> dict[str, Any]:
        self.earlier, self.items = self.earlier + self.items, []
        t = self.tasks
        # Scores (ban at -10). Transport peer: malformed -2 and too large -2 (judged first, as they
        # are not envelopes), two replays -0.5 each, one bad signature -5 -> banned. Main signer:
        # +1.6 (8 items in phase 1), duplicate -2, +0.2, invalid payload -5, prompt mismatch -10 -> banned.
        self._add("replay_honest", self.captured, "replay")
        self._add("replay_own", self.phase1_bytes, "replay")
        # Same rollouts as phase 1 in a new envelope (a second later: a new envelope id).
        duplicate, _ = self._seal_group(self.main, t[0], sent_at=time.time() + 1)
        self._add("duplicate", duplicate, "duplicate")
        inflated, detail = self._seal_group(self.main, t[1])
        self._add("inflated", inflated, "accepted", detail)
        broken = seal_payload(self.main, Kind.ROLLOUT_BATCH, BROKEN_PAYLOAD, to_ms(time.time()))
        assert isinstance(decode_payload(Kind.ROLLOUT_BATCH, BROKEN_PAYLOAD), WireError)
        self._add("invalid_payload", encode_envelope(broken), "invalid_payload")
        mismatch, _ = self._seal_group(self.main, t[2], prompt=t[3].prompt)
        assert t[2].prompt != t[3].prompt
        self._add("prompt_mismatch", mismatch, "prompt_mismatch")
        for k in (1, 2):  # each is refused as "banned"; the ban itself is counted once
            after_ban, _ = self._seal_group(self.main, t[3 + k])
            self._add(f"main_after_ban_{k}", after_ban, "banned")
        self._add("malformed", MALFORMED, "malformed")
        self._add("oversized", OVERSIZED, "too_large")
        self._add("bad_signature", self._bad_signature(t[6]), "bad_signature")
        sybil, _ = self._seal_group(self.sybil, t[7])
        self._add("sybil_after_transport_ban", sybil, "banned")
        r = await self.announce(self.items)
        return {"time": time.time(), "round": r, "items": [_describe(i) for i in self.items]}

    # -- serving -------------------------------------------------------------------------

    async def serve(self, peer_id: str, request: bytes) -> bytes:
        if len(request) % DIGEST_BYTES:
            raise ValueError("pull request is not a whole number of 32-byte digests")
        wanted = {request[i : i + DIGEST_BYTES] for i in range(0, len(request), DIGEST_BYTES)}
        served: dict[bytes, bytes] = {}  # one copy of each digest (phase 2 replays phase 1's bytes)
        for item in (*self.items, *self.earlier):
            if item.digest in wanted:
                served.setdefault(item.digest, item.data)
        self.served[peer_id] = self.served.get(peer_id, 0) + len(served)
        log.info("served %d of %d items to %s", len(served), len(wanted), peer_id)
        return encode_items(list(served.values()))

    async def run(self) -> None:
        phases = (("go-phase1", "phase1.json", self.phase1), ("go-phase2", "phase2.json", self.phase2))
        for trigger, result, phase in phases:
            while not (self.home / trigger).exists():
                await asyncio.sleep(0.1)
            write_json(self.home / result, await phase())
            log.info("%s done", result)
        await asyncio.Event().wait()  # keep serving until stopped


def _describe(item: Item) -> dict[str, Any]:
    return {"name": item.name, "digest": item.digest.hex(), "expected": item.expected, **item.detail}


def write_json(path: Path, value: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, indent=1))
    os.replace(tmp, path)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--home", type=Path, required=True)
    parser.add_argument("--peer", action="append", default=[])
    parser.add_argument("--round-seconds", type=float, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    config = NetConfig(
        identity_path=args.home / "p2p" / "libp2p.key",
        host_maddrs=("/ip4/127.0.0.1/tcp/0",),
        initial_peers=tuple(args.peer),
    )
    async with await HivemindRuntime.create(config) as runtime:
        adversary = Adversary(runtime, args.home, args.round_seconds)
        await runtime.add_stream_handler(
            PULL_HANDLER, adversary.serve, max_request_bytes=MAX_PULL_REQUEST, timeout=30.0
        )
        write_json(
            args.home / "ready.json",
            {
                "libp2p_peer_id": runtime.peer_id,
                "main": adversary.main.peer_id,
                "forger": adversary.forger.peer_id,
                "sybil": adversary.sybil.peer_id,
                "pid": os.getpid(),
                "p2pd_pid": runtime.p2pd_pid,
            },
        )
        job = asyncio.create_task(adversary.run())
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait([job, stopping], return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if job.done():
            job.result()  # raises what went wrong
        job.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await job
        log.info("served: %s", adversary.served)


if __name__ == "__main__":
    asyncio.run(main())
