"""Cost-aware activation of rollout workers (ECHO-2 rule, ALGORITHMS.md §5) as a sans-IO core.

Owns
    ``plan(offers, need)``: the pure planning rule. ``ActivationCore``: one learner's view of the
    workers that offered to generate for it, what it measured about them and about itself, which
    of them are active, their leases, and when to re-plan. Every map is bounded, every timer is
    explicit, and it never reads a clock.

Must not
    Send messages, sign, read a clock, or judge rollouts (the staleness gate and the spot-checker
    do; a worker they condemn reaches this core as ``PeerBanned``).

Units (everywhere in this module)
    time and durations: seconds (one clock for every ``now``: wall-clock in the node, virtual in
    the simulator); rates: completions per second; price: the swarm's unit per 1,000 completions,
    as advertised in ``Capabilities.price`` on the wire; versions: learner policy versions;
    B: completions per learner step.

The rule (``plan``)
    A worker qualifies when its rate is positive and ``D + T_gen_tail <= S * T`` (an unknown tail
    counts as 0: nobody is excluded on a guess; the measured side catches a slow worker). Qualifying
    workers are sorted by ``price / rate`` (cheapest per completion first; ties: faster first, then
    peer id, so the plan is deterministic) and activated until ``R = sum(rate) >= (1 + margin) * B / T``.
    If every qualifying worker together falls short, all of them are activated, ``feasible`` is
    False and ``reason`` says by how much.
    ``ActivationCore`` adds one rule: when no worker meets the latency constraint but some would
    qualify without it, it plans without it among those with the shortest tail (within the drift
    band; ``feasible`` False, ``reason`` says so). A learner with no worker takes no step, so it
    could never re-measure the T and D that excluded them.

Probation: measure before trust, make before break (``ActivationCore``)
    An advertisement is a claim; a measurement is evidence. A worker is *proven* once, since it joined
    (a leave and a join start it over, but lift no penalty: Leaving), a full ``rate_window`` of
    measurement backs the rate the plan counts on from it: its measured rate (from its first delivery
    while active, Measured rates) lies within the drift band of that rate, or a positive measured rate
    was adopted. Every other worker is *unproven*. One delivery is not enough: a worker advertising
    1e9/s that delivers one completion per activation would otherwise be planned at 1e9/s until its
    measured 0 is adopted, and every honest proven worker dropped meanwhile; so before a worker may
    displace anyone, the plan counts on it at no more than the drift band allows above what it has
    shown.
    A re-advertised rate the plan takes up (beyond the band, while unmeasured) is a new claim: the
    worker is unproven again until a window backs it. An unproven worker whose own re-advertisement
    takes it off its trial has failed its claim and waits as a re-try (a new join): otherwise it
    could step out with a costly offer just before ``first_rollout_timeout`` and come back cheap
    with a fresh clock, never measured (red team round 10, R10-1). The same holds when the plan
    drops an unproven worker for a rival's claim before it delivered anything: it is a re-try, and
    once it was silent as long as ``first_rollout_timeout`` allows its claim counts as failed (at a
    cold start an unjudged trial is not dropped at all: below, make before break for trials). An
    unproven worker the plan excludes on its own figures (a delivery so large that its modelled
    tail misses the staleness bound, a measured 0) has failed its claim too, and waits as a re-try
    (red team round 14: one large delivery before ``first_rollout_timeout`` ended each trial while
    the next identity was picked; honest 0% of a learner start's hour, now 96.7%). A trial
    activated and dropped at the same instant (within one ``handle_all`` batch) never began: it
    costs no trial token and no join place.
    The core plans among all eligible workers as above, then, if some proven worker qualifies and
    some unproven one would be used beside them:

    * the active set is ``plan(proven workers)`` (they cover the need on their own, at their own
      rates and targets) plus unproven candidates on *probation*: an unproven worker never causes
      a proven one to be deactivated or its target to be lowered; proven workers the full plan
      would have dropped stay active, their leases renewed, with ``Plan.kept`` saying so ("kept:
      proven, while <peers> on probation");
    * the candidates are the unproven workers the plan would use beside the proven ones, each
      judged on its own claim (those proven workers cheaper per completion do not cover the need
      without it), by the latency rule only while the proven workers (their latency top-up
      included) cover the need: a fresh worker just outside ``S * T`` has its own D measured
      before a window can prove it, and only proven workers top up, so judged by the rule it was
      dropped before its first delivery for ever (red team round 18, F1: 1,500 completions of
      36,000 beside one proven identity, 18,000 with no attacker). When probation takes none of
      the unproven workers the full plan would use, the plan is the proven workers' own: the
      full plan's pick of a silent dearer claim had replaced a proven worker outside probation
      (F2: -37%). Not the unproven picks of one plan among them all: an unproven claim is what
      probation measures, and one of 1e9/s covers any need alone, so it would be the only
      candidate, and fresh identities making such claims in turn kept every other newcomer off
      probation (red team round 9, R9-2);
    * at most ``max_probation`` unproven workers are active at once: candidates already on
      probation keep their place, new ones take the free places in the order they joined, the
      rest wait (``Plan.waiting``), so a flood of offers costs at most ``max_probation`` Activates
      at a time, and a later claim, however cheap, cannot jump ahead of one that waits. A
      re-probe, a restart or a leave and a join is a new join: a worker that failed waits behind
      those that joined before its new chance. A worker proven when it restarts or leaves keeps
      its join place for its next run (it earned it by delivering), once per penalty memory; so
      does one whose proof lapsed idle, and one never tried restarting (it failed nothing): a
      cheap cover kept honest workers idle or untried, their restart queued them behind 64
      identities that joined after them, and those were tried first when the cover stopped (red
      team round 23: 28.1-47.4% in ``rst2`` and ``slowrst2``, now 94.9-97.1%); and
      new trials get tokens in join order: a restart of every honest worker had queued them
      behind every identity that joined meanwhile, and those identities took every token (red
      team round 16, 0% over 3,000 s; now back within 20 s). A trial token comes back at most
      once per identity per penalty memory, across its restarts and rejoins (round 17:
      identities proven once on tiny output, restarting whenever their refund had lapsed, cost
      2,341 Activates an hour from 64);
    * new trials are also paced: while trials are limited (some worker is proven, or a claim has
      failed) at most ``max_probation`` start at once and ``max_probation`` per
      ``first_rollout_timeout`` after that (a token bucket), since each is an Activate and a
      weight fetch and free identities could otherwise make the learner send thousands an hour
      (red team round 10, R10-3: 5,756 an hour from 8 identities at a time, now about 124). A
      trial that proves its worker gives back the token it spent (only that one, once), and the
      places grow to the number of proven workers when that is more than ``max_probation``
      (proven capacity was delivered, so cannot be faked): honest capacity ramps up by doubling
      (round 11, R11-3). A worker that leaves, restarts or re-advertises itself off its proof
      within ``first_rollout_timeout`` of that refund pays the token after all (the bucket may go
      into debt): identities passing trials on tiny real output and leaving cost a token each
      (round 12, R12-2: 439-864 Activates an hour, now about 121);
    * when a probationer is proven (a full window of measurement backs its rate), the core
      re-plans if anything was kept, waiting or on probation: the normal rule may now drop the
      proven workers it replaces, and probationers it does not need. One that never delivers
      measures 0 after ``first_rollout_timeout`` and drops out; one whose measurement does not
      back its claim drifts, and once the drift is adopted the plan counts on what it measured.

    With no proven worker qualifying (cold start) the plan is the plain rule on advertised rates,
    with no cap: someone has to be tried. Three exceptions:

    * re-tried workers (re-probed, or restarted or rejoined after they were tried unproven) come
      last: the plan is among the never-tried workers when they cover the need, among all of
      them otherwise;
    * once a claim has failed in this run (an unproven worker measured at 0, or one that left,
      restarted, or re-advertised itself off its trial before it was proven: a fresh identity per claim,
      leaving before it can be measured, would otherwise never arm this; red team round 9, R9-1),
      every pick may be the next false claim (one that covers the need alone, several that do
      together, tiny ones first in plan order: R8-1, R10-2). So at most half the ``max_probation``
      places (at least one) go to the plan's picks, in plan order, and the rest to the other
      workers in the order they joined (``Plan.probation``): fresh identities join after the
      honest workers already waiting, and one tried and failed is re-tried from then on. Before
      any claim failed, a start with honest workers only plans exactly as the plain rule does;
    * make before break for trials: an active worker that has not been judged yet (delivering with
      its window not yet full, or silent within ``first_rollout_timeout``) stays active if that
      plan drops it (``Plan.kept``) until it is proven or measured at 0. A claim nobody measured
      yet must not cut off the rollouts the learner is already getting, nor end a trial before
      its verdict: fresh identities each displacing the last before it could be judged kept every
      claim unjudged, no claim ever failed, and honest workers were off for good (red team rounds
      11 and 12, R11-1, R12-1: honest 0% of an hour, now 95.8%). Trials begun at the same instant
      are not kept (offers that arrive together, as at a start, are planned as the plain rule
      plans them). A start where cheaper honest offers keep arriving costs the dearer trials under
      way one more window each, and arms nothing (R12-3). New trials beside kept ones are paced by
      the trial tokens, as once a claim failed: otherwise a fresh claim per recruit round, each
      kept, piled up unjudged trials (red team round 13: 256 at once, 23,750 Activates an hour).

    ``policy="all"`` activates every qualifying proven worker and, with the same cap, unproven ones.

Dissemination
    Each worker is judged on its own D: ``D_i + T_gen_tail_i <= S * T``. The need's D is the least
    of the workers' own and the learner-wide D (``dissemination`` until one is measured), and a
    worker's excess over it is added to its planned tail. An inactive worker is told no new
    versions, so its own D is forgotten ``reprobe_seconds`` after it was last measured (a download
    hiccup must not keep a worker out for good); a proven worker whose own D is not measured (not
    yet, or forgotten) counts as unproven for probation until it is, so it is re-checked beside the
    proven workers, never in place of one (red team round 18: two slow-link workers swapped places
    every ~100 s, each measured late again before its first delivery: 25,740 completions of 36,000).
    So a worker that announces its weights late excludes only itself, and the latency fallback
    (nearest to meeting the rule) sees it too: one shared D let three late identities push it past
    ``S * T`` and keep proven honest workers out 98% of the hour, kept by the fallback for their own
    tiny modelled tails (red team round 15).

Driving ``ActivationCore``
    ``handle(event, now)`` and ``poll(now)`` return actions; the driver performs all of them, in
    order. ``handle_all(events, now)`` takes the events of one instant (a recruit round's joins and
    leaves) and leaves out the Activate and Deactivate of a worker inactive before and after them.
    A worker's measured rate is judged against the rate the plan counts on; a new target it is
    sent (its own re-advertisement re-planned) does not restart its drift hold (red team round 13:
    a silent claim re-advertising beyond the band every 20 s was never judged).
    ``next_deadline()`` is when to call ``poll`` at the latest (``None``: only when an event
    arrives; a value in the past: now). If ``now`` goes backwards the core holds its last value.

    =========================  =============================================================
    event                      meaning
    =========================  =============================================================
    ``WorkerJoined(offer)``    a worker offers (or re-advertises: same peer, new figures);
                               re-plan on a new worker or a material change (price, a tail
                               latency that changes whether it meets the staleness bound,
                               or rate beyond ``drift_fraction`` while unmeasured)
    ``WorkerLeft(peer)``       gone (record expired, disconnected); re-plan if it mattered;
                               no ``Deactivate`` is sent to a peer that left; a penalty it
                               earned unproven is kept for its next join (Leaving)
    ``StepMeasured``           one learner step took ``step_seconds`` of compute after
                               ``wait_seconds`` waiting for rollouts; refines T (EWMA) and
                               measured utilization; re-plan when T leaves the
                               ``drift_fraction`` band around the T of the current plan
    ``DisseminationMeasured``  a weight version reached ``peer`` D s after it was published to
                               it (that worker's own EWMA; no peer: the learner-wide one);
                               re-plan when that changes which workers meet the latency
                               constraint (Dissemination)
    ``RolloutsReceived``       ``count`` completions (one delivery) arrived from an active
                               worker; its first one proves the worker (see Probation); its
                               size models the worker's tail latency (see Tail latency)
    ``PeerBanned``             (core.events) the peer may not be active until ``until``
    ``WorkerMisbehaved``       the same, with the reason the worker is told (e.g. a failed
                               spot check); ``until`` may be ``math.inf`` (for this run)
    =========================  =============================================================

    ================  ======================================================================
    action            driver does
    ================  ======================================================================
    ``Activate``      send the wire ``Activate`` (adding model id and policy version):
                      generate at ``target_rate`` for ``lease_seconds``; ``renewal=True``
                      extends a running lease with unchanged figures
    ``Deactivate``    send the wire ``Deactivate(peer, reason)``
    ``PlanChanged``   a re-plan happened: publish ``plan`` in /status and /metrics
                      (including ``kept``, ``probation`` and ``waiting``)
    ``Forget``        the core starts ``peer`` over (a restart or a re-probe): forget what
                      was sent to it (the weight versions it was told, their timings)
    ================  ======================================================================

    Within one call, activations come before deactivations, so capacity never dips in between.
    ``Activate``/``Deactivate`` are emitted only for changes (a worker entering or leaving the
    active set, or its target rate changing after a drift); leases are renewed ``renew_before``
    seconds before they lapse.

Measured rates and drift
    An active worker's output is measured from its first delivery after activation (that first
    delivery only marks the start: generation and weight download come before it), over the last
    ``rate_window`` seconds, once a full window has passed. A worker that delivers nothing within
    ``first_rollout_timeout`` of activation measures 0. A worker drifts when its measured rate is
    more than ``drift_fraction`` away from the rate the plan counts on, or short of it by more than
    the margin absorbs (red team round 19: a claim of 12/s delivering 9/s, inside the band, had
    covered the need alone); a drift that lasts ``drift_hold`` seconds is adopted (the plan now
    counts on the measured rate) and the core re-plans. With ``drift_hold >= rate_window`` (the
    default) a step change in a worker's output is adopted once, at its settled value, not at the
    intermediate values the window passes through.
    Hysteresis: after adoption the band is centred on the new rate, so a rate wobbling
    around a band edge re-plans once, not on every sample; step time is smoothed and banded the
    same way. A measured rate, once adopted, outranks the worker's own advertisement until the worker
    is started over (so a worker measured at 0 stays out of the plan until its re-probe, even if
    it leaves and joins again: Restarts and re-probes).
    Flap damping (as BGP damps flapping routes, RFC 2439): a proven worker whose rate is adopted
    *down* (measured below the rate the plan counted on, 0 included) for the k-th time within the
    penalty memory (an hour at the default), k >= 2, is untrusted for
    ``(first_rollout_timeout + rate_window) * 2 ** (k - 2)`` seconds (at most the penalty memory):
    it is on probation, beside the trusted workers and never in place of one, as a worker not yet
    proven is. The workers its slowdown switched on need up to ``first_rollout_timeout`` for a first
    delivery and a window to be proven; trusted at once, its recovery dropped them before they
    delivered, every time (red team round 20: an identity alternating 12/s and 1/s every 45 s held
    the learner at 53.7% of its completions, honest workers delivering nothing; now 100%). Its
    recovery is still adopted (the plan counts on what it delivers); when the hold ends ``poll``
    re-plans and the plan may use it in place of the others again. One drop is not a flap: honest
    workers whose measured rate wanders near the drift band drop now and then, and holding them
    from the first drop cost an honest swarm 12% more per step (``activation_policies``: 0.699
    instead of 0.623). A restart, a re-probe or a leave and a join does not lift a hold. A claim
    measured below itself before it was proven is not a drop (that is what probation measures).
    A proven worker that leaves or restarts while falling short of its planned rate (a drift not
    yet adopted) dropped all the same, and its claim failed (cold starts hedge from then on). One
    that leaves or restarts while active at full rate dropped too, and its claim failed: the plan
    counted on it (red team round 23). At full rate, a leave is a drop of the role (below: a fresh
    identity may take its place) and a restart a drop of the identity, which comes back with it
    (counted for the role, 32 identities restarting once each held every worker proven later for
    the hour: round 24).
    The new-trust hold damps the role, not the identity, since fresh identities are free: a worker
    just proven is trusted ``(first_rollout_timeout + rate_window) * 2 ** j`` seconds later (at most
    the penalty memory), j the drops of proven workers, any of them, within the penalty memory;
    until then it is on probation beside the trusted workers (``trust_hold``, on by default).
    Trusted one window after its first delivery, a fresh identity displaced the honest workers,
    stalled, and left before its stall was adopted, and the next one did the same (red team round
    21: 42.7% of the completions in every world, honest workers never tried; with one fresh
    identity per slowdown, 72.8%; now 100% and 100%). A cheaper honest newcomer replaces dearer
    workers that much later: the learner pays for them meanwhile, and loses no rollouts.
    A proven worker inactive for ``reprobe_seconds`` is unproven again (its proof lapses): its
    proof spoke for output it delivered then. Re-activated, it is on trial (a trial token), is
    proven anew and trusted after the new-trust hold (red team round 22: 24 price-0 identities
    proven early and banked idle, each re-activated trusted when the last one stalled, kept the
    learner at 0% for the hour; now 94.3-96.8% in eight worlds, 81.7% in ``new2``).

Tail latency
    A worker's ``gen_tail_latency`` is the driver's when the offer carries one; otherwise the core
    models it from the worker's last delivery of ``n`` completions (``RolloutsReceived.count``) and
    its advertised rate ``r``: ``T_gen_tail = 2 * n / r``. A version that lands mid-delivery waits
    for that delivery, then the next one is generated with it, so the slowest group made with it
    arrives about two delivery times later. Unknown (no delivery yet) counts as 0 (The rule). A
    delivery of a new size re-plans when the tail it models changes whether the worker meets the
    staleness bound (the same test as a re-advertised tail).

Restarts and re-probes: starting a worker over
    Starting a worker over forgets what was measured of it, as a leave and a join would: the plan
    counts on its advertisement again, it is unproven, its rate is measured afresh; the core
    re-plans (as for a leave, then as for a join) and emits ``Forget``.

    * Restart: a ``WorkerJoined`` whose ``offer.address`` differs from the one held (both known)
      is a new run of the worker; nothing its previous run did (or failed to deliver while it was
      down) may outrank the new offer. The worker is started over with the new offer, with two
      exceptions, since an address is the worker's own to change: a restart does not lift a
      penalty. A worker measured at 0 and out keeps the new offer but is started over only when
      its re-probe is due (below), as if it had not restarted; a worker restarting after it was
      tried and before it was proven counts as re-probed (it waits behind workers never tried).
    * Re-probe: a measured rate, once adopted, outranks the advertisement until the worker is started
      over, so a worker that stalled for one window (weights over a slow link, a busy host) would stay
      out for good. A worker measured at 0 that still advertises a positive rate and is not banned is
      started over by ``poll`` ``reprobe_seconds`` after it was measured at 0 (and so at most once per
      ``reprobe_seconds``): a new chance once a while, never an ``Activate`` chasing the ``Deactivate``
      that measurement caused. It keeps its last delivery size (same run, same tail), and for a
      probation place it waits behind workers never tried (Probation).
    * Leaving does not lift a penalty: a worker that leaves unproven after it was tried (measured
      at 0, re-probed, or activated) is remembered (``PENALTY_MEMORY_REPROBES`` re-probe
      intervals, an hour at the default; at most ``max_workers`` peers, the oldest forgotten
      first). When it joins again, a worker measured at 0 is out until its re-probe is due, as if
      it had stayed; any other is re-tried (behind workers never tried). So a leave and a join,
      which cost nothing, are no faster than a re-probe (red team round 8, R8-1, R8-5, R8-6). A
      worker that left proven, or never tried, is new again when it joins.

Measured utilization
    Share of learner wall time spent stepping: ``sum(step) / sum(step + waited)`` over the
    ``StepMeasured`` events of the last ``utilization_window`` seconds (None before the first).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace

from swarmnode.core.events import PeerBanned, PeerId
from swarmnode.core.limits import TokenBucket
from swarmnode.errors import ConfigError

_EPS = 1e-9  # relative slack for float comparisons against hand-computed thresholds
MAX_LEASE_SECONDS = 86_400  # the wire's bound on Activate.lease_seconds
# A version landing mid-delivery waits for that delivery, then its own is generated (Tail latency).
TAIL_DELIVERIES = 2.0
# A worker that left unproven has its penalty remembered this many re-probe intervals (an hour at the
# default reprobe_seconds), long past the re-probe it could otherwise skip by leaving and joining.
PENALTY_MEMORY_REPROBES = 60
# Down-adoptions of a proven worker remembered for flap damping (Measured rates: Flap damping); the
# hold doubles with each, so a few more than the doublings that reach the penalty memory suffice.
MAX_DOWN_ADOPTIONS = 16
# A hold starts with the second drop within the penalty memory (as BGP route-flap damping
# suppresses a route once its penalty passes two flaps' worth): one slowdown is not a flap, and
# honest workers whose measured rate wanders near the drift band drop now and then.
FLAP_SUPPRESS = 2
# Learner-wide drops remembered (the newest): the new-trust hold doubles with each, so a few more
# than the doublings that reach the penalty memory suffice; bounded whatever the churn.
MAX_LEARNER_DROPS = 64


def _positive(prefix: str, name: str, value: float) -> None:
    if isinstance(value, bool) or not (isinstance(value, int | float) and value > 0 and math.isfinite(value)):
        raise ConfigError(f"{prefix}.{name} must be a positive finite number, got {value!r}")


def _non_negative(prefix: str, name: str, value: float) -> None:
    if isinstance(value, bool) or not (
        isinstance(value, int | float) and value >= 0 and math.isfinite(value)
    ):
        raise ConfigError(f"{prefix}.{name} must be a finite number >= 0, got {value!r}")


def _integer(prefix: str, name: str, value: int, low: int, high: int | None = None) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        bound = f">= {low}" if high is None else f"in {low}..{high}"
        raise ConfigError(f"{prefix}.{name} must be an integer {bound}, got {value!r}")


# ---------------------------------------------------------------------------------------------
# The pure rule.


@dataclass(frozen=True)
class WorkerOffer:
    """What a worker offers: its rate (completions/s), price (per 1,000 completions), hardware text,
    and its generation tail latency in seconds when known (time from receiving a version to
    delivering its slowest group generated with it; None: unknown, and ``ActivationCore`` models it
    from the worker's deliveries, see Tail latency in the module docstring).

    ``address``: where this run of the worker is reached (its data-plane addresses and libp2p id,
    in any stable spelling; "" when unknown). ``ActivationCore`` takes a new address for a known
    worker as a restart (module docstring, Restarts and re-probes)."""

    peer: PeerId
    rate: float
    price: float
    hardware: str = ""
    gen_tail_latency: float | None = None
    address: str = ""

    @property
    def price_per_completion_rate(self) -> float:
        """``c_i / r_i``: the sort key (price per 1,000 completions per completion/s)."""
        return self.price / self.rate if self.rate > 0 else math.inf


@dataclass(frozen=True)
class Need:
    """What the learner needs: step time T (s), rollouts per step B (completions), dissemination
    time D (s, one weight broadcast), staleness bound S (versions) and the capacity margin."""

    step_time: float
    batch: int
    dissemination: float
    staleness: int
    margin: float = 0.1

    def __post_init__(self) -> None:
        _positive("need", "step_time", self.step_time)
        _integer("need", "batch", self.batch, 1)
        _non_negative("need", "dissemination", self.dissemination)
        _integer("need", "staleness", self.staleness, 0)
        _non_negative("need", "margin", self.margin)

    @property
    def required_rate(self) -> float:
        """``(1 + margin) * B / T`` completions per second."""
        return (1.0 + self.margin) * self.batch / self.step_time

    @property
    def latency_budget(self) -> float:
        """``S * T`` seconds: how late, after a version is published, a group of it may arrive."""
        return self.staleness * self.step_time


@dataclass(frozen=True)
class Exclusion:
    """A worker the plan could not use, and why (human text, also the ``Deactivate`` reason)."""

    peer: PeerId
    reason: str


@dataclass(frozen=True)
class Kept:
    """A worker held in (or out of) the active set by the probation rule, and why (human text)."""

    peer: PeerId
    reason: str


@dataclass(frozen=True)
class Plan:
    """The outcome of ``plan``; every figure is derived from ``workers`` and ``need``.

    ``workers``: the active set, in activation order (cheapest per completion first).
    ``predicted_rate``: R = sum of their rates. ``required_rate``: (1 + margin) * B / T.
    ``predicted_utilization``: min(1, R * T / B), the learner's predicted busy share.
    ``cost_per_step``: sum over active workers of ``price / 1000 * rate * T``: the price of what the
    active workers produce during one learner step (they produce R * T >= B completions; the
    surplus of the margin is paid for too).
    ``feasible``: R reaches the required rate; otherwise ``reason`` says why not.
    ``excluded``: workers that do not qualify, with reasons (never in ``workers``).
    ``kept``, ``probation``, ``waiting`` (``ActivationCore`` only; see Probation in the module
    docstring): proven workers active only because unproven ones are on probation, with the
    reason; the unproven workers in ``workers``; unproven workers the plan picked that wait for a
    probation place, with the reason (never in ``workers``).
    """

    workers: tuple[WorkerOffer, ...]
    need: Need
    predicted_rate: float
    required_rate: float
    predicted_utilization: float
    cost_per_step: float
    feasible: bool
    reason: str = ""
    excluded: tuple[Exclusion, ...] = ()
    kept: tuple[Kept, ...] = ()
    probation: tuple[PeerId, ...] = ()
    waiting: tuple[Kept, ...] = ()

    @property
    def active(self) -> tuple[PeerId, ...]:
        return tuple(w.peer for w in self.workers)

    def rate_of(self, peer: PeerId) -> float | None:
        """The rate the plan counts on from ``peer`` (None: not active)."""
        return next((w.rate for w in self.workers if w.peer == peer), None)

    def as_dict(self) -> dict[str, object]:
        """Plain data for /status and /metrics."""
        return {
            "active": list(self.active),
            "target_rates": {w.peer: w.rate for w in self.workers},
            "predicted_rate": self.predicted_rate,
            "required_rate": self.required_rate,
            "predicted_utilization": self.predicted_utilization,
            "cost_per_step": self.cost_per_step,
            "feasible": self.feasible,
            "reason": self.reason,
            "excluded": {e.peer: e.reason for e in self.excluded},
            "kept": {k.peer: k.reason for k in self.kept},
            "probation": list(self.probation),
            "waiting": {k.peer: k.reason for k in self.waiting},
            "need": asdict(self.need),
        }


def exclusion_reason(offer: WorkerOffer, need: Need, *, check_latency: bool = True) -> str | None:
    """Why ``offer`` cannot be used for ``need`` (None: it qualifies); ``check_latency=False``
    skips the staleness-bound rule (``D + T_gen_tail <= S * T``)."""
    rate, price, tail = offer.rate, offer.price, offer.gen_tail_latency
    if not (math.isfinite(rate) and rate >= 0 and math.isfinite(price) and price >= 0):
        return f"invalid offer: rate {rate!r}, price {price!r}"
    if tail is not None and not (math.isfinite(tail) and tail >= 0):
        return f"invalid offer: generation tail latency {tail!r}"
    if rate == 0:
        return "no rollout rate (0 completions/s)"
    if not check_latency:
        return None
    latency = need.dissemination + (tail or 0.0)
    budget = need.latency_budget
    if latency > budget * (1 + _EPS) + _EPS:
        tail_text = "unknown, taken as 0" if tail is None else f"{tail:.4g} s"
        return (
            f"too slow for the staleness bound: D + T_gen_tail = {need.dissemination:.4g} s + {tail_text} "
            f"= {latency:.4g} s > S * T = {need.staleness} * {need.step_time:.4g} s = {budget:.4g} s"
        )
    return None


def modelled_tail(offer: WorkerOffer, delivery: int) -> float | None:
    """The worker's tail latency (module docstring, Tail latency): the offer's own when it has
    one, else ``2 * delivery / rate`` from its last delivery; None while neither is known."""
    if offer.gen_tail_latency is not None:
        return offer.gen_tail_latency
    if delivery > 0 and offer.rate > 0:
        return TAIL_DELIVERIES * delivery / offer.rate
    return None


def _order(offer: WorkerOffer) -> tuple[float, float, PeerId]:
    return (offer.price_per_completion_rate, -offer.rate, offer.peer)


def _utilization(rate: float, need: Need) -> float:
    """Share of the learner's time a set delivering ``rate`` completions/s keeps it stepping."""
    return min(1.0, rate * need.step_time / need.batch)


def _cost_per_step(workers: Iterable[WorkerOffer], need: Need) -> float:
    """What ``workers`` cost for one step's worth of completions at their planned rates."""
    return sum(w.price / 1000.0 * w.rate * need.step_time for w in workers)


def plan(
    offers: Iterable[WorkerOffer], need: Need, *, all_on: bool = False, check_latency: bool = True
) -> Plan:
    """The ECHO-2 activation rule (module docstring). Raises ValueError on a repeated peer id.

    ``all_on=True`` is the baseline the rule is measured against: every qualifying worker is
    active (same order, same figures), whatever the need. ``check_latency=False`` plans without
    the staleness-bound rule (``ActivationCore``'s fallback when nobody meets it).
    """
    qualified: list[WorkerOffer] = []
    excluded: list[Exclusion] = []
    seen: set[PeerId] = set()
    for offer in offers:
        if offer.peer in seen:
            raise ValueError(f"two offers from peer {offer.peer!r}")
        seen.add(offer.peer)
        reason = exclusion_reason(offer, need, check_latency=check_latency)
        if reason is None:
            qualified.append(offer)
        else:
            excluded.append(Exclusion(offer.peer, reason))
    qualified.sort(key=_order)

    required = need.required_rate
    active: list[WorkerOffer] = []
    rate = 0.0
    for offer in qualified:
        if rate >= required * (1 - _EPS) and not all_on:
            break
        active.append(offer)
        rate += offer.rate
    feasible = bool(active) and rate >= required * (1 - _EPS)
    utilization = _utilization(rate, need)
    cost = _cost_per_step(active, need)
    reason = ""
    if not qualified:
        reason = (
            "no worker qualifies: no offers"
            if not excluded
            else f"no worker qualifies: all {len(excluded)} offers are excluded (see excluded)"
        )
    elif not feasible:
        reason = (
            f"not enough capacity: all {len(active)} qualifying workers together give {rate:.4g} "
            f"completions/s, the need is {required:.4g}/s ((1 + {need.margin:g}) * B {need.batch} / "
            f"T {need.step_time:.4g} s); every qualifying worker is active, predicted utilization "
            f"{utilization:.0%}"
        )
    return Plan(
        workers=tuple(active),
        need=need,
        predicted_rate=rate,
        required_rate=required,
        predicted_utilization=utilization,
        cost_per_step=cost,
        feasible=feasible,
        reason=reason,
        excluded=tuple(excluded),
    )


# ---------------------------------------------------------------------------------------------
# The stateful core: configuration.


@dataclass(frozen=True)
class ActivationConfig:
    """Every knob of ``ActivationCore``; see the module docstring for units."""

    batch: int  # B, completions per learner step
    staleness: int  # S, versions
    step_time: float  # initial estimate of T (s), used until the first StepMeasured
    dissemination: float = 0.0  # initial estimate of D (s), used until the first DisseminationMeasured
    margin: float = 0.1
    lease_seconds: int = 60
    renew_before: float = 20.0  # renew a lease this long before it lapses; < lease_seconds
    # Re-plan when a measured rate (or T) leaves this band around the planned one ...
    drift_fraction: float = 0.25
    # ... and stays out this long (>= rate_window: a step change is adopted once, settled). T is smoothed
    # instead and re-plans as soon as it leaves the band.
    drift_hold: float = 30.0
    check_interval: float = 5.0  # how often poll re-checks measured rates while workers are active
    rate_window: float = 30.0  # measured rate = completions in the last window / window
    first_rollout_timeout: float = 120.0  # an active worker silent this long after activation measures 0
    smoothing: float = 0.3  # EWMA weight of the newest step time / dissemination time
    utilization_window: float = 120.0
    max_workers: int = 4096
    max_samples_per_worker: int = 256  # rate-window samples kept per worker (older ones are merged)
    policy: str = "planner"  # "planner": the ECHO-2 rule; "all": every qualifying worker (the baseline)
    # Unproven workers (no delivery yet) active at once beside proven ones (module docstring, Probation).
    max_probation: int = 4
    # A worker measured at 0 is started over at most this often (module docstring, Restarts and re-probes).
    reprobe_seconds: float = 60.0
    # A worker just proven is trusted (may displace others) only after the new-trust hold (module
    # docstring, Measured rates: Flap damping). False only to state the other rules without it.
    trust_hold: bool = True

    def __post_init__(self) -> None:
        p = "activation"
        _integer(p, "batch", self.batch, 1)
        _integer(p, "staleness", self.staleness, 0)
        _positive(p, "step_time", self.step_time)
        _non_negative(p, "dissemination", self.dissemination)
        _non_negative(p, "margin", self.margin)
        _integer(p, "lease_seconds", self.lease_seconds, 1, MAX_LEASE_SECONDS)
        _positive(p, "renew_before", self.renew_before)
        if self.renew_before >= self.lease_seconds:
            raise ConfigError(
                f"activation.renew_before ({self.renew_before}) must be less than activation.lease_seconds "
                f"({self.lease_seconds}), or every lease would be renewed as soon as it is granted"
            )
        _positive(p, "drift_fraction", self.drift_fraction)
        _non_negative(p, "drift_hold", self.drift_hold)
        _positive(p, "check_interval", self.check_interval)
        _positive(p, "rate_window", self.rate_window)
        _positive(p, "first_rollout_timeout", self.first_rollout_timeout)
        _positive(p, "smoothing", self.smoothing)
        if self.smoothing > 1:
            raise ConfigError(f"activation.smoothing must be in (0, 1], got {self.smoothing!r}")
        _positive(p, "utilization_window", self.utilization_window)
        _integer(p, "max_workers", self.max_workers, 1)
        _integer(p, "max_samples_per_worker", self.max_samples_per_worker, 2)
        _integer(p, "max_probation", self.max_probation, 1, self.max_workers)
        _positive(p, "reprobe_seconds", self.reprobe_seconds)
        if not isinstance(self.trust_hold, bool):
            raise ConfigError(f"activation.trust_hold must be true or false, got {self.trust_hold!r}")
        if self.policy not in ("planner", "all"):
            raise ConfigError(f"activation.policy must be 'planner' or 'all', got {self.policy!r}")


# ---------------------------------------------------------------------------------------------
# Events (PeerBanned lives in core.events).


@dataclass(frozen=True)
class WorkerJoined:
    """A worker offers to generate (first time, or a re-advertisement with new figures)."""

    offer: WorkerOffer


@dataclass(frozen=True)
class WorkerLeft:
    """The worker is gone (record expired, connection lost, it said goodbye)."""

    peer: PeerId


@dataclass(frozen=True)
class StepMeasured:
    """One learner step: ``step_seconds`` of compute, after ``wait_seconds`` waiting for rollouts."""

    step_seconds: float
    wait_seconds: float = 0.0


@dataclass(frozen=True)
class DisseminationMeasured:
    """One weight version reached ``peer`` (every chunk verified there, by its own announcement)
    ``seconds`` after it was published to it; ``peer`` None: reached the workers (no one worker)."""

    seconds: float
    peer: PeerId | None = None


@dataclass(frozen=True)
class RolloutsReceived:
    """``count`` completions (e.g. one group of G) arrived from ``peer`` (at the call's ``now``)."""

    peer: PeerId
    count: int


@dataclass(frozen=True)
class WorkerMisbehaved:
    """Exclude ``peer`` until ``until`` (``math.inf``: for this run) and tell it ``reason``."""

    peer: PeerId
    reason: str
    until: float = math.inf


ActivationEvent = (
    WorkerJoined
    | WorkerLeft
    | StepMeasured
    | DisseminationMeasured
    | RolloutsReceived
    | PeerBanned
    | WorkerMisbehaved
)


# ---------------------------------------------------------------------------------------------
# Actions.


@dataclass(frozen=True)
class Activate:
    """Ask ``peer`` to generate at ``target_rate`` completions/s for ``lease_seconds``."""

    peer: PeerId
    target_rate: float
    lease_seconds: int
    renewal: bool = False  # True: the same figures as the running lease, only extended


@dataclass(frozen=True)
class Deactivate:
    """Tell ``peer`` to stop generating for us."""

    peer: PeerId
    reason: str


@dataclass(frozen=True)
class PlanChanged:
    """A re-plan happened (``cause`` in words); ``plan`` is what /status should show now."""

    plan: Plan
    cause: str


@dataclass(frozen=True)
class Forget:
    """The core started ``peer`` over (``reason``: a restart or a re-probe): forget what was sent
    to its previous run (the weight versions it was told, their dissemination timings)."""

    peer: PeerId
    reason: str


ActivationAction = Activate | Deactivate | PlanChanged | Forget


# ---------------------------------------------------------------------------------------------
# Observability.


@dataclass
class ActivationStats:
    """Monotonic counters, for metrics and tests."""

    joins: int = 0
    leaves: int = 0
    workers_refused: int = 0  # joins beyond max_workers
    replans: int = 0
    drift_replans: int = 0
    activations: int = 0
    rate_changes: int = 0
    renewals: int = 0
    deactivations: int = 0
    steps: int = 0
    rollouts_received: int = 0
    rollouts_unsolicited: int = 0  # from a worker that is not active (late or uninvited)
    latency_fallbacks: int = 0  # plans made without the staleness-bound rule (nobody met it)
    probations_passed: int = 0  # probationers whose full window of measurement re-planned (kept or waiting)
    restarts: int = 0  # workers started over because they came back at a new address
    reprobes: int = 0  # workers measured at 0 started over to be measured again
    flap_holds: int = 0  # holds of proven workers whose rate kept falling (flap damping)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class WorkerStatus:
    peer: PeerId
    active: bool
    planned_rate: float  # the rate the planner counts on (advertised, or measured once adopted)
    measured_rate: float | None  # None: not measurable yet (inactive or window not full)
    price: float
    hardware: str
    lease_expires_at: float | None
    banned_until: float | None
    proven: bool = False  # a full rate window since it joined backs a positive planned rate
    dissemination: float | None = None  # its own D (s), None: not measured (or forgotten)
    held_until: float | None = None  # untrusted until then by flap damping (None: no hold now)


@dataclass(frozen=True)
class ActivationStatus:
    plan: Plan
    step_time: float
    dissemination: float
    measured_utilization: float | None
    workers: tuple[WorkerStatus, ...]
    stats: dict[str, int]


# ---------------------------------------------------------------------------------------------
# Internal state.


@dataclass
class _Worker:
    offer: WorkerOffer
    planned_rate: float  # offer.rate until a measurement is adopted
    measured_adopted: bool = False
    backed: bool = False  # a full rate window of measurement since it joined backs planned_rate (proven)
    active: bool = False
    target_rate: float = 0.0
    lease_expires_at: float = -math.inf
    activated_at: float = -math.inf
    measure_from: float | None = None  # first delivery after activation
    samples: deque[tuple[float, int]] = field(default_factory=deque)
    drift_since: float | None = None
    delivery: int = 0  # completions in its last delivery (0: none yet); models its tail latency
    zeroed_at: float | None = None  # when a measured rate of 0 was adopted (the re-probe rule)
    reprobes: int = 0  # times it was started over by a re-probe (it waits behind untried workers)
    joined: int = 0  # join order (a leave, restart or re-probe joins anew): probation goes to who waited
    trial_token: bool = False  # its trial spent a trial token, not yet given back
    dissemination: float | None = None  # its own D (EWMA), from its weight announcements
    dissemination_at: float = -math.inf  # when its D was last measured
    refunded_at: float | None = None  # when its proof gave its trial token back (until taken back)
    last_refund_at: float | None = None  # its last refund, kept across restarts and rejoins
    place_kept_at: float | None = None  # when a restart or rejoin last kept its join place
    # Flap damping: when its rate, proven, was adopted down (within the penalty memory), and until
    # when that keeps it untrusted (None: no hold pending). Kept across restarts, re-probes, rejoins.
    down_adoptions: deque[float] = field(default_factory=lambda: deque(maxlen=MAX_DOWN_ADOPTIONS))
    held_until: float | None = None
    idle_since: float | None = None  # proven and deactivated then: its proof lapses after reprobe_seconds
    lapsed: bool = False  # its proof lapsed idle (not failed): it keeps its join place as if proven
    # When it, proven and active, re-advertised a rate off its proof (its own doing; kept across a
    # restart): if it then leaves, that is a drop of the role (red team round 25, F4).
    unproved_at: float | None = None
    # Proven, but its last activation ended before a full window in it backed its planned rate (it
    # was deactivated silent or falling short): untrusted until a window in a later activation backs
    # it (red team round 26: a proven identity re-activated by its own price undercut, silent for
    # less than first_rollout_timeout each time, displaced the honest workers for ever).
    cold: bool = False
    # Proven, and deactivated after a window backed it: untrusted while some other worker is
    # trusted, until a window in a later activation backs it (red team round 27: a partner's
    # undercut, or its own late weight announcements, took a trusted identity out while silent,
    # before its silence was adopted; re-warmed by one window on probation, it was trusted again,
    # no drop ever recorded: 58-61% of the completions in all nine worlds, 40.6% in first60).
    benched: bool = False
    # How long its last activation lasted (0 once a free return used it): one that lasted a hold
    # base comes back beside the others with no place or trial token (``_returning``).
    last_span: float = 0.0
    # The span its last free return stood on, while that return is under way: a returned activation
    # the plan ends within a hold base, the worker not falling short (a cover's recovery, or a
    # take-back within one batch), gives the return back, at most once per hold base (red team
    # round 29: a cover's brief dip switched the honest workers on for 56 s, which spent their free
    # return, and silent claims then took every probation place at the next slowdown: ``slowreal2``
    # 77.8%).
    returned_span: float = 0.0
    return_kept_at: float = -math.inf


@dataclass(frozen=True)
class _Penalty:
    """What a worker that left unproven had earned (module docstring, Restarts and
    re-probes: Leaving): it is restored when the same peer joins again."""

    left_at: float
    zeroed_at: float | None  # when its measured 0 was adopted (None: not measured at 0)
    reprobes: int  # re-tries counted on its next join (it waits behind workers never tried)
    joined: int | None = None  # proven when it left: the join place it keeps
    last_refund_at: float | None = None  # its last trial-token refund (one per penalty memory)
    place_kept_at: float | None = None  # when its join place was last kept (once per penalty memory)
    down_adoptions: tuple[float, ...] = ()  # flap damping (``_Worker``)
    held_until: float | None = None


class ActivationCore:
    """One learner's worker activation: see the module docstring."""

    def __init__(self, config: ActivationConfig) -> None:
        self.config = config
        self.stats = ActivationStats()
        self._now = -math.inf
        self._workers: dict[PeerId, _Worker] = {}
        self._bans: dict[PeerId, float] = {}  # peer -> excluded until
        self._ban_reasons: dict[PeerId, str] = {}
        # peer -> what it earned before it left, oldest first (bounded like the workers, with an expiry)
        self._penalties: dict[PeerId, _Penalty] = {}
        # In this run an activated unproven worker was measured at 0, or left or restarted before
        # it was proven (cold starts hedge from then on).
        self._claim_failed = False
        self._joins = 0  # how many _Worker records were made: each one's ``joined``
        # When proven workers, any of them, dropped (adopted down, or left or restarted while
        # falling short) within the penalty memory: the hold on a new proof doubles with each
        # (flap damping of the role, not the identity: fresh identities are free).
        # Each is (when, the identity whose leave it was, or None): a leave counts only while that
        # identity is away, as a restart counts for the identity alone (red team round 25, F1).
        self._drops: deque[tuple[float, PeerId | None]] = deque(maxlen=MAX_LEARNER_DROPS)
        # Trials started while trials are limited (a proven worker exists, or a claim failed): at
        # most max_probation per first_rollout_timeout, each an Activate and a weight fetch
        # (module docstring, Probation; red team round 10, R10-3).
        self._trials = TokenBucket(
            config.max_probation / config.first_rollout_timeout, config.max_probation, updated=-math.inf
        )
        self._short_of_trials = False  # the last plan left a worker waiting for a trial token
        self._trials_kept = False  # the last plan kept a cold-start trial under way (make before break)
        # Inside handle_all (whose take-backs are never sent): who was active when it began.
        self._batch_active: set[PeerId] | None = None
        self._readvertising: PeerId | None = None  # whose re-advertisement is being planned
        self._step_time = config.step_time
        self._dissemination = config.dissemination
        self._step_measured = False
        self._dissemination_measured = False
        self._peer_dissemination_seen = False  # some worker's own D was measured (the learner does)
        self._steps: deque[tuple[float, float, float]] = deque()  # (at, seconds, waited)
        self._next_check_at: float | None = None
        self._plan = plan([], self._need())

    # -- public surface -----------------------------------------------------------------------

    @property
    def plan(self) -> Plan:
        """The current plan (what the active set was last computed from)."""
        return self._plan

    @property
    def step_time(self) -> float:
        return self._step_time

    @property
    def dissemination(self) -> float:
        """D as the plan's need counts it (module docstring, Dissemination)."""
        return self._plan_dissemination()

    def active(self) -> tuple[PeerId, ...]:
        return tuple(peer for peer, w in self._workers.items() if w.active)

    def measured_utilization(self, now: float) -> float | None:
        """``sum(step) / sum(step + waited)`` over the last ``utilization_window`` seconds."""
        now = self._clock(now)
        self._prune_steps(now)
        if not self._steps:
            return None
        busy = sum(s for _, s, _ in self._steps)
        return busy / (busy + sum(w for _, _, w in self._steps))

    def measured_rate(self, peer: PeerId, now: float) -> float | None:
        worker = self._workers.get(peer)
        return None if worker is None else self._measured_rate(worker, self._clock(now))

    def status(self, now: float) -> ActivationStatus:
        now = self._clock(now)
        workers = tuple(
            WorkerStatus(
                peer=peer,
                active=w.active,
                planned_rate=w.planned_rate,
                measured_rate=self._measured_rate(w, now),
                price=w.offer.price,
                hardware=w.offer.hardware,
                lease_expires_at=w.lease_expires_at if w.active else None,
                banned_until=self._banned_until(peer, now),
                proven=self._proven(w),
                dissemination=w.dissemination,
                held_until=w.held_until if self._held(w) else None,
            )
            for peer, w in sorted(self._workers.items())
        )
        return ActivationStatus(
            plan=self._plan,
            step_time=self._step_time,
            dissemination=self._plan_dissemination(),
            measured_utilization=self.measured_utilization(now),
            workers=workers,
            stats=self.stats.as_dict(),
        )

    def handle(self, event: ActivationEvent, now: float) -> list[ActivationAction]:
        now = self._clock(now)
        match event:
            case WorkerJoined():
                return self._on_joined(event.offer, now)
            case WorkerLeft():
                return self._on_left(event.peer, now)
            case StepMeasured():
                return self._on_step(event, now)
            case DisseminationMeasured():
                return self._on_dissemination(event.seconds, event.peer, now)
            case RolloutsReceived():
                return self._on_rollouts(event, now)
            case PeerBanned():
                return self._on_banned(event.peer, event.until, "banned", now)
            case WorkerMisbehaved():
                return self._on_banned(event.peer, event.until, event.reason, now)
        raise TypeError(f"not an activation event: {event!r}")

    def handle_all(self, events: Iterable[ActivationEvent], now: float) -> list[ActivationAction]:
        """``handle`` each event at one ``now`` (a recruit round), without the Activates that the
        batch took back: a worker inactive before the batch and after it is sent neither its
        Activate nor its Deactivate. Otherwise each of a round's fresh offers, each cheaper than
        the last, was activated and deactivated in turn, hundreds of Activates at a learner start
        (red team round 13)."""
        before = {peer for peer, w in self._workers.items() if w.active}
        actions: list[ActivationAction] = []
        self._batch_active = before
        try:
            for event in events:
                actions += self.handle(event, now)
        finally:
            self._batch_active = None
        after = {peer for peer, w in self._workers.items() if w.active}
        return [
            a
            for a in actions
            if not (
                isinstance(a, (Activate, Deactivate))
                and not (isinstance(a, Activate) and a.renewal)
                and a.peer not in before
                and a.peer not in after
            )
        ]

    def poll(self, now: float) -> list[ActivationAction]:
        """Timers: lifted bans, re-probes, silent or drifting workers, lease renewals."""
        now = self._clock(now)
        actions: list[ActivationAction] = []
        lifted = [peer for peer, until in self._bans.items() if until <= now]
        for peer in lifted:
            del self._bans[peer]
            self._ban_reasons.pop(peer, None)
        if any(peer in self._workers for peer in lifted):
            actions += self._replan(now, "ban lifted: " + ", ".join(p for p in lifted if p in self._workers))
        if self._short_of_trials and self._free_trials() >= 1:
            actions += self._replan(now, "a trial is free: the next waiting worker is tried")
        actions += self._reprobe(now)
        actions += self._release_holds(now)
        self._lapse_idle_proofs(now)
        actions += self._forget_dissemination(now)
        actions += self._check_drift(now)
        actions += self._renew(now)
        self._next_check_at = now + self.config.check_interval if self.active() else None
        return actions

    def next_deadline(self) -> float | None:
        """When ``poll`` must run at the latest (None: only when an event arrives)."""
        deadlines = [until for until in self._bans.values() if math.isfinite(until)]
        if self._next_check_at is not None:
            deadlines.append(self._next_check_at)
        for w in self._workers.values():
            if not w.active:
                continue
            deadlines.append(w.lease_expires_at - self.config.renew_before)
            if w.drift_since is not None:
                deadlines.append(w.drift_since + self.config.drift_hold)
        deadlines += [due for w in self._workers.values() if (due := self._reprobe_due(w)) is not None]
        deadlines += [w.held_until for w in self._workers.values() if w.held_until is not None]
        deadlines += [
            w.idle_since + self.config.reprobe_seconds
            for w in self._workers.values()
            if w.idle_since is not None and w.backed
        ]
        deadlines += [
            w.dissemination_at + self.config.reprobe_seconds
            for w in self._workers.values()
            if w.dissemination is not None and not w.active
        ]
        if self._short_of_trials:
            deadlines.append(self._trials.ready_at(self._now, 1))
        return min(deadlines, default=None)

    # -- events ---------------------------------------------------------------------------------

    def _on_joined(self, offer: WorkerOffer, now: float) -> list[ActivationAction]:
        worker = self._workers.get(offer.peer)
        if worker is None:
            if len(self._workers) >= self.config.max_workers:
                self.stats.workers_refused += 1
                return []
            self.stats.joins += 1
            penalty = self._remembered(offer.peer, now)
            if penalty is not None and penalty.zeroed_at is not None:
                # Measured at 0 before it left: back out until its re-probe is due, as if it had
                # stayed (a leave and a join cost nothing, so they lift no penalty).
                self._workers[offer.peer] = _Worker(
                    offer=offer,
                    planned_rate=0.0,
                    measured_adopted=True,
                    zeroed_at=penalty.zeroed_at,
                    reprobes=penalty.reprobes,
                    joined=self._next_join(),
                )
                self._carry_hold(self._workers[offer.peer], penalty.down_adoptions, penalty.held_until)
                return []
            reprobes = 0 if penalty is None else penalty.reprobes
            joined = (
                penalty.joined if penalty is not None and penalty.joined is not None else self._next_join()
            )
            self._workers[offer.peer] = _Worker(
                offer=offer,
                planned_rate=offer.rate,
                reprobes=reprobes,
                joined=joined,
                last_refund_at=None if penalty is None else penalty.last_refund_at,
                place_kept_at=None if penalty is None else penalty.place_kept_at,
            )
            if penalty is not None:
                self._carry_hold(self._workers[offer.peer], penalty.down_adoptions, penalty.held_until)
            return self._replan(now, f"worker joined: {offer.peer}")
        old = worker.offer
        if old.address and offer.address and old.address != offer.address:
            # A new run: what we measured of the old one (nothing delivered while it was down)
            # must not outrank its new offer.
            self.stats.restarts += 1
            if worker.zeroed_at is not None and not worker.active:
                # But a new address costs nothing, so it lifts no penalty: measured at 0, the worker
                # gets its new chance when the re-probe is due, with the offer it holds then.
                worker.offer = offer
                worker.delivery = 0  # a new run: the last delivery says nothing of its tail
                return []
            # Tried and not proven: its new run is a re-try, behind workers never tried (Probation).
            retried = worker.activated_at > -math.inf and not self._proven(worker) and not worker.lapsed
            self._note_dropped_out(worker, restart=True)
            self._take_back_refund(worker, now)
            # A proven worker's restart keeps its join place (it earned it by delivering), once
            # per penalty memory; so does one whose proof lapsed idle, and one never tried (it
            # failed nothing): re-queued behind every identity that joined meanwhile, honest
            # workers restarting while a cheap cover ran were never reached again (red team round
            # 23: 64 identities queued ahead, 28.1-47.4% in rst2 and slowrst2, honest workers off).
            keeps = self._earned_place(worker) and self._keeps_place(worker, now)
            return self._start_over(
                offer,
                now,
                "worker restarted",
                reprobes=worker.reprobes + int(retried),
                joined=worker.joined if keeps else None,
                last_refund_at=worker.last_refund_at,
                place_kept_at=now if keeps else worker.place_kept_at,
                hold=worker,
            )
        worker.offer = offer
        need = self._need()
        # A new tail latency matters only when it changes who meets the staleness bound: tails
        # estimated from a drifting rate change a little on every re-advertisement. (Judged at
        # the planned rate: a measured worker's advertised rate does not decide anything.)
        old_tail, new_tail = modelled_tail(old, worker.delivery), modelled_tail(offer, worker.delivery)
        before = replace(old, rate=worker.planned_rate, gen_tail_latency=old_tail)
        after = replace(offer, rate=worker.planned_rate, gen_tail_latency=new_tail)
        material = old.price != offer.price or (
            old_tail != new_tail
            and (exclusion_reason(before, need) is None) != (exclusion_reason(after, need) is None)
        )
        if not worker.measured_adopted and self._outside_band(offer.rate, worker.planned_rate):
            worker.planned_rate = offer.rate
            if worker.active and self._proven(worker):
                worker.unproved_at = now
            # What a window showed backed the old rate, not this one: unproven until one backs it.
            worker.backed = False
            self._take_back_refund(worker, now)
            material = True
        if not material:
            return []
        on_trial = worker.active and not self._proven(worker)
        self._readvertising = offer.peer
        try:
            actions = self._replan(now, f"worker re-advertised: {offer.peer}")
        finally:
            self._readvertising = None
        if on_trial and not worker.active:
            # Its own new offer took it off its trial before a window backed it: its claim failed,
            # and it waits as a re-try (a new join). Otherwise it could step out with a costly offer
            # just before first_rollout_timeout and come back cheap with a fresh clock, never
            # measured and never counted as failed (red team round 10, R10-1).
            self._claim_failed = True
            worker.reprobes += 1
            worker.joined = self._next_join()
        return actions

    def _on_left(self, peer: PeerId, now: float) -> list[ActivationAction]:
        worker = self._workers.pop(peer, None)
        if worker is None:
            return []
        self.stats.leaves += 1
        if not self._note_dropped_out(worker, restart=False) and (
            worker.down_adoptions or worker.unproved_at is not None
        ):
            # It dropped itself before (a restart or a slowdown adopted, its own drops) or gave up
            # its proof by re-advertising, and now leaves for good: a drop of the role after all.
            # Restarting (or re-advertising) just before swapping in a fresh identity recorded no
            # drop of the role, so every new identity was trusted one hold after its proof and
            # displaced the honest workers again each cycle (red team round 25, F3 and F4: 72.8%
            # and 73.8% of the completions in ``first60``).
            self._drops.append((now, None))
        self._take_back_refund(worker, now)
        self._remember(peer, worker, now)
        mattered = worker.active or any(e.peer == peer for e in self._plan.excluded)
        return self._replan(now, f"worker left: {peer}") if mattered else []

    def _on_step(self, event: StepMeasured, now: float) -> list[ActivationAction]:
        seconds, waited = event.step_seconds, event.wait_seconds
        if not (math.isfinite(seconds) and seconds > 0):
            return []  # a driver bug, not a reason to poison T; nothing to learn from it
        waited = waited if math.isfinite(waited) and waited > 0 else 0.0
        self.stats.steps += 1
        self._steps.append((now, seconds, waited))
        self._prune_steps(now)
        if self._step_measured:
            a = self.config.smoothing
            self._step_time = a * seconds + (1 - a) * self._step_time
        else:  # the configured value was a guess: the first measurement replaces it
            self._step_time = seconds
            self._step_measured = True
        if self._outside_band(self._step_time, self._plan.need.step_time):
            return self._replan(
                now, f"step time {self._step_time:.4g} s (planned {self._plan.need.step_time:.4g} s)"
            )
        return []

    def _on_dissemination(self, seconds: float, peer: PeerId | None, now: float) -> list[ActivationAction]:
        if not (math.isfinite(seconds) and seconds >= 0):
            return []
        worker = self._workers.get(peer) if peer is not None else None
        if peer is not None and worker is None:
            return []  # a worker no longer here: nothing to plan with
        before = [exclusion_reason(o, self._plan.need) is None for o in self._offers()]
        a = self.config.smoothing
        if worker is not None:
            # Its own D: a worker that announces its weights late excludes itself, not the others
            # (red team round 15: three late identities raised one shared D past S * T and kept
            # proven honest workers out, 98% of the hour).
            worker.dissemination = (
                seconds if worker.dissemination is None else a * seconds + (1 - a) * worker.dissemination
            )
            worker.dissemination_at = now
            self._peer_dissemination_seen = True
        elif self._dissemination_measured:
            self._dissemination = a * seconds + (1 - a) * self._dissemination
        else:
            self._dissemination = seconds
            self._dissemination_measured = True
        # D only enters the latency constraint: re-plan when it changes who qualifies.
        need = self._need()
        after = [exclusion_reason(o, need) is None for o in self._offers()]
        if before == after:
            return []
        who = f" ({peer})" if peer is not None else ""
        return self._replan(now, f"dissemination time {seconds:.4g} s{who}")

    def _on_rollouts(self, event: RolloutsReceived, now: float) -> list[ActivationAction]:
        worker = self._workers.get(event.peer)
        if event.count <= 0:
            return []
        if worker is None or not worker.active:
            self.stats.rollouts_unsolicited += event.count
            return []
        self.stats.rollouts_received += event.count
        actions: list[ActivationAction] = []
        qualified = self._qualifies(worker)
        worker.delivery = event.count
        # A delivery does not prove the worker: a full window of them must back its rate (Probation).
        if self._qualifies(worker) != qualified:
            tail = modelled_tail(worker.offer, worker.delivery) or 0.0
            actions += self._replan(
                now, f"tail latency {tail:.4g} s changes whether {event.peer} meets the staleness bound"
            )
        if worker.measure_from is None:
            worker.measure_from = now  # the first delivery marks the start of steady output
        else:
            self._record(worker, now, event.count)
        return actions + self._check_drift(now, event.peer)

    def _on_banned(self, peer: PeerId, until: float, reason: str, now: float) -> list[ActivationAction]:
        if not until > now:
            return []
        if until >= self._bans.get(peer, -math.inf):
            self._bans[peer] = until
            self._ban_reasons[peer] = reason
        if len(self._bans) > self.config.max_workers:  # the soonest to end goes first
            victim = min(self._bans, key=self._bans.__getitem__)
            del self._bans[victim]
            self._ban_reasons.pop(victim, None)
        worker = self._workers.get(peer)
        if worker is None or not worker.active:
            return []
        return self._replan(now, f"worker {reason}: {peer}")

    # -- starting a worker over (restarts and re-probes) ----------------------------------------

    def _start_over(
        self,
        offer: WorkerOffer,
        now: float,
        cause: str,
        *,
        delivery: int = 0,
        reprobes: int = 0,
        joined: int | None = None,
        last_refund_at: float | None = None,
        place_kept_at: float | None = None,
        hold: _Worker | None = None,
    ) -> list[ActivationAction]:
        """Forget what was measured of ``offer.peer`` and take ``offer`` afresh: a leave, then a join
        (module docstring, Restarts and re-probes); ``delivery`` and ``reprobes`` are kept, and
        ``hold``'s flap damping (a new run must not lift it)."""
        peer = offer.peer
        old = self._workers.pop(peer)
        mattered = old.active or any(e.peer == peer for e in self._plan.excluded)
        actions = self._replan(now, f"{cause}, forgetting what was measured: {peer}") if mattered else []
        actions.append(Forget(peer, cause))
        self._workers[peer] = _Worker(
            offer=offer,
            planned_rate=offer.rate,
            delivery=delivery,
            reprobes=reprobes,
            joined=self._next_join() if joined is None else joined,
            last_refund_at=last_refund_at,
            place_kept_at=place_kept_at,
        )
        if hold is not None:
            self._carry_hold(self._workers[peer], hold.down_adoptions, hold.held_until)
            self._workers[peer].unproved_at = hold.unproved_at
        return actions + self._replan(now, f"{cause}, measuring it afresh: {peer}")

    def _trial_places(self, wanted: int) -> int:
        """How many of ``wanted`` new trials the trial tokens allow now (noting a shortfall)."""
        places = min(wanted, self._free_trials())
        if places < wanted:
            self._short_of_trials = True
        return places

    def _free_trials(self) -> int:
        """Whole trial tokens held now (the same count for planning and for the wake-up)."""
        return max(0, math.floor(self._trials.available(self._now) + _EPS))

    def _probation_limit(self) -> int:
        """Unproven workers active at once: ``max_probation``, or as many as are proven. Proven
        capacity cannot be faked (it was delivered), so a swarm of many small honest workers
        ramps up by doubling instead of ``max_probation`` at a time (red team round 11, R11-3)."""
        proven = sum(1 for w in self._workers.values() if self._proven(w))
        return max(self.config.max_probation, proven)

    def _trials_limited(self) -> bool:
        return self._claim_failed or self._trials_kept or any(self._proven(w) for w in self._workers.values())

    def _trial_passed(self, worker: _Worker, now: float) -> None:
        """A trial that proved its worker gives back the token it spent: pacing bounds what failed
        trials cost, not how fast honest workers are taken on (red team round 11, R11-3). Only the
        token that trial spent, once: a worker whose re-advertisements make it unproven and proven
        again while active must not mint tokens for others."""
        if not worker.trial_token:
            return
        worker.trial_token = False
        # One refund per identity per penalty memory: identities proven on tiny real output that
        # restart with a new address, keeping their join place, were re-tried and refunded again
        # and again, 39 Activates an hour each (red team round 17: 2,341 an hour from 64).
        if worker.last_refund_at is not None and now - worker.last_refund_at < self._penalty_memory():
            return
        worker.refunded_at = worker.last_refund_at = now
        self._trials.give(now)

    def _take_back_refund(self, worker: _Worker, now: float) -> None:
        """A worker that leaves, restarts or gives up its proof within ``first_rollout_timeout`` of
        the refund pays its trial token after all (the bucket may go into debt): identities that
        deliver one window of tiny real output, are proven and leave would otherwise never spend a
        token, and cost the learner an Activate and a weight fetch each, several hundred an hour
        (red team round 12, R12-2)."""
        if worker.refunded_at is not None and now - worker.refunded_at < self.config.first_rollout_timeout:
            # At most max_probation tokens into debt: identities proven and refunded in turn, all
            # leaving together, took back a dozen tokens at once and kept every trial, the honest
            # workers' too, out for 300 s (red team round 28).
            self._trials.spend(
                now, min(1.0, max(0.0, self._trials.available(now) + self.config.max_probation))
            )
        worker.refunded_at = None

    def _next_join(self) -> int:
        self._joins += 1
        return self._joins

    def _note_dropped_out(self, worker: _Worker, *, restart: bool) -> bool:
        """A worker activated while unproven left or restarted: its claim failed as surely as one
        measured at 0. A fresh identity per claim, each leaving before it can be measured, would
        otherwise never arm the cold-start hedge (red team R9-1). A proven one that was active drops
        out (below): a restart is a drop of its own identity (flap damping: the same identity comes
        back), a leave a drop of the role (a fresh identity may take its place). Counting
        restarts for the role let identities inflate every later worker's new-trust hold while
        keeping their join places (red team round 24: 32 identities restarting once each, 72.9%
        in ``new2``). A leave's drop of the role is the identity's: it stops counting once that
        identity is back (``_hold_new_trust``), or leaving and rejoining was the old restart (red
        team round 25, F1: 72.9% in ``new2``). Returns whether a drop of the role was recorded."""
        if worker.active and not self._proven(worker):
            self._claim_failed = True
        if worker.active and self._proven(worker):
            measured = self._measured_rate(worker, self._now)
            falling = measured is not None and measured < worker.planned_rate
            if falling and self._rate_drifts(measured, worker.planned_rate):  # type: ignore[arg-type]
                # It left or restarted while falling short, before the drop could be adopted: a
                # drop all the same, and a failed claim (red team round 21: a fresh identity each
                # time, leaving just before its silence was adopted, was never damped and the
                # cold start never tried anyone else: 42.7% of the completions).
                self._claim_failed = True
                self._note_down_adoption(worker, self._now, role=False)
                self._drops.append((self._now, worker.offer.peer))
                return not restart
            else:
                # Delivering in full, it still left the plan short of what it counted on: a drop of
                # the role (the next worker proven waits longer to be trusted) and a failed claim
                # (the cold start hedges). Restarting at full rate just after its trust hold, then
                # silent until first_rollout_timeout, one identity kept the learner in an unhedged
                # cold start all hour, honest workers never tried; displacing them and restarting
                # at once made them pay their first delivery again every 300 s (red team round 23:
                # 53.4% of the completions in seven worlds; 64.4-75.0% in first60, rst2, slowrst2).
                self._claim_failed = True
                # A drop of its own identity either way: one that left at full rate and rejoined
                # recorded only the role's drop, which stops counting once it is back (red team
                # round 27: leaving each time it had displaced the honest workers, 72.7% in first60).
                self._note_down_adoption(worker, self._now, role=False)
                self._drops.append((self._now, worker.offer.peer))
                return not restart
        return False

    def _earned_place(self, worker: _Worker) -> bool:
        """Whether a restart keeps ``worker``'s join place (once per penalty memory): proven, proven
        before and idle since (its proof lapsed, nothing failed), or never tried in this run."""
        return self._proven(worker) or worker.lapsed or worker.activated_at == -math.inf

    def _remember(self, peer: PeerId, worker: _Worker, now: float) -> None:
        """Keep what ``worker`` earned unproven (a measured 0, its re-tries) past its leave; and a
        proven worker's join place, which it earned by delivering (a restart of every honest
        worker must not queue them behind identities that joined meanwhile: red team round 16)."""
        if self._proven(worker) or worker.lapsed:
            keeps = self._keeps_place(worker, now)
            penalty = _Penalty(
                now,
                None,
                0,
                joined=worker.joined if keeps else None,
                last_refund_at=worker.last_refund_at,
                place_kept_at=now if keeps else worker.place_kept_at,
                down_adoptions=tuple(worker.down_adoptions),
                held_until=worker.held_until,
            )
        else:
            tried = worker.activated_at > -math.inf and worker.zeroed_at is None
            if worker.zeroed_at is None and not tried and not worker.reprobes and not worker.down_adoptions:
                return  # never tried: nothing to remember
            penalty = _Penalty(
                now,
                worker.zeroed_at,
                worker.reprobes + int(tried),
                last_refund_at=worker.last_refund_at,
                place_kept_at=worker.place_kept_at,
                down_adoptions=tuple(worker.down_adoptions),
                held_until=worker.held_until,
            )
        self._penalties.pop(peer, None)  # re-inserted: the newest last
        self._penalties[peer] = penalty
        horizon = now - self._penalty_memory()
        while self._penalties:
            oldest = next(iter(self._penalties))
            if len(self._penalties) <= self.config.max_workers and self._penalties[oldest].left_at > horizon:
                break
            del self._penalties[oldest]  # expired, or over the bound: the oldest is forgotten first

    def _remembered(self, peer: PeerId, now: float) -> _Penalty | None:
        penalty = self._penalties.pop(peer, None)
        if penalty is None or penalty.left_at <= now - self._penalty_memory():
            return None
        return penalty

    def _keeps_place(self, worker: _Worker, now: float) -> bool:
        """Whether a proven worker's restart or rejoin keeps its join place: once per penalty
        memory. Identities proven on tiny real output that restarted whenever their refund had
        lapsed took the front of the trial queue every time (red team round 17: a newcomer out
        441 s behind 64 of them)."""
        return worker.place_kept_at is None or now - worker.place_kept_at >= self._penalty_memory()

    def _penalty_memory(self) -> float:
        return PENALTY_MEMORY_REPROBES * self.config.reprobe_seconds

    def _note_down_adoption(self, worker: _Worker, now: float, *, role: bool = True) -> None:
        """Flap damping (module docstring, Measured rates): a proven worker whose rate is adopted
        down for the k-th time within the penalty memory, k >= ``FLAP_SUPPRESS``, is untrusted for
        ``(first_rollout_timeout + rate_window) * 2 ** (k - FLAP_SUPPRESS)`` seconds (capped at that
        memory). The workers its slowdown switched on need up to ``first_rollout_timeout`` to
        deliver and a window to be proven: trusted again sooner, its recovery dropped them before
        their first delivery, and an identity alternating real output and a trickle kept the
        learner at 53.7% of its completions with honest workers delivering nothing (red team
        round 20)."""
        memory = self._penalty_memory()
        if role:  # also a drop of the role: the new-trust hold of workers proven later grows
            self._drops.append((now, None))
        down = worker.down_adoptions
        while down and down[0] <= now - memory:
            down.popleft()
        down.append(now)
        if len(down) < FLAP_SUPPRESS:
            return
        base = self.config.first_rollout_timeout + self.config.rate_window
        hold = min(base * 2.0 ** min(len(down) - FLAP_SUPPRESS, MAX_DOWN_ADOPTIONS), memory)
        worker.held_until = max(worker.held_until or -math.inf, now + hold)
        self.stats.flap_holds += 1

    def _hold_new_trust(self, worker: _Worker, now: float) -> None:
        """A worker just proven is trusted ``(first_rollout_timeout + rate_window) * 2 ** j`` seconds
        later, j the drops of proven workers within the penalty memory (the hold capped at that
        memory): until then it is on probation beside the trusted workers, never in place of one.
        The workers it would displace take up to ``first_rollout_timeout`` to deliver again and a
        window to be proven; a fresh identity trusted one window after its first delivery displaced
        them, stalled and left, and the next one did the same (red team round 21: 42.7-48.9% of the
        completions, honest workers delivering nothing). Fresh identities are free, so the hold
        grows with the drops of the role, whoever made them."""
        if not self.config.trust_hold:
            return
        memory = self._penalty_memory()
        while self._drops and self._drops[0][0] <= now - memory:
            self._drops.popleft()
        base = self.config.first_rollout_timeout + self.config.rate_window
        # A leave counts in full while that identity is away. An identity's own drops (a restart, a
        # leave it came back from) count for the role too, but at most one per ``base`` seconds: a
        # burst of them (32 identities restarting once each, round 24) is one, while a rotation of
        # identities, each restarting (or leaving and coming back) once just after it displaced the
        # honest workers, was never counted, and each new identity was trusted one hold after its
        # proof (red team round 27: 73.2% in first60).
        drops, last_own = 0, -math.inf
        for when, peer in self._drops:
            if peer is None or peer not in self._workers:
                drops += 1
            elif when - last_own >= base:
                drops, last_own = drops + 1, when
        hold = min(base * 2.0 ** min(drops, MAX_LEARNER_DROPS), memory)
        worker.held_until = max(worker.held_until or -math.inf, now + hold)

    def _lapse_idle_proofs(self, now: float) -> None:
        """A proven worker inactive ``reprobe_seconds`` is unproven again: re-activated, it is on
        trial (a trial token) and proven anew, then trusted after the new-trust hold. Its proof
        spoke for output it delivered then, not now: identities proven early, banked idle while a
        cheaper one covered the need, were each re-activated trusted when the last one stalled and
        covered the need alone until measured at 0, about 150 s each (red team round 22: 24 such
        identities, 0% of the completions in all nine worlds, honest workers off all hour)."""
        for w in self._workers.values():
            if w.idle_since is not None and w.idle_since + self.config.reprobe_seconds <= now:
                w.idle_since = None
                w.backed = False
                w.lapsed = True

    def _carry_hold(self, worker: _Worker, down: Iterable[float], held_until: float | None) -> None:
        """A restart, re-probe or rejoin lifts no flap damping: ``worker`` takes it over."""
        worker.down_adoptions.extend(down)
        worker.held_until = held_until

    def _release_holds(self, now: float) -> list[ActivationAction]:
        """Holds that ended: the worker is trusted again, and the plan, which it was beside on
        probation, may now use it in place of others (as when a probationer is proven)."""
        released = [
            peer for peer, w in self._workers.items() if w.held_until is not None and w.held_until <= now
        ]
        for peer in released:
            self._workers[peer].held_until = None
        bent = self._plan.kept or self._plan.waiting or self._plan.probation
        if not any(self._proven(self._workers[p]) for p in released) or not bent:
            return []
        return self._replan(now, "flap damping over, trusted again: " + ", ".join(released))

    def _reprobe_due(self, worker: _Worker) -> float | None:
        """When ``worker`` gets a new chance (None: it needs none, or advertises no rate)."""
        if worker.zeroed_at is None or worker.active or not worker.offer.rate > 0:
            return None
        due = worker.zeroed_at + self.config.reprobe_seconds
        until = self._bans.get(worker.offer.peer)
        if until is not None:
            if not math.isfinite(until):
                return None  # out for this run: no new chance
            due = max(due, until)
        return due

    def _forget_dissemination(self, now: float) -> list[ActivationAction]:
        """An inactive worker's own D, measured ``reprobe_seconds`` ago or more, is forgotten: it is
        planned at the need's D again and measured afresh once active. An inactive worker is told no
        new versions, so a D that once excluded it (a download hiccup) kept it out for good (red team
        round 16: no attacker, 30% of the hour)."""
        stale = [
            w
            for w in self._workers.values()
            if w.dissemination is not None
            and not w.active
            and w.dissemination_at + self.config.reprobe_seconds <= now
        ]
        if not stale:
            return []
        before = [exclusion_reason(o, self._plan.need) is None for o in self._offers()]
        for w in stale:
            w.dissemination = None
        after = [exclusion_reason(o, self._need()) is None for o in self._offers()]
        if before == after:
            return []
        return self._replan(now, "dissemination times forgotten: " + ", ".join(w.offer.peer for w in stale))

    def _reprobe(self, now: float) -> list[ActivationAction]:
        actions: list[ActivationAction] = []
        for worker in list(self._workers.values()):
            due = self._reprobe_due(worker)
            if due is None or due > now or self._banned_until(worker.offer.peer, now) is not None:
                continue
            self.stats.reprobes += 1
            actions += self._start_over(
                worker.offer,
                now,
                "worker re-probed",
                delivery=worker.delivery,
                reprobes=worker.reprobes + 1,
                last_refund_at=worker.last_refund_at,
                place_kept_at=worker.place_kept_at,
                hold=worker,
            )
        return actions

    # -- planning -------------------------------------------------------------------------------

    def _need(self) -> Need:
        c = self.config
        return Need(self._step_time, c.batch, self._plan_dissemination(), c.staleness, c.margin)

    def _plan_dissemination(self) -> float:
        """D in the need: the least of the workers' own D and the learner-wide D (the configured
        estimate until measured); each worker's excess over it is added to its tail
        (``_planned_offer``). The least, so that no worker can raise it for the others, nor for a
        worker not measured yet (red team round 16: judged at silent identities' 49.5 s, restarted
        honest workers waited up to 3,000 s); each is still judged on its own D."""
        own = [w.dissemination for w in self._workers.values() if w.dissemination is not None]
        return min([*own, self._dissemination])

    def _offers(self) -> list[WorkerOffer]:
        d = self._plan_dissemination()
        return [self._planned_offer(w, d) for w in self._workers.values()]

    def _planned_offer(self, worker: _Worker, dissemination: float | None = None) -> WorkerOffer:
        """The offer as the plan counts on it: the planned rate, and the modelled tail latency plus
        the worker's own D beyond the need's (so ``D + tail <= S * T`` holds for its own D)."""
        tail = modelled_tail(worker.offer, worker.delivery)
        if worker.dissemination is not None:
            d = self._plan_dissemination() if dissemination is None else dissemination
            if worker.dissemination > d:
                tail = (tail or 0.0) + (worker.dissemination - d)
        return replace(worker.offer, rate=worker.planned_rate, gen_tail_latency=tail)

    def _late_only(self, worker: _Worker, need: Need) -> bool:
        """It misses the latency rule by its own D alone (its tail, modelled from its deliveries,
        would meet it). A trial that its D puts just outside ``S * T`` is kept until judged at a
        cold start: its weights come before its first delivery, so its D is measured first, and
        silent claims meeting the rule had it dropped as a failed claim before it delivered, again
        after each re-try (red team round 18, search seed 383: 79.8% of the completions)."""
        return exclusion_reason(self._planned_offer(worker, math.inf), need) is None  # no D excess

    def _dropped_early_by_its_d(self, worker: _Worker, need: Need, now: float) -> bool:
        """A trial the plan drops before its first delivery and within ``first_rollout_timeout``,
        out only by its own D: not its doing (its D is measured before it could deliver), so it
        keeps its join place and is no re-try, like any trial dropped unjudged in that time."""
        return (
            worker.measure_from is None
            and now - worker.activated_at < self.config.first_rollout_timeout
            and self._late_only(worker, need)
        )

    def _qualifies(self, worker: _Worker) -> bool:
        need = self._need()  # one pass over the workers for the need's D, not two (every delivery)
        return exclusion_reason(self._planned_offer(worker, need.dissemination), need) is None

    def _proven(self, worker: _Worker) -> bool:
        return worker.backed and worker.planned_rate > 0

    def _trusted(self, worker: _Worker, *, benched: bool = False) -> bool:
        """Proven, and its own D is measured (where the driver measures each worker's D, as the
        learner does): a worker is on probation, beside the proven workers and never in place of
        one, until both its rate and its latency are measured. A proven worker whose D was
        forgotten (``_forget_dissemination``), planned at the need's D, looked better than one
        measured just outside ``S * T``, replaced it and was measured there again before its first
        delivery: two swapped places every ~100 s (red team round 18: 25,740 completions of
        36,000). A fresh identity delivering its claim but announcing its weights late was proven
        before its D came in and displaced the proven workers each time (round 19: 52.8%). And not
        held by flap damping (``_note_down_adoption``)."""
        if not self._proven(worker) or self._held(worker) or worker.cold or (worker.benched and not benched):
            return False
        return worker.dissemination is not None or not self._peer_dissemination_seen

    def _returning(self, worker: _Worker) -> bool:
        """Inactive, and it delivered what a window backed before it was taken out of the plan (it
        is benched, or its proof lapsed idle), and nothing measured it at 0 since."""
        base = self.config.first_rollout_timeout + self.config.rate_window
        return (
            not worker.active
            and (worker.benched or worker.lapsed)
            and worker.zeroed_at is None
            and worker.last_span >= base  # at most one free return per hold base it served
        )

    def _held(self, worker: _Worker) -> bool:
        return worker.held_until is not None and worker.held_until > self._now

    def _plan_among(
        self, eligible: list[WorkerOffer], need: Need, *, count_fallback: bool = False, all_on: bool = False
    ) -> Plan:
        """``plan`` with ``ActivationCore``'s latency fallback (module docstring, The rule);
        ``all_on``: every qualifying worker, in plan order, whatever the policy."""
        all_on = all_on or self.config.policy == "all"
        new = plan(eligible, need, all_on=all_on)
        if not new.workers and any(exclusion_reason(o, need, check_latency=False) is None for o in eligible):
            # Nobody meets D + T_gen <= S * T. With no worker the learner takes no step, so T and D
            # are never measured again and the plan could not recover (from a start-up D, or a T
            # that was only a guess): plan without the rule, and say so. The staleness gate still
            # drops every group older than S.
            if count_fallback:
                self.stats.latency_fallbacks += 1
            # Only the workers nearest to meeting it (shortest tail, within the drift band): a
            # cheaper but slower one would pull D and the plan to and fro.
            usable = [o for o in eligible if exclusion_reason(o, need, check_latency=False) is None]
            nearest = min(o.gen_tail_latency or 0.0 for o in usable)
            limit = nearest * (1 + self.config.drift_fraction)
            relaxed = plan(
                [o for o in usable if (o.gen_tail_latency or 0.0) <= limit],
                need,
                all_on=all_on,
                check_latency=False,
            )
            new = replace(
                relaxed,
                feasible=False,
                reason=(
                    f"no worker meets D + T_gen_tail <= S * T (D {need.dissemination:.4g} s, S * T "
                    f"{need.latency_budget:.4g} s): planned without that rule so that the learner keeps "
                    f"stepping and re-measures T and D ({new.reason})"
                ),
            )
        elif not new.feasible and not all_on:
            new = self._top_up(new, eligible, need, count_fallback=count_fallback)
        return new

    def _top_up(self, short: Plan, eligible: list[WorkerOffer], need: Need, *, count_fallback: bool) -> Plan:
        """The workers that meet the latency rule fall short of the need: add those nearest to
        meeting it (shortest tail first, then the plan order) until the need is met, and say so.
        Otherwise one claim meeting the rule (announcing instantly, a tail of 0) switched the
        fallback off and cut off every honest worker just outside ``S * T`` (red team round 16)."""
        chosen = {o.peer for o in short.workers}
        missing = [
            o
            for o in eligible
            if o.peer not in chosen
            and exclusion_reason(o, need) is not None
            and exclusion_reason(o, need, check_latency=False) is None
        ]
        if any(self._proven(self._workers[o.peer]) for o in eligible):
            # Once someone is proven, only proven workers top up: an unproven claim's tail is its
            # own say-so, and ranked by it, a claim of 100/s with a tail of 0 took the top-up from
            # every proven honest worker (red team round 17: honest out 41% of the time).
            missing = [o for o in missing if self._proven(self._workers[o.peer])]
        if not missing:
            return short
        if count_fallback:
            self.stats.latency_fallbacks += 1
        workers = list(short.workers)
        rate = sum(o.rate for o in workers)
        required = need.required_rate * (1 - _EPS)
        for o in sorted(missing, key=lambda o: ((o.gen_tail_latency or 0.0), _order(o))):
            if rate >= required:
                break
            workers.append(o)
            rate += o.rate
        added = len(workers) - len(short.workers)
        excluded = tuple(e for e in short.excluded if e.peer not in {o.peer for o in workers})
        workers_t = tuple(sorted(workers, key=_order))
        return replace(
            short,
            workers=workers_t,
            predicted_rate=rate,
            predicted_utilization=_utilization(rate, need),
            cost_per_step=_cost_per_step(workers_t, need),
            feasible=False,
            excluded=excluded,
            reason=(
                f"the workers that meet D + T_gen_tail <= S * T (S * T {need.latency_budget:.4g} s) fall "
                f"short of the need; {added} nearest to meeting it added ({short.reason})"
            ),
        )

    def _probation_candidates(self, base: Plan, unproven: list[WorkerOffer], need: Need) -> list[WorkerOffer]:
        """The unproven workers the plan would use beside ``base`` (the proven workers' plan), each
        judged on its own claim, in the order they joined (module docstring, Probation).

        Not the unproven picks of one plan among them all (as before red team R9-2): one claim
        that covers the need alone was then the only candidate, and a stream of fresh identities
        making such claims kept every other newcomer off probation. An unproven claim is what
        probation measures, so it must not make another one look unneeded. In join order a later
        claim, however cheap, cannot push ahead of one that waits; a re-probe, a restart or a
        leave and join is a new join, so a worker that failed waits behind those that joined
        before its new chance, and fresh identities cannot starve it (before, re-tried workers
        came after every never-tried one). (``plan`` uses a worker exactly when those before it
        in plan order, ``_order``, fall short of the need.)"""
        required = need.required_rate * (1 - _EPS)
        # Judged with the latency rule only when the proven workers (their latency top-up included)
        # cover the need and some of them meet the rule. When they fall short, a fresh worker just
        # outside S * T (its own D measured before a window could prove it) is what the top-up
        # needs, and only a proven one may top up: judged by the rule it was dropped before its
        # first delivery and re-tried for ever (red team round 18, F1: 1,500 completions of 36,000
        # beside one proven identity delivering 0.5/s; 18,000 with no attacker at all).
        latency_met = any(exclusion_reason(o, need) is None for o in base.workers) and (
            sum(o.rate for o in base.workers) >= required
        )

        def coverage(workers: Iterable[WorkerOffer]) -> tuple[list[tuple[float, float, PeerId]], list[float]]:
            ordered = sorted(workers, key=_order)
            covered = itertools.accumulate((o.rate for o in ordered), initial=0.0)
            return [_order(o) for o in ordered], list(covered)

        everyone = coverage(base.workers)
        # A candidate that meets the latency rule is weighed against the proven workers that meet
        # it too: a proven worker outside S * T kept by the fallback does not make it unneeded (red
        # team round 19: one identity delivering 12/s but announcing 49 s late became the fallback
        # plan at a learner start, and honest workers meeting the rule were never tried; the
        # staleness gate would have dropped all its rollouts).
        meeting = coverage(o for o in base.workers if exclusion_reason(o, need) is None)
        candidates: list[WorkerOffer] = []
        for o in sorted(unproven, key=lambda o: self._workers[o.peer].joined):
            if exclusion_reason(o, need, check_latency=latency_met) is not None:
                continue
            keys, covered = meeting if exclusion_reason(o, need) is None else everyone
            if self.config.policy != "all" and covered[bisect.bisect_left(keys, _order(o))] >= required:
                continue  # proven workers cheaper per completion already cover the need
            candidates.append(o)
        return candidates

    def _probation(self, full: Plan, eligible: list[WorkerOffer], need: Need) -> Plan:
        """The probation rule (module docstring): ``full`` unless it picked unproven workers while
        a proven one qualifies; then ``plan(proven)`` plus at most ``max_probation`` unproven."""
        proven_peers = {o.peer for o in eligible if self._trusted(self._workers[o.peer])}
        if not proven_peers:
            # Nobody trusted outright: workers benched (deactivated after a window backed them) are
            # trusted as before, or a slow-link honest worker just benched lost the plan at a cold
            # start to any claim meeting the latency rule.
            proven_peers = {o.peer for o in eligible if self._trusted(self._workers[o.peer], benched=True)}
        if not proven_peers:
            return self._cold_start(full, eligible, need)
        proven = [o for o in eligible if o.peer in proven_peers]
        base = self._plan_among(proven, need)
        if not base.workers:  # no proven worker qualifies (cold start)
            return self._cold_start(full, eligible, need)
        candidates = self._probation_candidates(
            base, [o for o in eligible if o.peer not in proven_peers], need
        )
        if not candidates:
            if all(o.peer in proven_peers for o in full.workers):
                return full
            # ``full`` uses an unproven worker that probation does not take (dearer than the
            # proven workers that cover the need): it must not replace one of them outside probation
            # (red team round 18, F2: one silent dearer claim cost 37% of the learner's rollouts).
            return replace(base, excluded=full.excluded)
        # Already on probation keep their place; new ones fill the free places in candidate order.
        on_probation = [o for o in candidates if self._workers[o.peer].active]
        # Workers that delivered before and were only taken out of the plan (benched, or their
        # proof lapsed idle) come back beside the others at once, with no place or trial token:
        # fresh silent claims filling every place, or take-backs driving the tokens into debt,
        # just before a trusted cover slowed kept them out (red team round 28).
        returning = [o for o in candidates if self._returning(self._workers[o.peer])]
        places = max(0, self._probation_limit() - len(on_probation))
        newcomers = [o for o in candidates if not self._workers[o.peer].active and o not in returning]
        if newcomers and places:  # new trials only as trial tokens allow
            places = self._trial_places(min(places, len(newcomers)))
        admitted = {o.peer for o in on_probation} | {o.peer for o in newcomers[:places]}
        admitted |= {o.peer for o in returning}
        trial = tuple(o for o in candidates if o.peer in admitted)
        waiting = tuple(
            Kept(
                o.peer,
                f"waiting for probation: {self.config.max_probation} unproven workers at most are active "
                f"at once (activation.max_probation)",
            )
            for o in newcomers[places:]
        )
        chosen = {o.peer for o in full.workers}
        names = ", ".join(o.peer for o in trial)
        kept = tuple(
            Kept(o.peer, f"kept: proven, while {names} {'is' if len(trial) == 1 else 'are'} on probation")
            for o in base.workers
            if o.peer not in chosen
        )
        workers = tuple(sorted((*base.workers, *trial), key=_order))
        rate = sum(w.rate for w in workers)
        feasible = full.feasible and rate >= need.required_rate * (1 - _EPS)
        reason = full.reason
        if not reason and not feasible:
            reason = (
                f"not enough capacity yet: the proven workers and those on probation give {rate:.4g} "
                f"completions/s, the need is {need.required_rate:.4g}/s; {len(waiting)} unproven "
                f"workers wait for probation"
            )
        return Plan(
            workers=workers,
            need=need,
            predicted_rate=rate,
            required_rate=need.required_rate,
            predicted_utilization=_utilization(rate, need),
            cost_per_step=_cost_per_step(workers, need),
            feasible=feasible,
            reason=reason,
            excluded=full.excluded,
            kept=kept,
            probation=tuple(o.peer for o in trial),
            waiting=waiting,
        )

    def _cold_start(self, full: Plan, eligible: list[WorkerOffer], need: Need) -> Plan:
        """No proven worker qualifies (module docstring, Probation): the plan among the never-tried
        workers when it covers the need (else ``full``); once a claim has failed, at most half of
        ``max_probation`` of its picks and other workers in join order to fill the rest; and every
        active worker it drops that has not been judged yet (make before break for trials): a
        claim not yet measured must not end a trial that is not over, whether the worker is
        delivering already or still within ``first_rollout_timeout``. Otherwise fresh identities,
        each displacing the last before it could be judged, kept every claim unjudged and the
        honest workers off for good (red team rounds 11 and 12, R11-1 and R12-1)."""
        untried = [o for o in eligible if not self._workers[o.peer].reprobes]
        first = self._plan_among(untried, need) if len(untried) < len(eligible) else full
        if first.feasible:
            full = replace(first, excluded=full.excluded)
        picks = list(full.workers)
        hedge: list[WorkerOffer] = []
        if self._claim_failed:
            # A claim failed in this run, and claims are free: whatever the plan picks may be the next
            # one (one that covers the need alone, several that do together, or tiny ones that come
            # first in plan order; red teams R8-1, R9-1, R10-2). So half the probation places (at
            # least one) go to the plan's picks in plan order and the rest to the other workers in
            # the order they joined: a fresh identity joins after the honest workers already waiting,
            # and each one tried and failed is re-tried from then on (a re-probe is a new join).
            # (Before any claim failed, an honest start plans as the plain rule does.)
            limit = self._probation_limit()
            picks = picks[: max(1, limit // 2)]
            taken = {o.peer for o in picks}
            others = [o for o in eligible if o.peer not in taken]
            waiting = sorted(
                self._plan_among(others, need, all_on=True).workers if others else (),
                key=lambda o: self._workers[o.peer].joined,
            )
            hedge = waiting[: max(0, limit - len(picks))]
            # New trials only as trial tokens allow (those already active keep their place), in the
            # order they joined, picks and the others alike: fresh claims at the top of plan order
            # must not take every token as it comes back (red team round 11, R11-2), nor fresh
            # claims queued in the other places every token from the plan's picks (round 16: honest
            # workers restarted, picked, and never tried).
            fresh = sorted(
                (
                    o
                    for o in (*hedge, *picks)
                    if not self._workers[o.peer].active and not self._returning(self._workers[o.peer])
                ),
                key=lambda o: self._workers[o.peer].joined,
            )
            allowed = {o.peer for o in fresh[: self._trial_places(len(fresh))]}
            allowed |= {o.peer for o in (*hedge, *picks) if self._returning(self._workers[o.peer])}
            picks = [o for o in picks if self._workers[o.peer].active or o.peer in allowed]
            hedge = [o for o in hedge if self._workers[o.peer].active or o.peer in allowed]
        picked = {o.peer for o in picks}
        chosen = picked | {o.peer for o in hedge}
        # Active and not judged: a measured 0 is adopted as a planned rate of 0, a measured rate
        # is adopted or backs the claim (proven), so a positive planned rate means on trial. A
        # trial begun at this same instant has not begun (offers that arrive together, as at a
        # start, are planned as the plain rule plans them); any later one is kept until judged.
        on_trial = [
            o
            for o in eligible
            if (w := self._workers[o.peer]).active
            and w.activated_at < self._now
            and o.rate > 0
            and o.peer not in chosen
            and (exclusion_reason(o, full.need) is None or self._late_only(w, full.need))
        ]
        if on_trial and not self._claim_failed:
            # New claims beside trials under way, before any claim failed: claims are displacing
            # each other, so new trials are paced as once a claim failed (those under way keep their
            # place). Otherwise a fresh claim per recruit round, each kept until judged, made the
            # learner hold hundreds of unjudged trials at once (red team round 13).
            self._trials_kept = True
            fresh = [o for o in picks if not self._workers[o.peer].active]
            allowed = {o.peer for o in fresh[: self._trial_places(len(fresh))]}
            picks = [o for o in picks if self._workers[o.peer].active or o.peer in allowed]
        if not on_trial and not hedge and len(picks) == len(full.workers):
            return full
        names = ", ".join(o.peer for o in picks) or "nobody"
        kept = tuple(
            Kept(
                o.peer,
                f"kept: on trial until its rate is measured (or it is silent for "
                f"activation.first_rollout_timeout), no proven worker yet ({names} planned)",
            )
            for o in on_trial
        )
        workers = tuple(sorted((*picks, *hedge, *on_trial), key=_order))
        rate = sum(w.rate for w in workers)
        feasible = rate >= full.need.required_rate * (1 - _EPS)
        return replace(
            full,
            workers=workers,
            predicted_rate=rate,
            predicted_utilization=_utilization(rate, full.need),
            cost_per_step=_cost_per_step(workers, full.need),
            feasible=feasible,
            reason="" if feasible else full.reason,
            kept=kept,
            probation=tuple(o.peer for o in hedge),
        )

    def _replan(self, now: float, cause: str) -> list[ActivationAction]:
        eligible: list[WorkerOffer] = []
        banned: list[Exclusion] = []
        for offer in self._offers():
            until = self._banned_until(offer.peer, now)
            if until is None:
                eligible.append(offer)
            else:
                reason = self._ban_reasons.get(offer.peer, "banned")
                banned.append(Exclusion(offer.peer, f"{reason} (excluded until {until:.6g})"))
        banned_peers = {e.peer for e in banned}
        old_plan = self._plan
        need = self._need()
        self._short_of_trials = False
        self._trials_kept = False
        full = self._plan_among(eligible, need, count_fallback=True)
        new = self._probation(full, eligible, need)
        new = replace(new, excluded=new.excluded + tuple(banned))
        self._plan = new
        self.stats.replans += 1
        lease = self.config.lease_seconds
        activations: list[ActivationAction] = []
        limited = self._trials_limited()
        for offer in new.workers:
            worker = self._workers[offer.peer]
            new_trial = not worker.active
            if new_trial:
                if self._returning(worker):
                    worker.returned_span, worker.last_span = worker.last_span, 0.0
                elif limited and not self._proven(worker):
                    self._trials.spend(now, 1.0)  # planned within the tokens (``_trial_places``)
                    worker.trial_token = True
                worker.active = True
                worker.idle_since = None
                worker.activated_at = now
                worker.lapsed = False  # on trial again: what it shows now decides
                worker.measure_from = None
                worker.samples.clear()
                self.stats.activations += 1
            elif math.isclose(worker.target_rate, offer.rate, rel_tol=_EPS):
                continue
            else:
                self.stats.rate_changes += 1
            worker.target_rate = offer.rate
            worker.lease_expires_at = now + lease
            if new_trial:
                worker.drift_since = None
            # A new target for a worker already active does not restart its drift hold: a worker
            # measured at 0 that re-advertised beyond the band every 20 s was never judged, kept the
            # plan and every probation place for the hour (red team round 13).
            activations.append(Activate(offer.peer, offer.rate, lease))
        deactivations: list[ActivationAction] = []
        # Active under the last plan while outside the latency rule (a top-up, or on probation judged
        # without the rule): dropped now, the plan stopped needing it, its own figures did not put it
        # out, so it is judged as a worker the plan made unneeded (red team round 29: a slow-link
        # honest worker dropped by a cover's recovery after its first delivery was a failed claim, a
        # re-try sent behind later identities, and the cold start armed).
        was_outside = {o.peer for o in old_plan.workers if exclusion_reason(o, old_plan.need) is not None}
        chosen = set(new.active)
        reasons = {e.peer: e.reason for e in new.excluded}
        for peer, worker in self._workers.items():
            if worker.active and peer not in chosen:
                batch = self._batch_active
                if batch is not None and worker.activated_at >= now and peer not in batch:
                    # Activated and dropped within one batch (``handle_all`` sends neither): the
                    # trial never began, so it costs no token and no join place (red team round
                    # 14, F3). Only within a batch: an Activate sent by ``poll`` or another event
                    # was sent, and its token stays spent.
                    if worker.trial_token:
                        worker.trial_token = False
                        self._trials.give(now)
                elif (
                    peer in reasons
                    and not self._proven(worker)
                    and peer not in banned_peers
                    and not self._dropped_early_by_its_d(worker, new.need, now)
                    and not (peer in was_outside and self._late_only(worker, new.need))
                ):
                    # Unproven, and the plan can no longer use it: its own figures put it out (a
                    # delivery so large that its modelled tail misses the staleness bound, a rate
                    # measured at 0). Its trial ended on its own doing, unjudged: a failed claim and
                    # a re-try. Otherwise a claim could end each trial with one large delivery just
                    # before first_rollout_timeout while the next identity was picked (red team
                    # round 14, F1: honest workers 0% of a learner start's hour).
                    self._claim_failed = True
                    if worker.zeroed_at is None:
                        worker.reprobes += 1
                        worker.joined = self._next_join()
                elif (
                    (peer not in reasons or peer in was_outside)
                    and not self._proven(worker)
                    and worker.measure_from is None
                    and now - worker.activated_at >= self.config.first_rollout_timeout
                ):
                    # Dropped after it was silent as long as ``first_rollout_timeout`` allows (at a
                    # cold start an unjudged trial is kept, so this is a probationer that cheaper
                    # proven workers made unneeded): a re-try (a new join) and a failed claim, as if
                    # measured at 0. (Judged by rate_window, honest workers whose first delivery
                    # takes longer, a large model's weights and first batch, armed the hedge with
                    # no attacker: red team round 12, R12-3.) Dropped sooner, it was not yet due: it
                    # keeps its join place. Sent to the back, two honest probationers dropped by a
                    # proven worker's recovery waited behind 64 silent identities for 40 minutes
                    # (red team round 25, F2: 21.8% of the completions in ``first60``).
                    worker.reprobes += 1
                    worker.joined = self._next_join()
                    self._claim_failed = True
                if self._proven(worker):
                    worker.benched = True
                    measured = self._measured_rate(worker, now)
                    if measured is None or self._rate_drifts(measured, worker.planned_rate):
                        # No full window in this activation backs it: not trusted again until one
                        # does; and taking itself out so (its own re-advertisement) is a drop, as
                        # a leave while falling short is.
                        worker.cold = True
                        if peer == self._readvertising:
                            self._claim_failed = True
                            self._note_down_adoption(worker, now, role=False)
                            self._drops.append((now, None))
                span, base = (
                    now - worker.activated_at,
                    self.config.first_rollout_timeout + self.config.rate_window,
                )
                shown = self._measured_rate(worker, now)
                if (
                    worker.returned_span >= base
                    and span < base
                    and (shown is None or not self._rate_drifts(shown, worker.planned_rate))  # not failing
                    and peer != self._readvertising
                    and peer not in banned_peers
                    and now - worker.return_kept_at >= base
                ):
                    worker.last_span, worker.return_kept_at = worker.returned_span, now
                else:
                    worker.last_span = span
                worker.returned_span = 0.0
                worker.active = False
                worker.drift_since = None
                worker.idle_since = now
                self.stats.deactivations += 1
                reason = reasons.get(peer, "not needed: cheaper workers cover the need")
                deactivations.append(Deactivate(peer, reason))
        if self.active() and self._next_check_at is None:
            self._next_check_at = now + self.config.check_interval
        return [*activations, *deactivations, PlanChanged(new, cause)]

    # -- measurement ----------------------------------------------------------------------------

    def _rate_drifts(self, measured: float, planned: float) -> bool:
        """Outside the drift band, or short of the plan by more than its margin absorbs: with a
        band (25%) wider than the margin (10%), one claim of 12/s delivering 9/s covered the need
        alone and kept every honest worker idle (red team round 19: 75% of the completions)."""
        margin = self.config.margin
        short = margin > 0 and measured * (1 + margin) < planned * (1 - _EPS)
        return short or self._outside_band(measured, planned)

    def _outside_band(self, value: float, reference: float) -> bool:
        return abs(value - reference) > self.config.drift_fraction * reference * (1 + _EPS)

    def _record(self, worker: _Worker, now: float, count: int) -> None:
        samples = worker.samples
        if samples and samples[-1][0] == now:
            samples[-1] = (now, samples[-1][1] + count)
        else:
            samples.append((now, count))
        self._prune_samples(worker, now)
        while len(samples) > self.config.max_samples_per_worker:
            # Merge the two oldest into the later one: the count stays, its time moves a little later.
            _, first = samples.popleft()
            t, second = samples.popleft()
            samples.appendleft((t, first + second))

    def _prune_samples(self, worker: _Worker, now: float) -> None:
        horizon = now - self.config.rate_window
        while worker.samples and worker.samples[0][0] <= horizon:
            worker.samples.popleft()

    def _measured_rate(self, worker: _Worker, now: float) -> float | None:
        if not worker.active:
            return None
        window = self.config.rate_window
        if worker.measure_from is None:
            return 0.0 if now - worker.activated_at >= self.config.first_rollout_timeout else None
        if now - worker.measure_from < window:
            return None
        self._prune_samples(worker, now)
        return sum(count for _, count in worker.samples) / window

    def _check_drift(self, now: float, only: PeerId | None = None) -> list[ActivationAction]:
        """Adopt drifts that lasted ``drift_hold`` (of every active worker, or of ``only``) and re-plan."""
        adopted: list[str] = []
        backed: list[str] = []
        for peer, worker in self._workers.items():
            if not worker.active or (only is not None and peer != only):
                continue
            measured = self._measured_rate(worker, now)
            if measured is None or not self._rate_drifts(measured, worker.planned_rate):
                worker.drift_since = None
                if (
                    measured is not None
                    and measured > 0
                    and worker.backed
                    and (worker.cold or worker.benched)
                ):
                    worker.cold = worker.benched = False  # a window in this activation backs it again
                    backed.append(peer)
                if measured is not None and measured > 0 and not worker.backed:
                    worker.backed = True  # a full window shows what the plan counts on: proven
                    worker.cold = worker.benched = False
                    backed.append(peer)
                    self._trial_passed(worker, now)
                    self._hold_new_trust(worker, now)
                continue
            if worker.drift_since is None:
                worker.drift_since = now
            # The same sum as next_deadline's: ``now - since >= hold`` can miss by one ulp at the
            # deadline itself, and a driver polling at the deadline then polled for ever.
            if now >= worker.drift_since + self.config.drift_hold:
                adopted.append(f"{peer} measured {measured:.4g}/s, planned {worker.planned_rate:.4g}/s")
                if worker.backed and measured < worker.planned_rate:
                    self._note_down_adoption(worker, now)
                worker.planned_rate = measured
                worker.measured_adopted = True
                worker.zeroed_at = now if measured <= 0 else None
                if measured <= 0 and not worker.backed:
                    self._claim_failed = True  # a claim nobody could back: cold starts hedge from now on
                worker.drift_since = None
                if measured > 0 and not worker.backed:
                    worker.backed = True  # the plan now counts on what it measured: proven
                    worker.cold = worker.benched = False
                    backed.append(peer)
                    self._trial_passed(worker, now)
                    self._hold_new_trust(worker, now)
        # Proving a probationer changes the plan only where the probation rule bent it: proven
        # workers kept, others waiting, or probationers the proven ones may now make unneeded.
        passed = bool(backed) and bool(self._plan.kept or self._plan.waiting or self._plan.probation)
        if passed:
            self.stats.probations_passed += len(backed)
        if adopted:
            self.stats.drift_replans += 1
            return self._replan(now, "rate drift: " + "; ".join(adopted))
        if passed:
            return self._replan(now, "measured rate backs the offer, probation over: " + ", ".join(backed))
        return []

    def _renew(self, now: float) -> list[ActivationAction]:
        actions: list[ActivationAction] = []
        lease = self.config.lease_seconds
        for peer, worker in self._workers.items():
            if worker.active and now >= worker.lease_expires_at - self.config.renew_before:
                worker.lease_expires_at = now + lease
                self.stats.renewals += 1
                actions.append(Activate(peer, worker.target_rate, lease, renewal=True))
        return actions

    def _prune_steps(self, now: float) -> None:
        horizon = now - self.config.utilization_window
        while self._steps and self._steps[0][0] <= horizon:
            self._steps.popleft()

    def _banned_until(self, peer: PeerId, now: float) -> float | None:
        until = self._bans.get(peer)
        return until if until is not None and until > now else None

    def _clock(self, now: float) -> float:
        if now > self._now:
            self._now = now
        return self._now
