"""The learner role: trains on rollouts from recruited workers and publishes each new version.

Owns the learner's jobs, in one asyncio TaskGroup, each supervised:

- ``recruit``: reads worker offers (signed PeerRecords in the DHT, ``activation.records``, and
  those pushed to us, ``activation.offers``) and feeds them to the activation core
  (``activation.core``, ALGORITHMS.md §5) as joins and leaves; the core's own rules decide
  re-probes, restarts and tail latencies;
- ``activation``: wakes when the core's ``next_deadline()`` says (or an event moved it) and calls
  its ``poll``, as the simulator does (``sim.activation``): leases, rate checks, re-probes;
- ``control``: sends the Activate / Deactivate messages the core decides, each in a task of the
  job's own TaskGroup, so a failed send is logged and counted, never lost;
- ``learn``: waits for B groups, drops those older than S versions (``core.staleness``),
  steps (M2PO when a group is stale, ALGORITHMS.md §4), publishes the new version through
  the weight broadcast and tells the activation core how long the step took and waited;
- ``serve``: the local HTTP API (/status shows the plan: active set, predicted and
  measured utilization, cost per step; /metrics the same as gauges).

Rollouts arrive on the data plane (``net.dataplane``) as signed RolloutBatch envelopes:
only from an active worker, through the same admission pipeline as gossip (signature,
replay, freshness, task re-derivation, re-scoring), then converted with the worker's
tokens and log-probs (``workers.convert``). A sample is spot-checked: the learner
re-computes the log-probs of some tokens under the version the worker claims and
compares (``core.spotcheck``); a worker that misreports is penalized and deactivated.

Must not: generate rollouts (workers do) or read the clock inside a core (cores get ``now``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from swarmnode import __version__
from swarmnode.activation import core as act
from swarmnode.activation.offers import DirectOffers
from swarmnode.activation.records import (
    learner_key,
    newest,
    peer_address,
    publish_record,
    read_signed_records,
    signed_record,
    workers_key,
)
from swarmnode.admit import AdmissionConfig, AdmissionPipeline, Rejected, RejectReason, task_families
from swarmnode.admit.intake import Intake
from swarmnode.admit.recompute import GroupScan, scan_group, tokens_at
from swarmnode.admit.spotcheck import Judgement, SpotCheckConfig, SpotChecker, SpotCheckRequest, judge
from swarmnode.admit.staleness import StalenessGate
from swarmnode.admit.verdict import Accepted
from swarmnode.broadcast.adapter import BaseWeights
from swarmnode.broadcast.driver import Blob
from swarmnode.broadcast.weights import WeightPublisher
from swarmnode.config import Config
from swarmnode.home import NodeHome
from swarmnode.identity import load_or_create_identity
from swarmnode.net.dataplane import DataPlane, DataPlaneError, RefuseRequest, request_source
from swarmnode.net.hivemind_runtime import HivemindRuntime
from swarmnode.ops.dashboard import (
    CounterHistory,
    Dashboard,
    LedgerRounds,
    Section,
    Table,
    ago,
    fmt,
    key_value_table,
    short_id,
)
from swarmnode.ops.metrics import Metrics
from swarmnode.ops.supervise import run_jobs
from swarmnode.policy.lock import ModelLock
from swarmnode.policy.lora import base_state_dict, has_lora, plain_copy
from swarmnode.roles.common import (
    api_job,
    build_mixture,
    build_policy,
    configure_threads,
    model_family,
    role_engine,
)
from swarmnode.roles.convert import WorkerDataError, from_worker
from swarmnode.rollout import SamplingParams
from swarmnode.rollout.keyed import TokenCheck
from swarmnode.store import CheckpointStore, Ledger
from swarmnode.train import ScoredGroup, Trainer
from swarmnode.verify import VerifierPool
from swarmnode.wire import (
    Activate,
    Deactivate,
    Envelope,
    Heartbeat,
    Kind,
    PeerRecord,
    Role,
    RolloutBatch,
    encode_envelope,
)
from swarmnode.wire.limits import SAMPLING_SEED_BYTES
from swarmnode.wire.messages import WeightManifestBody

log = logging.getLogger(__name__)
T = TypeVar("T")
SEND_TIMEOUT = 10.0
RECORD_TTL = 60.0
# The activation timer sleeps until the core's next deadline, but never longer than this (a wake-up
# missed cannot stall leases) nor shorter (a deadline left in the past cannot spin the loop).
TIMER_WAIT_CAP = 5.0
TIMER_WAIT_FLOOR = 0.01
CONTROL_QUEUE = 1024  # Activate / Deactivate messages waiting to be sent
CONTROL_IN_FLIGHT = 32  # of them sent at once


@dataclass
class Arrival:
    group: ScoredGroup
    worker: str
    received_at: float


@dataclass(frozen=True)
class ControlMessage:
    """An Activate / Deactivate the activation core decided, for the ``control`` job to send."""

    record: PeerRecord
    message: Activate | Deactivate
    then_weights: bool = False  # after an Activate: send the newest manifest


async def wait_set(event: asyncio.Event, seconds: float) -> bool:
    """Wait until ``event`` is set (True) or ``seconds`` pass (False).

    ``asyncio.timeout``, not ``wait_for``: on Python 3.11 ``wait_for`` returns normally when it is
    cancelled just as the event is set, and a job that swallows its cancellation keeps the node's
    TaskGroup, and so the node, from stopping."""
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        return False
    return True


def worker_address(record: PeerRecord) -> str:
    """Where this run of a worker is reached (``WorkerOffer.address``: a change is a restart)."""
    return " ".join([*record.addresses, f"p2p:{record.libp2p_peer_id}"])


class LearnerNode:
    def __init__(self, config: Config, home: NodeHome, *, max_steps: int | None = None) -> None:
        self.config = config
        self.home = home.ensure()
        self.max_steps = max_steps
        self.metrics = Metrics()
        self.model_lock = ModelLock()  # train, spot-check recompute and checkpoint: one at a time
        self.started_at = time.time()
        self.stop = asyncio.Event()
        self.queue: collections.deque[Arrival] = collections.deque()
        self.arrived = asyncio.Event()
        self.steps_here = 0
        self.busy_seconds = 0.0
        self.spot_check_seconds = (
            0.0  # the spot checks' forward passes (under the model lock) and token checks
        )
        self.wait_seconds = 0.0
        self.trained_lags: collections.Counter[int] = collections.Counter()
        self.cost_paid = 0.0
        self.completions_by_worker: collections.Counter[str] = collections.Counter()
        self.offers: dict[str, PeerRecord] = {}
        # Offers workers pushed to our data plane, rationed by network (workers.offers).
        self.direct_offers = DirectOffers(per_network=config.learner.offers_per_network)
        # Set whenever an event went into the activation core (its next deadline may have moved).
        self.deadline_moved = asyncio.Event()
        self.outbox: asyncio.Queue[ControlMessage] = asyncio.Queue(maxsize=CONTROL_QUEUE)
        self.last_loss: float | None = None
        self.last_reward: float | None = None
        self.utilization_over_steps = CounterHistory()  # the plan's prediction and the measured share

    # ------------------------------------------------------------------ torch (one at a time)

    def _build(self) -> None:
        configure_threads(self.config)
        self.identity = load_or_create_identity(self.home.identity_key)
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
        # Versions the ledger saw published, read before ``resume`` forgets the rounds after the
        # checkpoint: a home without HOME/published_version (made before it existed) still numbers
        # past them (``_number_past_published``).
        self.recorded_version = self.ledger.highest_policy_version()
        self.trainer.resume()
        # A scratch copy for spot checks under an older version (never the live model); the old
        # weights themselves are the publisher's blobs (``WeightPublisher.weights_of``). (LoRA: a
        # plain model of the base architecture, as a worker's; an adapter version is added to the
        # live model's frozen base, which the scratch copy and the workers started from.)
        base = base_state_dict(policy.model) if has_lora(policy.model) else None
        self.scratch = ScratchModel(BaseWeights(plain_copy(policy.model), base, adapters=base is not None))
        self.adapter_broadcast = base is not None and self.config.learner.adapter_broadcast
        if self.adapter_broadcast:
            self.scratch.base.hash  # noqa: B018  # taken here, off the event loop
        # Each worker's keyed-sampling seeds (protocol/SPEC.md 1.8): a fresh one per activation
        # (renewals keep it), the newest two, since a batch generated just before a re-activation
        # reached us under the previous one; only for workers with an offer on hand.
        self.sampling_seeds: dict[str, collections.deque[bytes]] = {}

    @property
    def version(self) -> int:
        return self.trainer.policy.version

    # ------------------------------------------------------------------ status

    def status(self) -> dict[str, Any]:
        plan = self.activation.plan
        workers = self.activation.status(time.time()).workers
        busy, wait = self.busy_seconds, self.wait_seconds
        return {
            "name": self.config.node.name,
            "role": "learner",
            "version": __version__,
            "peer_id": self.identity.peer_id,
            "libp2p_peer_id": self.runtime.peer_id if self.runtime.is_running else None,
            "dataplane": self.dataplane.address,
            "uptime_s": round(time.time() - self.started_at, 1),
            "steps": self.trainer.round,
            "steps_this_run": self.steps_here,
            "policy_version": self.version,
            "reward_last": self.last_reward,
            "loss_last": self.last_loss,
            "queue": len(self.queue),
            "plan": plan.as_dict(),
            # D as the core's need holds it now (the plan above keeps the D it was made with), and
            # each worker's own D, which the plan adds beyond that to the worker's tail.
            "dissemination_s": self.activation.dissemination,
            "worker_dissemination_s": {
                w.peer: w.dissemination for w in workers if w.dissemination is not None
            },
            # Proven workers untrusted (on probation beside the others) after their rate fell.
            "worker_held_until": {w.peer: w.held_until for w in workers if w.held_until is not None},
            # The core's counters: re-plans, re-probes, restarts, renewals, ...
            "activation": self.activation.stats.as_dict(),
            "control_queue": self.outbox.qsize(),
            "busy_s": round(busy, 3),
            "wait_s": round(wait, 3),
            "measured_utilization": busy / (busy + wait) if busy + wait > 0 else None,
            "measured_utilization_window": self.activation.measured_utilization(time.time()),
            "cost_paid": self.cost_paid,
            "cost_per_step_measured": self.cost_paid / self.steps_here if self.steps_here else None,
            "completions_by_worker": dict(self.completions_by_worker),
            "staleness": {
                "bound": self.gate.bound,
                **self.gate.counters,
                "trained_by_lag": {str(k): v for k, v in sorted(self.trained_lags.items())},
            },
            "broadcast": self.publisher.status(),
            "spot_checks": self.spot.stats.as_dict(),
            # Per worker: batches, checks, fails, keyed tokens checked and skipped, and after how
            # many batches (and spot-checked batches) it was first deactivated.
            "spot_checks_by_worker": self.spot.workers(),
            # The checking's cost beside the learner's own step time (both in seconds).
            "spot_check_seconds": round(self.spot_check_seconds, 3),
            "spot_check_share_of_busy": self.spot_check_seconds / busy if busy > 0 else None,
            "admission": dict(self.admission.counts()),
            "verifier": self.verifier.stats(),
            "offers": {
                p: {"rate": r.capabilities.rollout_rate, "price": r.capabilities.price}
                for p, r in self.offers.items()
            },
            "direct_offers": self.direct_offers.stats(),
            "metrics": self.metrics.snapshot(),
        }

    async def dashboard(self) -> Dashboard:
        """The learner's page: learning curves, the activation plan and its workers, the broadcast."""
        learning = await asyncio.to_thread(self.ledger_rounds.charts)
        now = time.time()
        status = self.activation.status(now)
        plan = status.plan
        latest_version = next(reversed(self.publisher.published), None)
        rows, classes = [], []
        checks = self.spot.workers(limit=len(status.workers) + 1)
        for w in sorted(status.workers, key=lambda w: (not w.active, w.price, w.peer)):
            record = checks.get(w.peer, {})
            told = self.publisher.told.get(w.peer)
            latest = self.publisher.latest_for(w.peer)  # whole for a worker without our base
            if latest is None or told is None:
                weights = "-"
            elif told != latest.digest:
                weights = "older version"
            elif (w.peer, latest.digest) in self.publisher.told_at:
                weights = f"receiving v{latest_version}"
            else:
                weights = f"has v{latest_version}"
            state = "banned" if w.banned_until else "active" if w.active else "idle"
            if w.active and not w.proven:
                state += " (probation)"
            if w.held_until:
                state += " (held)"
            rows.append(
                [
                    short_id(w.peer),
                    state,
                    fmt(w.planned_rate, 3),
                    fmt(w.measured_rate, 3),
                    fmt(w.price),
                    fmt(w.dissemination, 3),
                    fmt(self.completions_by_worker.get(w.peer, 0)),
                    f"{record.get('checks', 0)} / {record.get('fails', 0)}",
                    fmt(record.get("skipped_share"), 3),
                    weights,
                ]
            )
            classes.append("banned" if w.banned_until else "")
        workers = Table(
            "workers",
            "Workers (the plan's active set first)",
            [
                "worker",
                "state",
                "planned /s",
                "measured /s",
                "price",
                "D (s)",
                "completions",
                "spot checks / failed",
                "tokens skipped",
                "weights",
            ],
            rows,
            classes,
        )
        busy, wait = self.busy_seconds, self.wait_seconds
        measured = busy / (busy + wait) if busy + wait > 0 else None
        plan_figures = {
            "feasible": "yes" if plan.feasible else f"no: {plan.reason}",
            "required rate (/s)": plan.required_rate,
            "predicted rate (/s)": plan.predicted_rate,
            "step time T (s)": status.step_time,
            "dissemination D (s)": status.dissemination,
            "cost per step, planned": plan.cost_per_step,
            "cost per step, paid": self.cost_paid / self.steps_here if self.steps_here else None,
            "excluded": ", ".join(f"{short_id(e.peer)}: {e.reason}" for e in plan.excluded[:8]) or "-",
            "versions sent as": broadcast_summary(self.publisher.status()),
            **{f"core: {k}": v for k, v in status.stats.items() if v},
        }
        return Dashboard(
            f"swarmnode · {self.config.node.name}",
            "learner",
            cards=[
                ("steps", fmt(self.trainer.round)),
                ("policy version", fmt(self.version)),
                ("active workers", fmt(len(plan.workers))),
                ("utilization planned", fmt(plan.predicted_utilization, 2)),
                ("utilization measured", fmt(measured, 2)),
                ("queue (groups)", fmt(len(self.queue))),
                ("up", ago(self.started_at, now).replace(" ago", "")),
            ],
            sections=[
                Section("Learning", charts=learning[:2]),  # reward, held-out (no gossip: no usage)
                Section(
                    "Activation",
                    charts=[
                        self.utilization_over_steps.chart(
                            "utilization", "Learner utilization: planned vs measured", "step", "share"
                        )
                    ],
                    tables=[workers, key_value_table("plan", "The activation plan", plan_figures)],
                ),
                Section(
                    "Intake",
                    tables=[
                        key_value_table(
                            "intake",
                            "Admission, spot checks, staleness",
                            {
                                **{f"admission {k}": v for k, v in self.admission.counts().items()},
                                **{f"spot checks {k}": v for k, v in self.spot.stats.as_dict().items()},
                                **{f"staleness {k}": v for k, v in self.gate.counters.items()},
                            },
                        )
                    ],
                ),
            ],
            links=[("status JSON", "/status"), ("metrics", "/metrics")],
        )

    def _plan_gauges(self) -> None:
        plan = self.activation.plan
        g = self.metrics
        g.set("active_workers", "Workers in the activation plan", len(plan.active))
        g.set(
            "plan_predicted_utilization", "Learner utilization the plan predicts", plan.predicted_utilization
        )
        g.set(
            "plan_cost_per_step", "Price of what the active workers produce in one step", plan.cost_per_step
        )
        busy, wait = self.busy_seconds, self.wait_seconds
        if busy + wait > 0:
            g.set("measured_utilization", "Share of learner time spent stepping", busy / (busy + wait))

    # ------------------------------------------------------------------ intake

    def _is_active(self, worker: str) -> bool:
        return worker in self.activation.active()

    async def _on_rollouts(self, sender: str, envelope: Envelope, message: object) -> Heartbeat:
        """A worker's batch: admission, conversion, spot check, queue. Answers with our version."""
        now = time.time()
        reply = Heartbeat(
            round=self.trainer.round, model_id=self.trainer.policy.model_id, policy_version=self.version
        )
        if sender not in self.activation.active():
            self.metrics.inc("worker_batches_refused", "Worker batches refused", reason="not_active")
            return reply
        # In the admission thread: regeneration and the verifier's scoring never hold up the loop.
        # The data plane decoded and verified these bytes: admission takes the values, not a re-decode
        # (the re-encoding feeds only admission's size rule; decode and signature are not repeated).
        decoded = message if isinstance(message, RolloutBatch) else None
        judged = await self.intake.judge(
            encode_envelope(envelope), via=sender, solicited=True, envelope=envelope, message=decoded
        )
        verdict = judged.verdict
        if isinstance(verdict, Rejected):
            self.metrics.inc("worker_batches_refused", "Worker batches refused", reason=verdict.reason.value)
            log.warning("batch from worker %s refused: %s: %s", sender, verdict.reason.value, verdict.detail)
            if judged.banned_until is not None:
                # Banned at intake (e.g. groups it sent before, again): off the plan at once, not
                # when its measured rate has decayed, and told why (a replaying worker stayed
                # activated, its lease renewed, for 600 batches refused as banned).
                self._feed(act.PeerBanned(sender, judged.banned_until), now)
            return reply
        assert isinstance(verdict, Accepted)
        max_new = self.config.rollout.max_new_tokens
        size = self.config.rollout.group_size
        policy = self.trainer.policy
        try:
            # Checking and decoding its tokens is work the batch makes us do: in the admission
            # thread, charged to the worker as its admit was (red team rt67 F2: on the loop, free).
            groups = await self.intake.call_as(
                lambda: [from_worker(a, policy, max_new, size) for a in verdict.groups],
                signer=verdict.sender,
                via=sender,
            )
        except WorkerDataError as e:
            self.intake.submit(lambda: self.admission.penalize(sender, RejectReason.INVALID_PAYLOAD, now))
            self.metrics.inc("worker_batches_refused", "Worker batches refused", reason="bad_tokens")
            log.warning("batch from worker %s refused: %s", sender, e)
            return reply
        unverifiable = self._unverifiable(groups)
        if unverifiable is not None:
            # Not paid, queued or counted as delivered; no strike (an honest worker's batch can reach
            # us late, and one still on weights of before our restart names versions we have not
            # published again yet).
            self.metrics.inc("worker_batches_refused", "Worker batches refused", reason=unverifiable[0])
            log.warning("batch from worker %s refused: %s", sender, unverifiable[1])
            if unverifiable[0] == "stale_policy":
                self._tell_latest(sender)  # it works with weights we retired: point it at the newest
            return reply
        if not await self._spot_check(sender, groups, now):
            return reply
        if min(g.policy_version for g in groups) < self.version:
            self._tell_latest(sender)  # it works with old weights: make sure it has the newest manifest
        count = sum(g.size for g in groups)
        self.completions_by_worker[sender] += count
        offer = self.offers.get(sender)
        if offer is not None:
            self.cost_paid += offer.capabilities.price * count / 1000.0
        self._feed(act.RolloutsReceived(sender, count), now)
        for g in groups:
            self.queue.append(Arrival(g, sender, now))
        self.metrics.inc("worker_groups_received", "Worker groups admitted", len(groups))
        self.arrived.set()
        return reply

    def _number_past_published(self) -> None:
        """Resumed from a checkpoint older than the last version we published (a crash between
        checkpoints): the weights take the next unused number, so that no number names two sets
        of weights (``WeightPublisher.next_free``)."""
        floor = (
            self.version if self.recorded_version is None else max(self.version, self.recorded_version + 1)
        )
        version = self.publisher.next_free(floor)
        if version != self.version:
            log.warning(
                "resumed at policy version %d, but versions up to %d were published before: "
                "publishing these weights as version %d",
                self.version,
                version - 1,
                version,
            )
            self.trainer.policy.version = version

    def _unverifiable(self, groups: list[ScoredGroup]) -> tuple[str, str] | None:
        """(reason, detail) when a group of the batch names a version whose weights we do not hold
        (``publisher.weights_of``), else None. Such a group could never be spot-checked: one
        claiming a version we have not published yet would be queued unchecked and trained on at
        lag 0 once our version reaches it (red team: a worker claiming ``latest + 1`` had 76 of 78
        trained groups, none checked), and one older than we keep is dropped at the next step
        anyway. Called right before ``_spot_check`` with no await between, so it still holds for
        the batch's first check; a version retired during an earlier check of the batch (the
        learner stepped meanwhile) refuses the batch there (``_check_group``)."""
        newest = max(self.publisher.published, default=-1)
        for i, g in enumerate(groups):
            if self.publisher.weights_of(g.policy_version) is None:
                reason = "from_future" if g.policy_version > newest else "stale_policy"
                return reason, (
                    f"groups[{i}] claims policy version {g.policy_version}; this learner holds "
                    f"{sorted(self.publisher.published)} (only those can be checked)"
                )
        return None

    async def _on_offer(self, sender: str, envelope: Envelope, message: PeerRecord) -> None:
        """A worker's signed offer sent straight to us: kept in the direct-offer table, rationed
        by the network it came from, so a stuffed DHT key cannot keep a worker from us."""
        sent_at = envelope.sent_at_ms / 1000.0
        refusal = self.direct_offers.receive(sender, sent_at, message, request_source(), time.time())
        if refusal is not None:
            reason, _, detail = refusal.partition(": ")
            self.metrics.inc("direct_offers_refused", "Pushed offers we did not keep", reason=reason)
            raise RefuseRequest(reason, detail)
        self.metrics.inc("direct_offers", "Offers pushed to us and kept")

    async def _timed(
        self,
        run: Callable[[Callable[[], tuple[T, float]]], Awaitable[tuple[T, float]]],
        work: Callable[..., T],
        *args: Any,
    ) -> T:
        """``await run(work, *args)`` (a thread runner: the model lock's, or ``asyncio.to_thread``),
        the seconds ``work`` took in its thread added to ``spot_check_seconds`` here, on the loop."""

        def timed() -> tuple[T, float]:
            started = time.perf_counter()
            return work(*args), time.perf_counter() - started

        result, seconds = await run(timed)
        self.spot_check_seconds += seconds
        return result

    async def _spot_check(self, sender: str, groups: list[ScoredGroup], now: float) -> bool:
        """Re-compute the log-probs of a sample of the worker's tokens in one group (one per
        ``rollout.prompts_per_round``) of a sample of its batches (``SpotChecker.begin_batch``),
        and check a sample of the tokens themselves against keyed sampling; False (and maybe
        deactivation) on a lie. Every group's version was held when the batch came
        (``_unverifiable`` refused the others); one retired since refuses the batch, unpaid."""
        for index in self.spot.begin_batch(sender, len(groups)):
            if not await self._check_group(sender, groups[index], now):
                return False
        return True

    async def _check_group(self, sender: str, g: ScoredGroup, now: float) -> bool:
        """One group's spot check (log-probs, then keyed tokens); False, after the penalty, the
        queued groups dropped and maybe a deactivation, when it fails."""
        weights = self.publisher.weights_of(g.policy_version)
        if weights is None:
            # Retired while an earlier check of this batch ran (the learner stepped): it can no
            # longer be checked, so the batch is refused as ``_unverifiable`` would (unpaid, no
            # strike). Passing it unchecked let a worker's later groups through (red team #20b).
            self.metrics.inc("worker_batches_refused", "Worker batches refused", reason="stale_policy")
            log.warning(
                "batch from worker %s refused: version %d retired during its checks", sender, g.policy_version
            )
            return False
        request = self.spot.select(sender, g.task.id.key(), [len(c) for c in g.completion_ids])
        if request is None:
            return True
        keyed = self.config.learner.keyed_sampling
        scan = await self._timed(
            self.model_lock.run,
            self.scratch.scan,
            g.policy_version,
            weights,
            request,
            g.prompt_ids,
            g.completion_ids,
            self.config.rollout.temperature,
            self.trainer.policy.pad_token_id,
            len(request.tokens) if keyed else 0,
            self.spot.draw_seed(),
        )
        judgement = judge(request.pick(g.behaviour_logprobs), scan.logprobs, self.spot.config.tolerance)
        if judgement.passed and keyed:
            judgement = await self._check_tokens(sender, g, scan.tokens, scan.token_logits)
        outcome = self.spot.record(sender, judgement)
        self.metrics.inc("spot_checks", "Worker spot checks", result="pass" if outcome.passed else "fail")
        if outcome.passed:
            return True
        log.warning("worker %s failed a spot check: %s", sender, outcome.reason)
        self.metrics.inc("worker_batches_refused", "Worker batches refused", reason="spot_check")
        self._drop_queued(sender)
        self.intake.submit(lambda: self.admission.penalize(sender, RejectReason.INVALID_PAYLOAD, now))
        if outcome.deactivate:
            self._feed(act.WorkerMisbehaved(sender, f"spot check: {outcome.reason}"), now)
        return False

    def _drop_queued(self, sender: str) -> None:
        """Drop ``sender``'s groups still waiting for a step: they came from a worker that has just
        failed a check, and none of them was checked."""
        kept = [a for a in self.queue if a.worker != sender]
        dropped = len(self.queue) - len(kept)
        if dropped:
            self.queue = collections.deque(kept)
            self.metrics.inc("unverified_dropped", "Queued groups of a worker that failed a check", dropped)
            log.info("dropped %d queued groups of worker %s", dropped, sender)

    async def _check_tokens(
        self, sender: str, g: ScoredGroup, request: SpotCheckRequest, logits: torch.Tensor
    ) -> Judgement:
        """Are ``request``'s tokens the ones keyed sampling picks under the version ``g`` claims
        (``logits``: that version's at those tokens, from the log-prob check's forward), with one of
        the seeds we gave ``sender`` (protocol/SPEC.md 1.8)? Positions too close to a CDF boundary
        to tell are skipped (counted), not failed."""
        r = self.config.rollout
        params = SamplingParams(temperature=r.temperature, top_p=r.top_p, max_new_tokens=r.max_new_tokens)
        n = len(request.tokens)
        seeds = list(reversed(self.sampling_seeds.get(sender, ())))
        margin = self.config.learner.keyed_margin
        if not seeds:
            return Judgement(False, math.inf, None, n, "no sampling seed was given to this worker")

        def check() -> list[TokenCheck]:
            checks: list[TokenCheck] = []
            for seed in seeds:  # the newest first
                checks = tokens_at(logits, request, g.completion_ids, params, seed, g.task.id.key(), margin)
                if TokenCheck.MISMATCH not in checks:
                    break
            return checks

        # A softmax (and a sort, under top-p) over the vocabulary per token and seed: off the loop.
        checks = await self._timed(asyncio.to_thread, check)
        self.spot.record_tokens(sender, len(checks), checks.count(TokenCheck.SKIPPED))
        for result in checks:
            self.metrics.inc(
                "keyed_token_checks", "Worker tokens checked against keyed sampling", result=result
            )
        if TokenCheck.MISMATCH not in checks:
            return Judgement(True, 0.0, None, n)
        worst = checks.index(TokenCheck.MISMATCH)
        t = request.tokens[worst]
        return Judgement(
            False,
            math.inf,
            worst,
            n,
            f"token {t.position} of completion {t.completion} is not the one keyed sampling picks "
            f"under version {g.policy_version}",
        )

    # ------------------------------------------------------------------ activation

    def _offer(self, peer: str, record: PeerRecord) -> act.WorkerOffer:
        """The worker's advertised offer, with where this run of it is reached (the core takes a
        new address as a restart and models the tail latency from its deliveries)."""
        caps = record.capabilities
        return act.WorkerOffer(
            peer=peer,
            rate=caps.rollout_rate,
            price=caps.price,
            hardware=caps.hardware,
            address=worker_address(record),
        )

    def _disseminated(self, worker: str, version: int, seconds: float) -> None:
        """A version reached ``worker`` (every chunk verified there): D for the latency constraint."""
        self._feed(act.DisseminationMeasured(seconds, worker), time.time())

    def _feed(self, event: act.ActivationEvent, now: float) -> None:
        self._feed_all([event], now)

    def _feed_all(self, events: list[act.ActivationEvent], now: float) -> None:
        """Events of one instant (a recruit round's joins and leaves) go in together: the core sends
        no Activate it took back within them."""
        for action in self.activation.handle_all(events, now):
            self._perform(action)
        self.deadline_moved.set()  # the timer job re-reads next_deadline()
        self._plan_gauges()

    def _perform(self, action: act.ActivationAction) -> None:
        if isinstance(action, act.PlanChanged):
            log.info("plan (%s): %s", action.cause, action.plan.as_dict())
        elif isinstance(action, act.Forget):
            # The core measures this worker afresh (a restart or a re-probe): what we sent its
            # previous run, and the timings of it, no longer hold.
            log.info("worker %s started over: %s", action.peer, action.reason)
            self.metrics.inc("worker_started_over", "Workers the activation core measures afresh")
            self.publisher.forget(action.peer)
        elif isinstance(action, act.Activate):
            record = self.offers.get(action.peer)
            if record is not None:
                message = Activate(
                    worker_peer_id=action.peer,
                    model_id=self.trainer.policy.model_id,
                    policy_version=self.version,
                    target_rate=max(action.target_rate, 1e-6),
                    lease_seconds=self.config.learner.lease_seconds,
                    sampling_seed=self._sampling_seed(action.peer, renewal=action.renewal),
                )
                self._post(ControlMessage(record, message, then_weights=True))
        elif isinstance(action, act.Deactivate):
            record = self.offers.get(action.peer)
            if record is not None:
                self._post(ControlMessage(record, Deactivate(action.peer, action.reason[:200])))

    def _sampling_seed(self, peer: str, *, renewal: bool) -> bytes:
        """The seed an Activate to ``peer`` carries: a fresh one, or for a renewal the running one
        (empty with ``learner.keyed_sampling`` off)."""
        if not self.config.learner.keyed_sampling:
            return b""
        seeds = self.sampling_seeds.get(peer)
        if seeds is None:
            for gone in [p for p in self.sampling_seeds if p not in self.offers]:
                del self.sampling_seeds[gone]  # bounded by the offers on hand
            seeds = self.sampling_seeds[peer] = collections.deque(maxlen=2)
        if not renewal or not seeds:
            seeds.append(secrets.token_bytes(SAMPLING_SEED_BYTES))
        return seeds[-1]

    def _post(self, item: ControlMessage) -> None:
        """Queue a control message for the ``control`` job (bounded: a full queue drops, counted;
        a lease renewal re-sends an Activate before the lease lapses)."""
        try:
            self.outbox.put_nowait(item)
        except asyncio.QueueFull:
            kind = type(item.message).__name__
            log.warning("control queue full: %s to %s not sent", kind, item.record.peer_id)
            self.metrics.inc("control_dropped", "Control messages dropped: queue full", kind=kind)

    def _tell_latest(self, peer: str) -> None:
        """Send ``peer`` the newest manifest, once per version (a worker may have missed one, e.g.
        activated just before a step, and would otherwise generate with weights older than S
        until the next step; with every group dropped there would be no next step)."""
        record = self.offers.get(peer)
        if record is not None:
            self.publisher.tell(record)  # the publisher knows who was told which version

    async def _control(self) -> None:
        """Send the queued control messages, each in a task of this job's TaskGroup, at most
        ``CONTROL_IN_FLIGHT`` at once (one slow worker does not hold up the others). A send that
        fails is logged and counted (``_send``); any other error ends the group, and the
        supervisor logs it with its traceback, counts it and restarts the job."""
        slots = asyncio.Semaphore(CONTROL_IN_FLIGHT)
        async with asyncio.TaskGroup() as group:
            while True:
                item = await self.outbox.get()
                await slots.acquire()
                name = f"{type(item.message).__name__} to {item.record.peer_id}"
                group.create_task(self._send_in_slot(item, slots), name=name)

    async def _send_in_slot(self, item: ControlMessage, slots: asyncio.Semaphore) -> None:
        try:
            await self._send(item.record, item.message, then_weights=item.then_weights)
        finally:
            slots.release()

    async def _send(
        self, record: PeerRecord, message: Activate | Deactivate, *, then_weights: bool = False
    ) -> None:
        try:
            await self.dataplane.request_peer(
                record.addresses,
                record.libp2p_peer_id or None,
                message,
                timeout=SEND_TIMEOUT,
                expect_peer=record.peer_id,
            )
        except DataPlaneError as e:
            log.warning("could not reach worker %s: %s", record.peer_id, e)
            self.metrics.inc("worker_unreachable", "Control messages a worker did not answer")
            return
        if then_weights:  # a worker (re)activated may have lost the weights: send the manifest again
            self.publisher.tell(record, again=True)

    async def _activation_timers(self) -> None:
        """Drive the core's timers as the simulator does: sleep until ``next_deadline()`` (or until
        an event may have moved it), then ``poll``. The sleep is clamped to
        [``TIMER_WAIT_FLOOR``, ``TIMER_WAIT_CAP``]."""
        while True:
            now = time.time()
            deadline = self.activation.next_deadline()
            if deadline is not None and deadline <= now:
                for action in self.activation.poll(now):
                    self._perform(action)
                self._plan_gauges()
                deadline = self.activation.next_deadline()
            wait = TIMER_WAIT_CAP if deadline is None else deadline - now
            self.deadline_moved.clear()
            # Set (an event went in) or not (the deadline, or the cap, came): look again either way.
            await wait_set(self.deadline_moved, min(max(wait, TIMER_WAIT_FLOOR), TIMER_WAIT_CAP))

    def own_record(self) -> PeerRecord:
        """What this learner advertises under its learner key (workers find its data plane there)."""
        return PeerRecord(
            peer_id=self.identity.peer_id,
            libp2p_peer_id=self.runtime.peer_id,
            addresses=(self.config.dataplane.advertise or self.dataplane.address,),
            roles=(Role.LEARNER,),
            model_family=model_family(self.trainer.policy),
            model_id=self.trainer.policy.model_id,
        )

    async def _recruit(self) -> None:
        """Turn the offers we read into the core's joins and leaves, every ``recruit_seconds``."""
        key = workers_key("default", self.identity.peer_id)
        own = self.own_record()
        while True:
            now = time.time()
            await publish_record(
                self.runtime,
                learner_key("default", self.identity.peer_id),
                signed_record(self.identity, own, now),
                RECORD_TTL,
            )
            now = time.time()
            # Offers from the DHT and those pushed to us: the newest signed one of each worker.
            both = newest(await read_signed_records(self.runtime, key), self.direct_offers.live(now))
            seen = {p: r for p, r in both.items() if Role.WORKER in r.roles}
            now = time.time()
            events: list[act.ActivationEvent] = []
            for peer, record in seen.items():
                # Re-advertisements go in as WorkerJoined too: the core re-plans only on a material
                # change, starts the worker over on a new address (a restart), and measured
                # deliveries (RolloutsReceived) outrank advertised rates. The record is kept first,
                # so an Activate the join causes goes to the worker's current address.
                self.offers[peer] = record
                events.append(act.WorkerJoined(self._offer(peer, record)))
            gone = [p for p in self.offers if p not in seen]
            events += [act.WorkerLeft(peer) for peer in gone]
            self._feed_all(events, now)
            for peer in gone:
                self.publisher.forget(peer)
                del self.offers[peer]
            self.publisher.set_peers({p: peer_address(r) for p, r in self.offers.items()})
            self._plan_gauges()
            await asyncio.sleep(self.config.learner.recruit_seconds)

    # ------------------------------------------------------------------ learn

    def _take_batch(self) -> list[ScoredGroup]:
        """Up to B queued groups, newest policy version first, that pass the staleness gate.

        Newest first: when workers deliver faster than the learner steps, the backlog ages; the
        freshest groups carry the least off-policy error, and the backlog's oldest groups fall
        past S and are dropped (counted) instead of every step training on the oldest."""
        want = self.config.learner.groups_per_step
        ordered = sorted(self.queue, key=lambda a: (-a.group.policy_version, a.received_at))
        self.queue.clear()
        batch: list[ScoredGroup] = []
        for arrival in ordered:
            verdict = self.gate.check(arrival.group.policy_version, self.version)
            if not verdict.accepted:
                self.gate.accept(arrival.group.policy_version, self.version)  # count the drop
                self.metrics.inc(
                    "stale_dropped", "Worker groups dropped as too stale", reason=str(verdict.reason)
                )
            elif len(batch) < want:
                self.gate.accept(arrival.group.policy_version, self.version)
                batch.append(arrival.group)
            else:
                self.queue.append(arrival)  # still fresh enough: a later step may take it
        return batch

    async def _learn(self) -> None:
        want = self.config.learner.groups_per_step
        while True:
            t_wait = time.monotonic()
            deadline = t_wait + self.config.learner.max_wait_seconds
            while len(self.queue) < want and time.monotonic() < deadline:
                self.arrived.clear()
                if not await wait_set(self.arrived, max(0.01, deadline - time.monotonic())):
                    break
            batch = self._take_batch()
            waited = time.monotonic() - t_wait
            if not batch:
                self.wait_seconds += waited
                continue
            t_busy = time.monotonic()
            for g in batch:
                self.trained_lags[self.version - g.policy_version] += 1
            metrics = await self.model_lock.run(self.trainer.train_round, batch)
            self.publisher.publish(self.version, self.trainer.policy.model)
            for peer in self.activation.active():
                self._tell_latest(peer)
            busy = time.monotonic() - t_busy
            self.busy_seconds += busy
            self.wait_seconds += waited
            self.steps_here += 1
            self.utilization_over_steps.add(
                self.trainer.round,
                {
                    "planned": self.activation.plan.predicted_utilization,
                    "measured": self.busy_seconds / max(1e-9, self.busy_seconds + self.wait_seconds),
                },
            )
            self.last_loss = None if metrics.loss != metrics.loss else metrics.loss
            self.last_reward = metrics.mean_reward
            self.metrics.inc("steps", "Learner steps")
            self.metrics.set("policy_version", "Policy version", self.version)
            self.metrics.set("reward", "Mean reward of the step's worker groups", metrics.mean_reward)
            self._feed(act.StepMeasured(step_seconds=busy, wait_seconds=waited), time.time())
            log.info(
                "step %d: %d groups (lags %s), reward %.3f, busy %.2fs, waited %.2fs, m2po %s",
                self.trainer.round,
                len(batch),
                sorted({self.version - 1 - g.policy_version for g in batch}),
                metrics.mean_reward,
                busy,
                waited,
                self.trainer.last_step_stale,
            )
            if self.max_steps is not None and self.steps_here >= self.max_steps:
                self.stop.set()
                return

    # ------------------------------------------------------------------ run

    async def run(self, runtime_factory: Callable[[], Any]) -> None:
        await asyncio.to_thread(self._build)
        lc = self.config.learner
        self.gate = StalenessGate(self.config.swarm.staleness_bound)
        self.spot = SpotChecker(
            SpotCheckConfig(
                sample_rate=lc.spot_check_rate,
                max_tokens=lc.spot_check_tokens,
                tolerance=lc.spot_check_tolerance,
                max_strikes=lc.spot_check_strikes,
                # A batch as large as a worker's own (rollout.prompts_per_round) gets one check.
                groups_per_check=self.config.rollout.prompts_per_round,
                # Secret: a worker that could predict which groups are checked could lie on the others.
                seed=secrets.randbits(63),
            )
        )
        self.activation = act.ActivationCore(
            act.ActivationConfig(
                batch=lc.groups_per_step * self.config.rollout.group_size,
                staleness=self.config.swarm.staleness_bound,
                step_time=1.0,
                margin=lc.margin,
                lease_seconds=lc.lease_seconds,
                renew_before=min(20.0, lc.lease_seconds / 3),
                rate_window=lc.rate_window,
                drift_hold=max(lc.drift_hold, lc.rate_window),
                policy=lc.activation,
            )
        )
        self.verifier = VerifierPool.from_config(self.config.verify, task_families(self.mixture))
        self.verifier.start()
        self.trainer.score_groups = self.verifier.score
        self.admission = AdmissionPipeline(
            AdmissionConfig(
                allowed_tasks=task_families(self.mixture),
                system_prompt_sha256=self.trainer.policy.system_prompt_sha256,
                max_policy_lag=self.config.swarm.staleness_bound,
                local_peer_id=self.identity.peer_id,
                # Only active workers reach admission (checked first), each sending a batch per
                # few hundred ms: a per-party share would refuse an honest worker within minutes.
                replay_quota=AdmissionConfig.replay_capacity,
            ),
            now=time.time(),
            ledger=self.ledger,
            score_groups=self.verifier.score,
        )
        self.intake = Intake(self.admission)
        dp = self.config.dataplane
        self.dataplane = DataPlane(
            self.identity, host=dp.host, port=dp.port, upload_rate=dp.upload_rate or None
        )
        # Only active workers' batches are parsed at all (the rest are refused on the claimed id).
        self.dataplane.register(Kind.ROLLOUT_BATCH, self._on_rollouts, senders=self._is_active)
        self.dataplane.register(Kind.PEER_RECORD, self._on_offer)
        await self.dataplane.start()
        self.publisher = WeightPublisher(
            self.identity,
            self.dataplane,
            self.trainer.policy.model_id,
            lc.chunk_bytes,
            keep=self.config.swarm.staleness_bound + 1,
            metrics=self.metrics,
            on_disseminated=self._disseminated,
            record=self.home.published_version,
            archive=self.home.published,
            base=self.scratch.base if self.adapter_broadcast else None,
        )
        await self.publisher.start()
        self._number_past_published()
        self.publisher.publish(self.version, self.trainer.policy.model)
        try:
            self.runtime: HivemindRuntime = await runtime_factory()
            # Workers that cannot dial our TCP address reach us over hivemind streams instead.
            await self.dataplane.attach_fallback(self.runtime)
            try:
                await self._run_jobs()
            finally:
                await self.runtime.stop()
        finally:
            await self.publisher.close()
            await self.dataplane.close()
            await self.model_lock.run(self.trainer.save_checkpoint_if_consistent)
            self.intake.close()
            self.verifier.close()
            self.ledger.close()

    async def _run_jobs(self) -> None:
        log.info(
            "learner %s: data plane %s, libp2p %s; workers join with: "
            "swarmnode run --role worker --learner %s",
            self.identity.peer_id,
            self.dataplane.address,
            self.runtime.peer_id,
            self.identity.peer_id,
        )
        jobs = {
            "recruit": self._recruit,
            "activation": self._activation_timers,
            "control": self._control,
            "learn": self._learn,
            "serve": api_job(self),
        }
        await run_jobs(jobs, self.metrics, self.stop)


