"""The node daemon: one asyncio TaskGroup running generate, exchange, train and serve.

Each job is supervised (``swarmnode.ops.supervise``). Torch work (generation,
training, evaluation) runs in worker threads behind one lock, so the event loop
keeps serving peers and the API while a step runs, and a slow peer never stalls
generation: training takes whatever admitted external groups are in the pool
when its turn comes.

Rounds are wall-clock epochs (``swarm.round_seconds``): at the start of swarm
round r a node generates its groups and publishes them; at ``TRAIN_AT`` of the
round it trains on its own groups plus the external groups admitted so far.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import operator
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from swarmnode import __version__
from swarmnode.admit import AdmissionConfig, AdmissionPipeline, task_families
from swarmnode.config import Config
from swarmnode.core.rounds import round_at, round_start
from swarmnode.errors import ConfigError
from swarmnode.gossip.core import GossipConfig, GossipCore, longest_relay_round
from swarmnode.gossip.driver import GossipDriver
from swarmnode.gossip.intake import ExternalPool
from swarmnode.home import NodeHome
from swarmnode.identity import NodeIdentity, load_or_create_identity
from swarmnode.net.config import NetConfig
from swarmnode.net.hivemind_runtime import HivemindRuntime
from swarmnode.ops.dashboard import (
    MAX_ROWS,
    Chart,
    CounterHistory,
    Dashboard,
    LedgerRounds,
    PeerRow,
    ago,
    fmt,
    trainer_dashboard,
)
from swarmnode.ops.metrics import Metrics
from swarmnode.ops.supervise import run_jobs, stop_on_signals
from swarmnode.policy.lock import ModelLock
from swarmnode.roles.common import (
    api_job,
    build_mixture,
    build_policy,
    configure_threads,
    net_config,
    role_engine,
    verifier_gauges,
)
from swarmnode.roles.convert import rollout_batch, to_scored, trained_texts
from swarmnode.store import CheckpointStore, Ledger, LedgerError
from swarmnode.train import RoundMetrics, ScoredGroup, Trainer
from swarmnode.verify import VerifierPool
from swarmnode.wire import encode_envelope, seal, to_ms

log = logging.getLogger(__name__)

TRAIN_AT = 0.8  # fraction of a swarm round at which a node trains (leaves time for peers' groups)


@dataclass
class OwnRound:
    swarm_round: int
    groups: list[ScoredGroup]
    tokens: int
    seconds: float
    started: float


def check_relaying(config: Config) -> None:
    """``swarm.relay`` with rounds too long for admission's age window relays nothing: refused at
    start, naming both keys (red team rt72 F-C)."""
    s = config.swarm
    if not s.relay:
        return
    max_age = AdmissionConfig(allowed_tasks=None).max_age_s
    longest = longest_relay_round(GossipConfig(round_seconds=s.round_seconds), max_age)
    if s.round_seconds > longest:
        raise ConfigError(
            f"swarm.relay needs swarm.round_seconds <= {longest:.1f} (got {s.round_seconds:g}): a relayed "
            "batch is served for 3 rounds and must still be younger than admission's age window "
            "when its last reader judges it"
        )


class SwarmNode:
    def __init__(self, config: Config, home: NodeHome, *, max_rounds: int | None = None) -> None:
        check_relaying(config)
        self.config = config
        self.home = home.ensure()
        self.max_rounds = max_rounds
        self.metrics = Metrics()
        self.model_lock = ModelLock()  # generate, train, evaluate and checkpoint: one at a time
        self.started_at = time.time()
        self.last: RoundMetrics | None = None
        self.first_reward: float | None = None
        self.heldout: float | None = None
        self.heldout_by_family: dict[str, float] = {}
        self.heldout_first_by_family: dict[str, float] = {}  # at the start of this run
        self.rounds_done_here = 0
        self.stop = asyncio.Event()
        self.verdicts_over_rounds = CounterHistory()  # admission verdicts by reason, after each round

    # ------------------------------------------------------------------ helpers

    def status(self) -> dict[str, Any]:
        last = self.last
        return {
            "name": self.config.node.name,
            "version": __version__,
            "peer_id": self.identity.peer_id,
            "libp2p_peer_id": self.runtime.peer_id if self.runtime.is_running else None,
            "maddrs": self.runtime.visible_maddrs if self.runtime.is_running else [],
            "uptime_s": round(time.time() - self.started_at, 1),
            "swarm_round": round_at(time.time(), self.config.swarm.round_seconds),
            "rounds": self.trainer.round,
            "rounds_this_run": self.rounds_done_here,
            "policy_version": self.trainer.policy.version,
            "mixing": self.config.swarm.mixing,
            "reward_first": self.first_reward,
            "reward_last": last.mean_reward if last else None,
            "accuracy_last": last.accuracy if last else None,
            "heldout_accuracy": self.heldout,
            "heldout_by_family": self.heldout_by_family,
            "heldout_first_by_family": self.heldout_first_by_family,
            "tokens_per_s": last.tokens_per_second if last else None,
            "loss_last": None if last is None or math.isnan(last.loss) else last.loss,
            "external_pool": len(self.pool),
            "peers": self.runtime.dht_peer_count() if self.runtime.is_running else 0,
            "gossip": self.core.stats.as_dict(),
            "admission": dict(self.admission.counts()),
            "verifier": {**self.verifier.stats(), **self.verifier.isolation()},
            "admission_cpu_s": round(self.driver.intake.cpu_seconds, 3),
            "external_by_sender": self.driver.sender_tallies(),
            "metrics": self.metrics.snapshot(),
        }

    async def dashboard(self) -> Dashboard:
        """The node's page (``ops.dashboard``): learning curves from the ledger, peers, intake."""
        now = time.time()
        tallies = self.driver.sender_tallies()
        # One C-level copy: the admission thread inserts into this dict while we read it.
        active = {p: until for p, until in dict(self.admission.peers.bans).items() if until > now}
        # Rows for a bounded set of peers: tallied signers, the most recently banned, and the
        # ledger's most rejected (a flood of banned transport ids must not cost the loop per id).
        bans = {p: active[p] for p in tallies if p in active}
        bans.update(heapq.nlargest(MAX_ROWS, active.items(), key=operator.itemgetter(1)))
        learning, rejections = await asyncio.to_thread(self._ledger_view, [*tallies, *bans])
        bans.update((p, active[p]) for p in rejections if p in active)
        rows = []
        for peer in {*tallies, *rejections, *bans}:
            tally = tallies.get(peer, {})
            rows.append(
                PeerRow(
                    peer,
                    score=self.admission.peers.score(peer),
                    received=int(tally.get("groups", 0) + tally.get("refused_batches", 0)),
                    admitted=int(tally.get("groups", 0)),
                    used=int(tally.get("used", 0)),
                    replayed=int(tally.get("replayed", 0)),
                    rejections=rejections.get(peer, {}),
                    banned_until=bans.get(peer),
                    last_seen=tally.get("last_seen") or None,
                )
            )
        families = self.heldout_by_family
        first = self.heldout_first_by_family
        text = (
            "held-out by family (start -> now): "
            + ", ".join(f"{f} {fmt(first.get(f), 2)} -> {fmt(v, 2)}" for f, v in families.items())
            if families
            else ""
        )
        replay = self.admission.replay
        intake = {
            "external pool (groups waiting)": len(self.pool),
            "replay cache (ids remembered)": f"{len(replay):,} of {replay.capacity:,}",
            "admission CPU (s)": round(self.driver.intake.cpu_seconds, 3),
            "banned peers now": len(bans),
            **{f"verifier {k}": v for k, v in self.verifier.stats().items()},
            **{f"verifier {k}": v for k, v in self.verifier.isolation().items()},
        }
        return trainer_dashboard(
            f"swarmnode · {self.config.node.name}",
            [
                ("rounds", fmt(self.trainer.round)),
                ("policy version", fmt(self.trainer.policy.version)),
                ("held-out accuracy", fmt(self.heldout, 3)),
                ("reward (last round)", fmt(self.last.mean_reward if self.last else None, 3)),
                ("sharing rule", self.config.swarm.mixing),
                ("DHT peers", fmt(self.runtime.dht_peer_count() if self.runtime.is_running else 0)),
                ("peers' groups admitted", fmt(sum(int(t.get("groups", 0)) for t in tallies.values()))),
                ("up", ago(self.started_at, now).replace(" ago", "")),
            ],
            learning,
            rows,
            self.verdicts_over_rounds,
            intake,
            now,
            note=text,
            more_banned=len(active) - len(bans),
        )

    def _ledger_view(self, peers: Sequence[str] = ()) -> tuple[list[Chart], dict[str, dict[str, int]]]:
        """The ledger's curves and per-peer rejection counts: of the most rejected peers and of
        ``peers`` (those shown anyway), so others' floods cannot push a shown peer's record out
        (in a thread: SQLite)."""
        return self.ledger_rounds.charts(), self.ledger.rejections_by_peer_and_reason(MAX_ROWS, peers)

    def _update_gauges(self, m: RoundMetrics) -> None:
        g = self.metrics
        g.inc("rounds", "Training rounds completed")
        g.set("reward", "Mean reward of own completions, last round", m.mean_reward)
        g.set("accuracy", "Share of own completions with reward 1, last round", m.accuracy)
        g.set("tokens_per_second", "Generation throughput, last round", m.tokens_per_second)
        g.set("policy_version", "Policy version", m.policy_version)
        g.inc("groups_used", "Groups trained on", m.groups_used, source="own")
        g.inc("groups_used", "Groups trained on", m.external_used, source="external")
        if m.heldout_accuracy is not None:
            g.set("heldout_accuracy", "Greedy accuracy on the held-out set", m.heldout_accuracy)
        for family, value in m.heldout_by_family.items():
            g.set("heldout_family_accuracy", "Greedy held-out accuracy per task family", value, family=family)
        verifier_gauges(g, self.verifier)
        if self.runtime.is_running:
            g.set("peers", "Peers in the DHT routing table", self.runtime.dht_peer_count())

    # ------------------------------------------------------------------ set-up

    def _build_torch_side(self) -> None:
        configure_threads(self.config)
        self.identity: NodeIdentity = load_or_create_identity(self.home.identity_key)
        self.mixture = build_mixture(self.config)
        policy = build_policy(self.config, self.home, self.mixture)
        self.ledger = Ledger(self.home.ledger)
        self.ledger_rounds = LedgerRounds(self.ledger)
        self.trainer = Trainer(
            self.config,
            policy,
            role_engine(self.config, policy),
            self.mixture,
            self.ledger,
            CheckpointStore(self.home.checkpoints, self.config.checkpoint.keep),
        )
        self.trainer.node_id = self.identity.peer_id
        self.trainer.resume()
        self.verifier = VerifierPool.from_config(self.config.verify, task_families(self.mixture))
        self.verifier.start()
        self.trainer.score_groups = self.verifier.score  # own rollouts: the same boundary as a peer's

    def _net_config(self) -> NetConfig:
        return net_config(self.config, self.home)

    # ------------------------------------------------------------------ jobs

    def _generate_for(self, swarm_round: int) -> tuple[list[ScoredGroup], int, float]:
        """Own groups for a swarm round. Tasks and sampling noise are keyed by the swarm round
        (which only moves forward), so a round redone after a restart yields new rollouts rather
        than byte-identical ones that peers would refuse as duplicates; with a shared
        ``tasks.seed`` every node also answers the same prompts that round (HACPO)."""
        self.trainer.generator.manual_seed(hash((self.config.node.seed, swarm_round)) & 0x7FFF_FFFF_FFFF)
        return self.trainer.generate_groups(swarm_round)

    async def _generate(self) -> None:
        rs = self.config.swarm.round_seconds
        last_round = -1
        while True:
            now = time.time()
            r = round_at(now, rs)
            if r <= last_round:
                await asyncio.sleep(max(0.01, round_start(last_round + 1, rs) - now))
                continue
            started = time.time()
            groups, tokens, seconds = await self.model_lock.run(self._generate_for, r)
            policy = self.trainer.policy
            batch = rollout_batch(
                groups, policy.model_id, policy.version, r, system_prompt_sha256=policy.system_prompt_sha256
            )
            data = encode_envelope(seal(self.identity, batch, to_ms(time.time())))
            self.driver.publish(data)
            self.metrics.inc("groups_published", "Own groups published", len(groups))
            await self.own_rounds.put(OwnRound(r, groups, tokens, seconds, started))
            last_round = r

    async def _train(self) -> None:
        rs = self.config.swarm.round_seconds
        while True:
            own = await self.own_rounds.get()
            train_at = round_start(own.swarm_round, rs) + TRAIN_AT * rs
            await asyncio.sleep(max(0.0, train_at - time.time()))
            now_round = round_at(time.time(), rs)
            external = self.pool.take_all(now_round) if self.config.swarm.mixing != "none" else []
            metrics = await self.model_lock.run(
                self.trainer.train_round,
                own.groups,
                external,
                tokens=own.tokens,
                gen_seconds=own.seconds,
                started=own.started,
            )
            # No admission.set_policy_version here: peers' groups carry *their* policy versions,
            # counters of independent learners that share our base model's id, so comparing them
            # with ours refused honest peers (stale_policy) as soon as one node was a round
            # ahead or behind (measured after a restart: tests/swarm/test_node_restart.py).
            # The staleness bound is for rollouts of our own policy (learner/worker mode).
            self.last = metrics
            self.driver.count_used(self.trainer.last_external_sources, self.trainer.last_replayed_sources)
            self.verdicts_over_rounds.add(metrics.round, self.admission.counts())
            self.first_reward = metrics.mean_reward if self.first_reward is None else self.first_reward
            if metrics.heldout_accuracy is not None:
                self.heldout = metrics.heldout_accuracy
                self.heldout_by_family = metrics.heldout_by_family
            self.rounds_done_here += 1
            self._save_standing()
            self._update_gauges(metrics)
            log.info(
                "round %d: reward %.3f, external used %d, pool %d",
                metrics.round,
                metrics.mean_reward,
                metrics.external_used,
                len(self.pool),
            )
            if self.max_rounds is not None and self.rounds_done_here >= self.max_rounds:
                self.stop.set()
                return

    # ------------------------------------------------------------------ run

    async def run(self) -> None:
        await asyncio.to_thread(self._build_torch_side)
        self.heldout = await self.model_lock.run(self.trainer.evaluate) if self.trainer.heldout else None
        self.heldout_by_family = dict(self.trainer.heldout_by_family)
        self.heldout_first_by_family = self.heldout_by_family
        try:
            if self.stop.is_set():  # asked to stop during start-up
                return
            self.runtime = await HivemindRuntime.create(self._net_config())
            try:
                if not self.stop.is_set():
                    await self._run_jobs()
            finally:
                await self.runtime.stop()
        finally:
            # Wait for a step in flight (the lock); keep the work only if no round was cut short.
            await self.model_lock.run(self.trainer.save_checkpoint_if_consistent)
            self.verifier.close()
            self.ledger.close()

    async def _run_jobs(self) -> None:
        s = self.config.swarm
        self.pool = ExternalPool()
        self.own_rounds: asyncio.Queue[OwnRound] = asyncio.Queue(maxsize=1)
        policy, max_new = self.trainer.policy, self.config.rollout.max_new_tokens
        self.admission = AdmissionPipeline(
            AdmissionConfig(
                allowed_tasks=task_families(self.mixture),
                system_prompt_sha256=policy.system_prompt_sha256,
                max_policy_lag=s.staleness_bound,
                local_peer_id=self.identity.peer_id,
            ),
            now=time.time(),
            ledger=self.ledger,
            score_groups=self.verifier.score,
            render=lambda texts: trained_texts(policy, texts, max_new),
        )
        # No digest_of: the driver takes each pulled item's digest from its payload's one decode
        # (gossip.intake.decode_pulled), so a second decode by the core could never disagree.
        self.core = GossipCore(
            GossipConfig(
                round_seconds=s.round_seconds,
                read_interval=max(0.5, min(5.0, s.round_seconds / 4)),
                round_demand=s.round_demand,
                announce_buckets=s.announce_buckets,
                read_buckets=min(s.read_buckets, s.announce_buckets),
                relay=s.relay,
            ),
            self.runtime.peer_id,
            selection_key=os.urandom(32),  # the demand-driven draw's secret (core.demand)
        )
        restored = self.core.restore_standing(self.ledger.standing(), time.time())
        self._saved_standing: list[tuple[str, int]] | None = None  # last written (``_save_standing``)
        if restored:
            log.info("gossip: %d peers proven here before the restart are proven again", restored)
        self.driver = GossipDriver(
            self.core,
            self.runtime,
            self.admission,
            self.pool,
            lambda admitted: to_scored(admitted, self.trainer.policy, max_new),
            self.metrics,
            swarm="default",
        )
        await self.driver.start()
        log.info(
            "node %s (libp2p %s) listening on %s",
            self.identity.peer_id,
            self.runtime.peer_id,
            ", ".join(self.runtime.visible_maddrs),
        )
        jobs = {
            "generate": self._generate,
            "train": self._train,
            "exchange": self.driver.run,
            "serve": api_job(self),
        }
        try:
            await run_jobs(jobs, self.metrics, self.stop)
        finally:
            self._save_standing()

    def _save_standing(self) -> None:
        """Keep the gossip core's proven peers in the ledger (restored at the next start); written
        only when they changed since the last save (a transaction a round otherwise)."""
        standing = self.core.standing()
        if standing == self._saved_standing:
            return
        try:
            self.ledger.save_standing(standing)
        except LedgerError as exc:  # a full disk must not end the node: the next round tries again
            log.warning("gossip: peer standing not saved: %s", exc)
            return
        self._saved_standing = standing


def run_node(
    config: Config, home: NodeHome, *, max_rounds: int | None = None, max_seconds: float | None = None
) -> None:
    """Run a node until SIGINT/SIGTERM (or ``max_rounds`` / ``max_seconds``); then stop cleanly.

    A first signal stops after the round in progress; a second one aborts at once (the last
    checkpoint stays the resume point)."""
    node = SwarmNode(config, home, max_rounds=max_rounds)

    async def main() -> None:
        stop_on_signals(node.stop, max_seconds=max_seconds)
        await node.run()

    torch.set_grad_enabled(True)
    asyncio.run(main())
