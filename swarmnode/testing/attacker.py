"""An attacking swarm peer that runs timed scenarios, one fresh libp2p identity each.

Run as ``python -m swarmnode.testing.attacker --home DIR --peer BOOTSTRAP --round-seconds S
--window W --scenarios baseline,forged_signature,...``. Built on ``swarmnode.testing.adversary``
(its item builders and pull server). Each scenario lasts ``window`` seconds with a new
``HivemindRuntime`` (throwaway identity), so a ban earned in one never masks the next; the
attacker writes ``DIR/timeline.json`` (per scenario: start, end, libp2p id, what it sent),
from which ``swarmnode.testing.adversarial`` reads the honest nodes' admission logs.

Scenarios (every round of the window unless said otherwise):

``baseline``          no attacker at all (the honest throughput reference).
``forged_signature``  4 rollout envelopes whose signature is flipped.
``replay``            honest envelopes pulled from the swarm, announced again as ours.
``prompt_mismatch``   4 signed groups whose prompt is another task's.
``inflated_reward``   4 signed groups claiming reward 1 for wrong answers (valid otherwise:
                      accepted, but with our verifier's rewards; poison = claimed rewards used).
``oversized``         2 over-limit envelopes + 1 malformed one; and a 4 KiB pull request
                      (limit 2 KiB) to each honest peer.
``slow_loris``        24 streams to each honest peer's pull handler (it serves 16 at once),
                      each sending one byte every 2 s and never finishing; reopened when closed.
``sybil_flood``       8 fresh Ed25519 signers, each with one prompt-mismatched group.
``dht_spam``          40 announcement records of 64 random digests each, for this round and
                      the next two (7,680 fake digests a round), never served.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

from hivemind.p2p import P2PDaemonError, P2PHandlerError, PeerID

from swarmnode.gossip.driver import MAX_PULL_REQUEST, PULL_HANDLER, announcement_key
from swarmnode.identity import NodeIdentity
from swarmnode.net.config import NetConfig
from swarmnode.net.errors import NetError, PeerCallError
from swarmnode.net.hivemind_runtime import HivemindRuntime
from swarmnode.tasks import default_mixture
from swarmnode.testing.adversary import MALFORMED, OVERSIZED, Adversary, Item, _group, write_json
from swarmnode.wire import Announce, encode_payload

log = logging.getLogger("attacker")
CALL_TIMEOUT = 10.0
STREAM_PREFIX = "swarmnode.stream."  # swarmnode.net.hivemind_runtime._STREAM_PREFIX
SCENARIOS = (
    "baseline",
    "forged_signature",
    "replay",
    "prompt_mismatch",
    "inflated_reward",
    "oversized",
    "slow_loris",
    "sybil_flood",
    "dht_spam",
)


def usable_tasks(seed: int, count: int) -> list[Any]:
    """Tasks whose answer is an integer (``swarmnode.testing.adversary._group`` needs one)."""
    out = []
    for task in default_mixture(seed).sample(0, count * 3):
        try:
            _group(task, task.prompt, 0)
        except (AssertionError, ValueError):
            continue
        out.append(task)
    return out[:count]


class Scenario:
    def __init__(self, runtime: HivemindRuntime, home: Path, round_seconds: float, tasks: list[Any]) -> None:
        self.adv = Adversary(runtime, home, round_seconds)
        self.adv.tasks = tasks
        self.runtime = runtime
        self.round_seconds = round_seconds
        self.sent: dict[str, int] = {}
        self.signers: set[str] = set()
        self._next_task = 0
        self._streams: list[asyncio.Task[None]] = []

    def _tasks(self, n: int) -> list[Any]:
        tasks = self.adv.tasks
        out = [tasks[(self._next_task + i) % len(tasks)] for i in range(n)]
        self._next_task += n
        return out

    def count(self, what: str, n: int = 1) -> None:
        self.sent[what] = self.sent.get(what, 0) + n

    async def honest_peers(self) -> list[str]:
        r = self.adv._now_round()
        peers: set[str] = set()
        for round_index in (r, r - 1):
            with contextlib.suppress(NetError, OSError):
                for record in await self.runtime.dht_get(announcement_key("default", round_index), timeout=5):
                    if record.owner != self.runtime.peer_id:
                        peers.add(record.owner)
        return sorted(peers)

    async def publish(self, items: list[Item]) -> None:
        self.adv.items = items
        if items:
            with contextlib.suppress(NetError, OSError, RuntimeError):
                await self.adv.announce(items)
        self.count("items_announced", len(items))

    # -- one round of each scenario ---------------------------------------------------------

    async def forged_signature(self) -> None:
        self.signers.add(self.adv.forger.peer_id)
        items = [
            self.adv._add(f"forged{i}", self.adv._bad_signature(t), "bad_signature")
            for i, t in enumerate(self._tasks(4))
        ]
        await self.publish(items)

    async def replay(self) -> None:
        try:
            data, _ = await self.adv.capture_honest_envelope(time.time() + self.round_seconds)
        except (TimeoutError, NetError, OSError, ValueError):
            data = None
        if data is not None:
            self._captured = [*getattr(self, "_captured", [])[-7:], data]
        items = [
            self.adv._add(f"replay{i}", d, "replay") for i, d in enumerate(getattr(self, "_captured", []))
        ]
        await self.publish(items)

    async def prompt_mismatch(self) -> None:
        self.signers.add(self.adv.main.peer_id)
        tasks = self._tasks(8)
        items = []
        for i in range(4):
            data, _ = self.adv._seal_group(self.adv.main, tasks[2 * i], prompt=tasks[2 * i + 1].prompt)
            items.append(self.adv._add(f"mismatch{i}", data, "prompt_mismatch"))
        await self.publish(items)

    async def inflated_reward(self) -> None:
        self.signers.add(self.adv.main.peer_id)
        items = []
        for i, task in enumerate(self._tasks(4)):
            data, _ = self.adv._seal_group(self.adv.main, task)
            items.append(self.adv._add(f"inflated{i}", data, "accepted"))
        await self.publish(items)

    async def oversized(self) -> None:
        items = [
            self.adv._add("oversized0", OVERSIZED, "too_large"),
            self.adv._add("oversized1", OVERSIZED + b"\x00", "too_large"),
            self.adv._add("malformed", MALFORMED, "malformed"),
        ]
        await self.publish(items)
        for peer in await self.honest_peers():
            try:
                await self.runtime.call_stream(
                    peer, PULL_HANDLER, b"\x00" * (2 * MAX_PULL_REQUEST), timeout=CALL_TIMEOUT
                )
                self.count("oversized_request_answered")
            except PeerCallError as exc:
                self.count(f"oversized_request_{exc.reason.value}")

    async def _trickle(self, peer: str) -> None:
        p2p = self.runtime._require_p2p()
        while True:
            writer = None
            try:
                _, _reader, writer = await p2p.call_binary_stream_handler(
                    PeerID.from_base58(peer), STREAM_PREFIX + PULL_HANDLER
                )
                self.count("slow_streams_opened")
                for _ in range(10_000):  # a frame header, one byte at a time, never completed
                    writer.write(b"\x00")
                    await writer.drain()
                    await asyncio.sleep(2.0)
            except (OSError, P2PDaemonError, P2PHandlerError) as exc:
                # The peer closed or refused the stream: open another.
                log.debug("slow stream to %s ended: %r", peer, exc)
                await asyncio.sleep(0.5)
            finally:
                if writer is not None:
                    writer.close()

    async def slow_loris(self) -> None:
        if not self._streams:
            for peer in await self.honest_peers():
                self._streams += [asyncio.create_task(self._trickle(peer)) for _ in range(24)]

    async def sybil_flood(self) -> None:
        tasks = self._tasks(16)
        items = []
        for i in range(8):
            signer = NodeIdentity.generate()
            self.signers.add(signer.peer_id)
            data, _ = self.adv._seal_group(signer, tasks[2 * i], prompt=tasks[2 * i + 1].prompt)
            items.append(self.adv._add(f"sybil{i}", data, "prompt_mismatch"))
        await self.publish(items)

    async def dht_spam(self) -> None:
        r = self.adv._now_round()
        stored = 0
        for round_index in (r, r + 1, r + 2):
            for part in range(40):
                digests = tuple(random.randbytes(32) for _ in range(64))
                value = encode_payload(Announce(round=round_index, rollout_digests=digests))
                with contextlib.suppress(NetError, OSError, ValueError):
                    stored += bool(
                        await self.runtime.dht_store(
                            announcement_key("default", round_index),
                            f"part{part}".encode(),
                            value,
                            self.runtime.dht_time() + 3 * self.round_seconds,
                            timeout=CALL_TIMEOUT,
                        )
                    )
        self.count("spam_records_stored", stored)
        self.count("spam_digests", stored * 64)

    async def close(self) -> None:
        for task in self._streams:
            task.cancel()
        if self._streams:
            await asyncio.wait(self._streams)


async def run_one(name: str, args: argparse.Namespace, tasks: list[Any]) -> dict[str, Any]:
    start = time.time()
    if name == "baseline":
        await asyncio.sleep(args.window)
        return {"name": name, "start": start, "end": time.time(), "libp2p": None, "signers": [], "sent": {}}
    config = NetConfig(
        identity_path=None, host_maddrs=("/ip4/127.0.0.1/tcp/0",), initial_peers=tuple(args.peer)
    )
    async with await HivemindRuntime.create(config) as runtime:
        scenario = Scenario(runtime, args.home, args.round_seconds, tasks)
        await runtime.add_stream_handler(
            PULL_HANDLER, scenario.adv.serve, max_request_bytes=MAX_PULL_REQUEST, timeout=30.0
        )
        start = time.time()  # the window starts once the attacker is up
        step = getattr(scenario, name)
        end = start + args.window
        try:
            while time.time() < end:
                began = time.time()
                await step()
                await asyncio.sleep(max(0.0, min(end, began + args.round_seconds) - time.time()))
        finally:
            await scenario.close()
        return {
            "name": name,
            "start": start,
            "end": time.time(),
            "libp2p": runtime.peer_id,
            "signers": sorted(scenario.signers),
            "sent": scenario.sent,
            "served": scenario.adv.served,
        }


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--home", type=Path, required=True)
    parser.add_argument("--peer", action="append", default=[])
    parser.add_argument("--round-seconds", type=float, required=True)
    parser.add_argument("--window", type=float, required=True)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    loop = asyncio.get_running_loop()
    current = asyncio.current_task()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: current.cancel() if current else None)
    tasks = usable_tasks(777, 400)
    timeline: list[dict[str, Any]] = []
    write_json(args.home / "ready.json", {"pid": os.getpid()})
    for name in args.scenarios.split(","):
        log.info("scenario %s", name)
        timeline.append(await run_one(name, args, tasks))
        write_json(args.home / "timeline.json", timeline)
    write_json(args.home / "done.json", {"time": time.time()})


if __name__ == "__main__":
    asyncio.run(main())
