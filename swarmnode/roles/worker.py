"""The worker role: generates rollouts for one learner, with the learner's latest weights.

Owns the worker's jobs, in one asyncio TaskGroup, each supervised:

- ``advertise``: writes this worker's signed PeerRecord (data-plane address, measured
  rollout rate, price, hardware) under the learner's workers key in the DHT, and finds the
  learner's own record (its data-plane address);
- ``work``: while activated (and the lease holds), generates a batch with the newest
  weights it has, optionally throttled (``worker.slowdown``: simulated slower hardware),
  and sends it to the learner; the learner's answer names its current version, and a
  newer version starts a weight fetch;
- ``weights``: fetches a published version through the pipelined broadcast
  (``workers.weights``) and swaps it in between batches, atomically;
- ``serve``: the local HTTP API.

The learner's Activate / Deactivate arrive on the data plane and are obeyed only when
signed by the learner this worker was started for.
Must not: train, or send rollouts made with weights it did not verify.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from swarmnode import __version__
from swarmnode.activation.records import (
    learner_key,
    peer_address,
    publish_record,
    read_records,
    workers_key,
)
from swarmnode.broadcast.adapter import BaseWeights
from swarmnode.broadcast.weights import WeightReceiver
from swarmnode.config import Config
from swarmnode.errors import ConfigError, EngineUnavailable
from swarmnode.home import NodeHome
from swarmnode.identity import load_or_create_identity
from swarmnode.net.dataplane import DataPlane, DataPlaneError, PeerRefused
from swarmnode.net.hivemind_runtime import HivemindRuntime
from swarmnode.ops.dashboard import CounterHistory, Dashboard, Section, fmt, key_value_table, short_id
from swarmnode.ops.metrics import Metrics
from swarmnode.ops.supervise import run_jobs
from swarmnode.roles.common import (
    api_job,
    build_mixture,
    build_policy,
    configure_threads,
    model_family,
    role_engine,
)
from swarmnode.roles.convert import worker_batch
from swarmnode.rollout import SamplingParams
from swarmnode.rollout.keyed import SamplingKeys
from swarmnode.tasks import score_completion
from swarmnode.train import ScoredGroup
from swarmnode.wire import (
    Activate,
    Capabilities,
    Deactivate,
    Envelope,
    Heartbeat,
    Kind,
    PeerRecord,
    Role,
    encode_envelope,
    seal,
    to_ms,
)

log = logging.getLogger(__name__)
SEND_TIMEOUT = 30.0
RECORD_TTL = 30.0
ADVERTISE_SECONDS = 5.0
OFFER_TIMEOUT = 5.0


class WorkerNode:
    def __init__(self, config: Config, home: NodeHome, *, max_batches: int | None = None) -> None:
        if not config.worker.learner:
            raise ConfigError("a worker needs its learner's peer id: --learner PEER_ID (worker.learner)")
        self.config = config
        self.home = home.ensure()
        self.max_batches = max_batches
        self.metrics = Metrics()
        self.started_at = time.time()
        self.stop = asyncio.Event()
        self.learner_id = config.worker.learner
        # From the learner's DHT record, else worker.learner_address (a stuffed key cannot hide it).
        self.learner_address: str | None = config.worker.learner_address or None
        self.learner_record: PeerRecord | None = None
        self.lease_until = 0.0
        self.target_rate = 0.0
        self.wake = asyncio.Event()
        self.batches_sent = 0
        self.completions_sent = 0
        self.sent_over_time = CounterHistory()  # completions sent and the rate, per batch (minutes)
        self.rate = 0.0  # measured completions per second (throttle included), EWMA
        self.learner_version: int | None = None
        self.deactivated_reason = ""

    def _build(self) -> None:
        configure_threads(self.config)
        self.identity = load_or_create_identity(self.home.identity_key)
        self.mixture = build_mixture(self.config)
        # The model skeleton and tokenizer; weights come from the learner before any generation.
        self.policy = build_policy(self.config, self.home, self.mixture)
        self.policy.version = -1
        # The base adapter versions are added to (a learner training LoRA broadcasts the adapter
        # alone): its hash taken now, while the model holds what was loaded.
        self.base = BaseWeights(self.policy.model)
        self.base.hash  # noqa: B018
        self.engine = role_engine(self.config, self.policy)
        import torch

        self.generator = torch.Generator().manual_seed(self.config.node.seed)
        self.sampling_seed: bytes | None = None  # the learner's keyed-sampling seed, from its Activate
        self.activate_sent_ms = -1  # the newest Activate taken (its envelope's sent_at_ms)
        self.keyed_warned = False
        self._calibrate()

    def _calibrate(self) -> None:
        """Measure the rollout rate before any learner asks: one batch with the skeleton's weights
        (speed does not depend on their values), slowed as configured. Learners plan on this
        advertised rate until they measure the worker's deliveries themselves."""
        self._generate(0)  # the first batch pays one-off start-up costs
        _, groups, seconds = self._generate(0)
        count = sum(g.size for g in groups)
        self.rate = count / (seconds * self.config.worker.slowdown)
        log.info(
            "measured %.1f completions/s (slowdown %.1fx); price %.2f per 1,000",
            self.rate,
            self.config.worker.slowdown,
            self.config.worker.price,
        )

    @property
    def active(self) -> bool:
        return time.time() < self.lease_until

    def status(self) -> dict[str, Any]:
        return {
            "name": self.config.node.name,
            "role": "worker",
            "version": __version__,
            "peer_id": self.identity.peer_id,
            "learner": self.learner_id,
            "learner_address": self.learner_address,
            "dataplane": self.dataplane.address,
            "uptime_s": round(time.time() - self.started_at, 1),
            "active": self.active,
            "lease_left_s": max(0.0, round(self.lease_until - time.time(), 1)),
            "target_rate": self.target_rate,
            "deactivated_reason": self.deactivated_reason,
            "policy_version": self.policy.version,
            "learner_version": self.learner_version,
            "rollout_rate": self.rate,
            "price": self.config.worker.price,
            "slowdown": self.config.worker.slowdown,
            "batches_sent": self.batches_sent,
            "completions_sent": self.completions_sent,
            "weights": self.weights.status(),
            "metrics": self.metrics.snapshot(),
        }

    async def dashboard(self) -> Dashboard:
        """The worker's page: activation, the weights it holds and receives, what it sent."""
        weights = self.weights.status()
        receive = {k: v for k, v in weights.items() if k not in ("stats", "blamed")}
        receive.update({f"chunks {k}": v for k, v in (weights.get("stats") or {}).items()})
        blamed = collections.Counter(weights["blamed"])  # one entry per peer ever blamed: unbounded
        top = blamed.most_common(8)
        receive["chunk senders blamed"] = ", ".join(f"{short_id(p)} {n}" for p, n in top) or "-"
        if len(blamed) > 8:
            receive["chunk senders blamed"] += f" and {len(blamed) - 8} more"
        left = max(0.0, self.lease_until - time.time())
        return Dashboard(
            f"swarmnode · {self.config.node.name}",
            "worker",
            cards=[
                ("state", "active" if self.active else "idle"),
                ("policy version", fmt(self.policy.version)),
                ("learner's version", fmt(self.learner_version)),
                (
                    "receiving",
                    f"v{weights['receiving'][0]}: {weights['chunks_received']} chunks"
                    if weights["receiving"]
                    else "no",
                ),
                ("rate (/s)", fmt(self.rate, 3)),
                ("completions sent", fmt(self.completions_sent)),
                ("lease left (s)", fmt(round(left, 1))),
            ],
            sections=[
                Section(
                    "Rollouts",
                    charts=[self.sent_over_time.chart("rate", "Rollout rate", "minutes", "completions/s")],
                    text=f"deactivated: {self.deactivated_reason}" if self.deactivated_reason else "",
                ),
                Section("Weights", tables=[key_value_table("weights", "Weight broadcast", receive)]),
            ],
            links=[("status JSON", "/status"), ("metrics", "/metrics")],
        )

    # ------------------------------------------------------------------ control

    async def _on_activate(self, sender: str, envelope: Envelope, message: object) -> Heartbeat:
        if (
            not isinstance(message, Activate)
            or sender != self.learner_id
            or message.worker_peer_id != self.identity.peer_id
        ):
            self.metrics.inc("control_refused", "Control messages refused")
            return self._heartbeat()
        if envelope.sent_at_ms <= self.activate_sent_ms:
            # Not newer than the last one taken: a replay (the data plane is plain TCP) would set an
            # old seed, or none, and our next batches would fail the learner's token checks.
            self.metrics.inc("control_refused", "Control messages refused")
            return self._heartbeat()
        self.activate_sent_ms = envelope.sent_at_ms
        self.lease_until = time.time() + message.lease_seconds
        self.target_rate = message.target_rate
        self.sampling_seed = message.sampling_seed or None
        self.deactivated_reason = ""
        self._learner_at(message.policy_version)
        log.info(
            "activated by %s: %.2f completions/s for %d s", sender, message.target_rate, message.lease_seconds
        )
        self.wake.set()
        return self._heartbeat()

    async def _on_deactivate(self, sender: str, envelope: Envelope, message: object) -> Heartbeat:
        if (
            isinstance(message, Deactivate)
            and sender == self.learner_id
            and message.worker_peer_id == self.identity.peer_id
        ):
            self.lease_until = 0.0
            self.deactivated_reason = message.reason
            log.info("deactivated by the learner: %s", message.reason or "(no reason)")
        return self._heartbeat()

    def _heartbeat(self) -> Heartbeat:
        return Heartbeat(
            round=self.batches_sent,
            model_id=self.policy.model_id,
            policy_version=max(self.policy.version, 0),
            rollout_rate=self.rate,
        )

    def _learner_at(self, version: int) -> None:
        self.learner_version = version  # the learner sends the manifest itself (workers.weights)

    # ------------------------------------------------------------------ jobs

    async def _advertise(self) -> None:
        while True:
            now = time.time()
            for record in await read_records(self.runtime, learner_key("default", self.learner_id)):
                if record.peer_id == self.learner_id and (record.addresses or record.libp2p_peer_id):
                    address = peer_address(record)
                    if self.learner_address != address:
                        log.info("learner %s at %s", self.learner_id, address)
                    self.learner_address, self.learner_record = address, record
            peers = {
                r.peer_id: peer_address(r)
                for r in await read_records(self.runtime, workers_key("default", self.learner_id))
                if (r.addresses or r.libp2p_peer_id) and r.peer_id != self.identity.peer_id
            }
            if self.learner_address is not None:
                peers[self.learner_id] = self.learner_address
            self.weights.set_peers(peers)
            # One signed envelope: stored in the DHT and handed to the learner as it is.
            envelope = seal(self.identity, self.own_record(), to_ms(now))
            key = workers_key("default", self.learner_id)
            await publish_record(self.runtime, key, encode_envelope(envelope), RECORD_TTL)
            await self._offer_directly(envelope)
            await asyncio.sleep(ADVERTISE_SECONDS)

    def own_record(self) -> PeerRecord:
        """This worker's offer: where to reach it, what it runs, its measured rate and its price."""
        return PeerRecord(
            peer_id=self.identity.peer_id,
            libp2p_peer_id=self.runtime.peer_id,
            addresses=(self.config.dataplane.advertise or self.dataplane.address,),
            roles=(Role.WORKER,),
            model_family=model_family(self.policy),
            model_id=self.policy.model_id,
            capabilities=Capabilities(
                rollout_rate=self.rate,
                price=self.config.worker.price,
                hardware=self.config.worker.hardware or f"cpu:{os.cpu_count()}",
                software_version=f"swarmnode/{__version__}",
            ),
        )

    async def _offer_directly(self, envelope: Envelope) -> None:
        """Hand the same signed offer to the learner's data plane: the DHT key can be filled by
        Sybils, the learner's per-network table cannot (workers.offers)."""
        if self.learner_address is None:
            return
        learner = self.learner_record
        addresses = learner.addresses if learner is not None else (self.learner_address,)
        libp2p_id = learner.libp2p_peer_id if learner is not None else None
        try:
            await self.dataplane.request_peer(
                addresses,
                libp2p_id,
                None,
                envelope=envelope,
                timeout=OFFER_TIMEOUT,
                expect_peer=self.learner_id,
            )
        except PeerRefused as e:
            self.metrics.inc("offer_refused", "Direct offers the learner refused", reason=e.reason)
            log.info("learner %s did not keep our offer: %s", self.learner_id, e)
        except DataPlaneError as e:
            self.metrics.inc("offer_failed", "Direct offers that did not reach the learner")
            log.debug("could not hand our offer to learner %s: %s", self.learner_id, e)

    def _generate(self, index: int) -> tuple[int, list[ScoredGroup], float]:
        """(the version generated with, its groups, seconds): under the model lock, in a thread."""
        version = self.policy.version
        r = self.config.rollout
        tasks = self.mixture.sample(index, r.prompts_per_round)
        t0 = time.perf_counter()
        params = SamplingParams(temperature=r.temperature, top_p=r.top_p, max_new_tokens=r.max_new_tokens)
        prompts = [t.prompt for t in tasks]
        seed = self.sampling_seed
        if seed is None:
            result = self.engine.generate(prompts, r.group_size, params, self.generator)
        else:  # the learner checks our tokens against keyed sampling (protocol/SPEC.md 1.8)
            keys = SamplingKeys(seed, tuple(t.id.key() for t in tasks))
            try:
                result = self.engine.generate(prompts, r.group_size, params, self.generator, keys=keys)
            except EngineUnavailable as exc:
                # Sampled otherwise, our groups fail the learner's token checks: say why, loudly.
                if not self.keyed_warned:
                    log.error("the learner asks for keyed sampling, which this engine cannot do: %s", exc)
                    self.keyed_warned = True
                result = self.engine.generate(prompts, r.group_size, params, self.generator)
        groups = [
            ScoredGroup(
                task=task,
                prompt_ids=list(prompt_ids),
                completion_ids=[list(c.token_ids) for c in completions],
                behaviour_logprobs=[list(c.logprobs) for c in completions],
                texts=[c.text for c in completions],
                rewards=[score_completion(task, c.text) for c in completions],
                policy_version=result.policy_version,
            )
            for task, prompt_ids, completions in zip(
                tasks, result.prompt_ids, result.completions, strict=True
            )
        ]
        return version, groups, time.perf_counter() - t0

    async def _work(self) -> None:
        index = 0
        while True:
            behind = self.learner_version is not None and (
                self.learner_version - self.policy.version > self.config.swarm.staleness_bound
            )
            # Weights more than S versions behind the learner's: everything generated now would be
            # dropped as stale (and paid for); wait for the newer version instead.
            ready = (
                self.active and self.learner_address is not None and self.policy.version >= 0 and not behind
            )
            if not ready:
                self.wake.clear()
                try:
                    await asyncio.wait_for(self.wake.wait(), timeout=1.0)
                except TimeoutError:
                    pass
                continue
            index += 1
            # Generation and weight swaps share the model: the receiver swaps only between batches.
            seed = self.config.node.seed * 1_000_003 + index
            version, groups, seconds = await self.weights.model_lock.run(self._generate, seed)
            slow = self.config.worker.slowdown
            if slow > 1.0:
                await asyncio.sleep((slow - 1.0) * seconds)  # simulated slower hardware
            count = sum(g.size for g in groups)
            batch = worker_batch(
                groups,
                self.policy.model_id,
                version,
                index,
                system_prompt_sha256=self.policy.system_prompt_sha256,
            )
            data = seal(self.identity, batch, to_ms(time.time()))
            assert self.learner_address is not None
            try:
                reply = await self.dataplane.request(
                    self.learner_address,
                    None,
                    envelope=data,
                    timeout=SEND_TIMEOUT,
                    expect_peer=self.learner_id,
                )
            except DataPlaneError as e:
                log.warning("could not deliver a batch to the learner: %s", e)
                self.metrics.inc("batches_failed", "Batches the learner did not take")
                await asyncio.sleep(1.0)
                continue
            # The advertised rate is capacity: generation time (slowdown included), not time spent
            # sending or waiting. A rate that counted waits could only ever go down (a learner that
            # plans on it asks for less, and the worker then waits more).
            capacity = count / (seconds * max(slow, 1.0))
            self.rate = 0.7 * self.rate + 0.3 * capacity if self.rate > 0 else capacity
            self.batches_sent += 1
            self.completions_sent += count
            self.sent_over_time.add(
                (time.time() - self.started_at) / 60,
                {"completions/s": self.rate, "target/s": self.target_rate},
            )
            self.metrics.inc("completions_sent", "Completions sent to the learner", count)
            self.metrics.set("rollout_rate", "Measured completions per second", self.rate)
            if isinstance(reply, Heartbeat):
                self._learner_at(reply.policy_version)
            if self.max_batches is not None and self.batches_sent >= self.max_batches:
                self.stop.set()
                return

    async def run(self, runtime_factory: Callable[[], Any]) -> None:
        await asyncio.to_thread(self._build)
        dp = self.config.dataplane
        self.dataplane = DataPlane(
            self.identity, host=dp.host, port=dp.port, upload_rate=dp.upload_rate or None
        )
        self.dataplane.register(Kind.ACTIVATE, self._on_activate)
        self.dataplane.register(Kind.DEACTIVATE, self._on_deactivate)
        await self.dataplane.start()
        self.weights = WeightReceiver(
            self.identity,
            self.dataplane,
            self.policy,
            self.engine,
            self.metrics,
            learner_id=self.learner_id,
            staleness_bound=self.config.swarm.staleness_bound,
            base=self.base,
        )
        await self.weights.start()
        try:
            self.runtime: HivemindRuntime = await runtime_factory()
            # Peers that cannot dial our TCP address reach us over hivemind streams instead.
            await self.dataplane.attach_fallback(self.runtime)
            try:
                jobs = {
                    "advertise": self._advertise,
                    "work": self._work,
                    "serve": api_job(self),
                }
                await run_jobs(jobs, self.metrics, self.stop)
            finally:
                await self.runtime.stop()
        finally:
            await self.weights.close()
            await self.dataplane.close()