def broadcast_summary(status: dict[str, Any]) -> str:
    """The dashboard's line for ``WeightPublisher.status``."""
    size = status["version_bytes"]
    line = f"{status['mode']}, {size / 1e6:.3g} MB" if size is not None else status["mode"]
    without = status["workers_without_base"]
    if without:
        line += f"; whole to {len(without)} worker(s) without our base"
    return line


class ScratchModel:
    """The spot checks' copy of the model, holding one published version at a time: consecutive
    checks under the same version (the usual case) decode and load its weights once."""

    def __init__(self, base: BaseWeights) -> None:
        self.base = base
        self.model = base.model
        self.version: int | None = None

    def scan(
        self,
        version: int,
        weights: tuple[Blob, WeightManifestBody],
        request: SpotCheckRequest,
        prompt_ids: list[int],
        completions: list[list[int]],
        temperature: float,
        pad_token_id: int,
        token_checks: int,
        draw_seed: int,
    ) -> GroupScan:
        """``scan_group`` under published ``version`` (its blob and layout decoded here, in the
        model lock's thread, not the event loop, when not loaded already): one forward pass over
        the group, pack by pack, from which the spot check takes its log-probs and draws and makes
        its token checks."""
        self._load(version, weights)
        return scan_group(
            self.model,
            request,
            prompt_ids,
            completions,
            temperature,
            pad_token_id,
            token_checks=token_checks,
            draw_seed=draw_seed,
        )

    def _load(self, version: int, weights: tuple[Blob, WeightManifestBody]) -> None:
        if version != self.version:
            self.version = None  # a failed load leaves no version claimed
            self.base.install(*weights)
            self.version = version
