"""Worker activation in the simulator: a learner, rollout workers, and an activation policy.

Owns
    A modelled asynchronous learner (ALGORITHMS.md §5): it steps whenever it holds ``B`` fresh
    completions, each step takes ``T`` seconds and makes a new policy version, which reaches the
    workers ``D`` seconds later; workers generate completions at their own rate (a modelled cost,
    no model runs) with the newest version they hold, and each completion travels to the
    learner in ``rollout_latency_ms``; completions older than ``current - S`` versions are
    dropped at the learner. Which workers generate is the policy's choice:

    * ``planner``: the node's real ``ActivationCore`` (ECHO-2 rule, re-planning on measured
      step times and rates, modelling tail latencies from deliveries, re-probing workers measured
      at 0), driven as the learner drives it: events in, actions performed, ``poll`` at
      ``next_deadline()``;
    * ``all``: every worker; ``cheapest:K``: the K lowest prices; ``fastest:K``: the K highest
      rates; ``random:K``: K drawn with the seed.

    Measured: learner utilization (time stepping / time), cost (every completion an active
    worker produced, at its price per 1,000 completions, whether used or dropped), stale drops.
    Predicted, for the same active set: utilization ``min(1, R*T/B)`` and cost per step
    ``sum(price_i/1000 * r_i) * max(T, B/R)`` (the learner steps every ``max(T, B/R)`` seconds
    and the active workers are paid for all they produce meanwhile); for ``planner`` also the
    plan's own figures.

Must not
    Decide activation for the planner (the core does).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Any

from swarmnode.activation import core as act
from swarmnode.sim.engine import Simulation
from swarmnode.sim.scenario import ActivationSpec, activation_config

CONTROL_LATENCY = 0.05  # an Activate/Deactivate message's trip to a worker


@dataclass
class Worker:
    name: str
    rate: float  # completions / second
    price: float  # per 1,000 completions
    active: bool = False
    version: int = 0  # newest policy version it holds
    busy: bool = False
    produced: int = 0
    token: int = 0  # bumps on each (de)activation, so a stale generation loop ends


def draw_workers(spec: ActivationSpec, seed: int) -> list[Worker]:
    sim_rng = Simulation(seed).rng  # the same draws for every policy
    return [
        Worker(f"w{i}", spec.worker_rate.sample(sim_rng), spec.worker_price.sample(sim_rng))
        for i in range(spec.workers)
    ]


def fixed_active_set(policy: str, workers: list[Worker], seed: int) -> list[Worker]:
    name, _, k_text = policy.partition(":")
    if name == "all":
        return list(workers)
    k = min(int(k_text), len(workers))
    if name == "cheapest":
        return sorted(workers, key=lambda w: (w.price, -w.rate, w.name))[:k]
    if name == "fastest":
        return sorted(workers, key=lambda w: (-w.rate, w.price, w.name))[:k]
    if name == "random":
        return Simulation(seed + 1).rng.sample(workers, k)
    raise ValueError(policy)


def predict(active: list[Worker] | list[tuple[float, float]], spec: ActivationSpec) -> dict[str, float]:
    pairs = [(w.rate, w.price) if isinstance(w, Worker) else w for w in active]
    rate = sum(r for r, _ in pairs)
    t, b = spec.step_seconds, spec.batch
    period = max(t, b / rate) if rate > 0 else math.inf
    return {
        "rate": rate,
        "utilization": min(1.0, rate * t / b),
        "cost_per_step": sum(p / 1000 * r for r, p in pairs) * period if rate > 0 else math.inf,
    }


class ActivationRun:
    """One policy on one draw of workers."""

    def __init__(self, spec: ActivationSpec, seed: int, policy: str) -> None:
        self.spec = spec
        self.policy = policy
        self.sim = Simulation(seed)
        self.rng = self.sim.rng
        self.workers = {w.name: w for w in draw_workers(spec, seed)}
        self.version = 0
        self.buffer: deque[int] = deque()  # versions of completions waiting at the learner
        self.steps = 0
        self.busy_time = 0.0
        self.wait_time = 0.0
        self.stale_dropped = 0
        self.first_step_at: float | None = None
        self.core: act.ActivationCore | None = None
        self._poll_at = math.inf
        self._arrived = 0  # completions arrived since the learner last looked
        self._learner_waiting = False
        self.plan_log: list[dict[str, Any]] = []
        self.active_time: dict[str, float] = dict.fromkeys(self.workers, 0.0)
        self._active_since: dict[str, float] = {}

    # -- workers --------------------------------------------------------------------------------

    def _set_active(self, name: str, on: bool) -> None:
        worker = self.workers[name]
        if worker.active == on:
            return
        worker.active = on
        worker.token += 1
        if on:
            self._active_since[name] = self.sim.now
            if not worker.busy:
                self._generate(worker, worker.token)
        else:
            self.active_time[name] += self.sim.now - self._active_since.pop(name)

    def _generate(self, worker: Worker, token: int) -> None:
        if not worker.active or token != worker.token:
            worker.busy = False
            return
        worker.busy = True
        duration = 1.0 / worker.rate
        if self.spec.rate_noise > 0:
            sigma = math.sqrt(math.log(1 + self.spec.rate_noise**2))
            duration *= math.exp(self.rng.gauss(-sigma * sigma / 2, sigma))  # mean-preserving
        self.sim.after(duration, self._generated, worker, token, worker.version)

    def _generated(self, worker: Worker, token: int, version: int) -> None:
        worker.produced += 1
        self.sim.after(self.spec.rollout_latency_ms / 1000, self._arrive, worker.name, version)
        worker.busy = False
        if worker.active:
            self._generate(worker, worker.token)

    def _arrive(self, name: str, version: int) -> None:
        self.buffer.append(version)
        if self.core is not None:
            self._feed(act.RolloutsReceived(name, 1))
        if self._learner_waiting:
            self._learner_waiting = False
            self._try_step()

    # -- learner --------------------------------------------------------------------------------

    def _fresh(self) -> int:
        floor = self.version - self.spec.staleness
        while self.buffer and self.buffer[0] < floor:
            self.buffer.popleft()
            self.stale_dropped += 1
        return sum(1 for v in self.buffer if v >= floor)

    def _try_step(self) -> None:
        if self._fresh() < self.spec.batch:
            self._learner_waiting = True
            return
        floor = self.version - self.spec.staleness
        taken = 0
        kept: deque[int] = deque()
        while self.buffer and taken < self.spec.batch:
            v = self.buffer.popleft()
            if v >= floor:
                taken += 1
            else:
                self.stale_dropped += 1
        kept.extend(self.buffer)
        self.buffer = kept
        now = self.sim.now
        waited = now - self._idle_since if self.first_step_at is not None else 0.0
        if self.first_step_at is None:
            self.first_step_at = now
        self.wait_time += waited
        self.sim.after(self.spec.step_seconds, self._step_done, waited)

    def _step_done(self, waited: float) -> None:
        t = self.spec.step_seconds
        self.steps += 1
        self.busy_time += t
        self.version += 1
        self._idle_since = self.sim.now
        version = self.version
        self.sim.after(self.spec.broadcast_seconds, self._weights_arrive, version)
        if self.core is not None:
            self._feed(act.StepMeasured(t, waited))
        if self.steps >= self.spec.steps:
            self.sim.stop()
            return
        self._try_step()

    def _weights_arrive(self, version: int) -> None:
        for worker in self.workers.values():
            worker.version = max(worker.version, version)

    # -- the planner ----------------------------------------------------------------------------

    def _feed(self, event: Any) -> None:
        assert self.core is not None
        self._perform(self.core.handle(event, self.sim.now))

    def _poll(self, at: float) -> None:
        if self.core is None or at != self._poll_at:
            return
        self._poll_at = math.inf
        self._perform(self.core.poll(self.sim.now))

    def _perform(self, actions: list[Any]) -> None:
        for action in actions:
            if isinstance(action, act.Activate):
                self.sim.after(CONTROL_LATENCY, self._set_active, action.peer, True)
            elif isinstance(action, act.Deactivate):
                self.sim.after(CONTROL_LATENCY, self._set_active, action.peer, False)
            elif isinstance(action, act.Forget):
                pass  # the learner forgets what it told the worker; here weights reach everyone anyway
            elif isinstance(action, act.PlanChanged):
                p = action.plan
                self.plan_log.append(
                    {
                        "t": self.sim.now,
                        "cause": action.cause,
                        "active": list(p.active),
                        "predicted_utilization": p.predicted_utilization,
                        "cost_per_step": p.cost_per_step,
                        "feasible": p.feasible,
                    }
                )
        assert self.core is not None
        deadline = self.core.next_deadline()
        if deadline is not None:
            deadline = max(deadline, self.sim.now)
            if deadline < self._poll_at:
                self._poll_at = deadline
                self.sim.at(deadline, self._poll, deadline)

    # -- running --------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        spec = self.spec
        self._idle_since = 0.0
        if self.policy == "planner":
            self.core = act.ActivationCore(activation_config(spec))
            # One run per worker (a simulated worker never restarts): one address each. The offers
            # arrive together, as in the learner's first recruit round (one handle_all).
            offers = [
                act.WorkerOffer(w.name, w.rate, w.price, address=f"sim:{w.name}")
                for w in self.workers.values()
            ]
            self._perform(self.core.handle_all([act.WorkerJoined(o) for o in offers], self.sim.now))
            chosen = [self.workers[p] for p in self.core.plan.active]
        else:
            chosen = fixed_active_set(self.policy, list(self.workers.values()), self.sim.seed)
            for w in chosen:
                self.sim.after(CONTROL_LATENCY, self._set_active, w.name, True)
        self.sim.at(0.0, self._try_step)
        horizon = spec.steps * max(spec.step_seconds, 1.0) * 1000  # far past any sane run
        self.sim.run(horizon)
        end = self.sim.now
        for name in list(self._active_since):
            self.active_time[name] += end - self._active_since.pop(name)
        cost = sum(w.produced * w.price / 1000 for w in self.workers.values())
        elapsed = end  # from t = 0: the first batch's generation counts as waiting
        measured_rate = sum(w.produced for w in self.workers.values()) / end if end > 0 else 0.0
        # Predicted for the set that was active most of the run (the plan's final set for the planner).
        final = chosen if self.core is None else [self.workers[p] for p in self.core.plan.active]
        result: dict[str, Any] = {
            "policy": self.policy,
            "steps": self.steps,
            "virtual_seconds": end,
            "utilization": self.busy_time / elapsed if elapsed > 0 else 0.0,
            "cost": cost,
            "cost_per_step": cost / self.steps if self.steps else math.inf,
            "stale_dropped": self.stale_dropped,
            "completions": sum(w.produced for w in self.workers.values()),
            "measured_rate": measured_rate,
            "active_workers": sorted(w.name for w in final),
            "predicted": predict(final, spec),
        }
        if self.core is not None:
            p = self.core.plan
            result["plan"] = {
                "predicted_utilization": p.predicted_utilization,
                "cost_per_step": p.cost_per_step,
                "feasible": p.feasible,
                "reason": p.reason,
                "replans": len(self.plan_log),
            }
        return result


def simulate_activation(spec: ActivationSpec, seed: int) -> dict[str, Any]:
    """Every policy of the scenario on the same workers; JSON-ready."""
    workers = draw_workers(spec, seed)
    runs = [ActivationRun(spec, seed, policy).run() for policy in spec.policies]
    return {
        "workers": [{"name": w.name, "rate": w.rate, "price": w.price} for w in workers],
        "need": {
            "step_seconds": spec.step_seconds,
            "batch": spec.batch,
            "staleness": spec.staleness,
            "margin": spec.margin,
            "broadcast_seconds": spec.broadcast_seconds,
            "required_rate": (1 + spec.margin) * spec.batch / spec.step_seconds,
        },
        "policies": runs,
        "utilization_mean": statistics.fmean(r["utilization"] for r in runs),
    }
