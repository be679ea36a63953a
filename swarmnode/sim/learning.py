"""Learning mode of the simulator: N real learners on the tiny model in one process, sharing rollouts
through the same sans-IO ``GossipCore`` and ``AdmissionPipeline`` the node runs.

Owns
    Building N agents (a warm-started tiny policy each, its own ``Trainer``, Ed25519 identity,
    ``GossipCore`` and ``AdmissionPipeline``), the in-memory network that carries their
    announcements and pulls, the synchronous round barrier, and the result record.
Must not
    Open sockets, start processes or read the wall clock for anything but reporting seconds:
    the gossip cores and admission run on a virtual clock, so a run is a pure function of its
    scenario (bit for bit on one machine and thread count; ``tests/sim/test_learning.py``).

A round ``r`` (swarm round ``ceil(EPOCH / round_seconds) + r``, starting at virtual time ``t0``), every
agent in index order:

1. generates its groups with its own policy (``Trainer.generate_groups``), scored by its verifier;
2. if it exchanges (``mixing != "none"`` and ``external_groups > 0``): seals them as one signed
   ``RolloutBatch`` envelope (``swarmnode.roles.convert.rollout_batch``, sent at ``t0 + 1``) and publishes it
   to its gossip core;
3. the in-memory network runs every core until ``t0 + train_at * round_seconds``, jumping the
   virtual clock from one ``next_deadline()`` to the next: ``Announce`` writes a record into a
   shared table, ``ReadAnnouncements`` reads the other agents' records, ``Pull`` is answered at
   once by the target core (``PullRequest`` -> ``Serve``), ``Admit`` runs the receiver's real
   ``AdmissionPipeline`` (signature, replay, freshness, task re-derivation, re-scoring by the
   receiver's verifier) and admitted groups are re-tokenized (``swarmnode.roles.convert.to_scored``) into
   the receiver's pool, exactly as the node's ``GossipDriver`` does (under SAPO, groups without
   signal are not re-tokenized: ``select_groups`` drops them before its draw, so only time changes);
4. every agent trains (``Trainer.train_round``) on its own groups plus everything admitted this
   round; the trainer's mixing rule (SAPO ``select_groups`` / HACPO) picks I local + J external.

Zero network latency and a barrier per round: this measures the learning rule, not the network
(the simulator's network mode measures that).

Scenario keys (TOML ``[simulation] mode = "learning"`` plus a ``[learning]`` table; every key
optional, unknown keys are an error)::

    [learning]
    agents = 8                 # N learners
    rounds = 20                # training rounds per run
    seeds = [0, 1, 2]          # one run per seed (or seed = 0; default [simulation] seed, else 0);
                               # agent i of seed s uses node seed 1000*s + i
    mixing = "sapo"            # "none" | "sapo" | "hacpo" | "joint" | "receiver_baseline" |
                               # "positive_only" | "anchored" | "replay" (the trainer's
                               # swarm.mixing; learn.transfer)
    local_groups = 4           # I: own groups per update (SAPO; HACPO uses every own group)
    external_groups = 4        # J: external groups per update; 0 = no exchange (nothing published)
    round_demand = 0           # peers' items pulled per round, drawn at its end (swarm.round_demand;
                               # core.demand); 0: every item announced
    prompts_per_round = 8      # groups each agent generates per round
    group_size = 8             # G completions per prompt
    max_new_tokens = 6
    temperature = 1.0
    algorithm = "grpo"         # loss on own groups: "grpo" | "dapo" | "gspo"
    engine = "torch"           # every agent's rollout engine: "torch" | "hf" | "vllm" (GPU only)
    lr = 1e-4
    updates_per_round = 1
    precision = "fp32"         # the updates' arithmetic (learn.precision): "bf16" on a CPU with
                               # bf16 units runs the matmuls in bfloat16, ~1.25x faster per round here
    shared_tasks = false       # true: every agent answers the same prompts each round (HACPO)
    eval_every = 0             # greedy held-out accuracy every N rounds (always at start and end)
    heldout_size = 200         # held-out tasks, the same set for every agent (mixture seed eval_seed)
    eval_seed = 0
    mixture = "default"        # the tiny model's task mixture (2-term chain_sum, compact prompts)
    datasets = [               # or: the training mixture of every agent, as [[tasks.datasets]]
      { name = "chain_sum", config = { max_terms = 2 }, weight = 1.0, prompt_format = "compact" },
      { name = "products", config = { max_digits = 1 }, prompt_format = "compact", label = "mul" },
    ]                          # (label: the family's name in results; default: the generator's)
    specialists = false        # true: agent i is warm-started on datasets[i % len(datasets)] alone
                               # (held-out accuracy is then reported per family as well)
    warm_start_seed = 0        # every agent starts from the same warm start of its model
    warm_start_steps = 0       # 0: the standard warm start (stops by evaluation); n: exactly n steps
    cache_dir = "runs/sim-cache"   # warm-start cache (default: OUT_DIR/cache)
    threads = 1                # torch threads for the whole run
    round_seconds = 30.0       # virtual round length
    train_at = 0.8             # fraction of a round at which agents train
    models = [{ name = "tiny" }, { name = "small", overrides = { hidden_size = 96 } }]
                               # agent i gets models[i % len(models)]; overrides change the tiny
                               # Llama config (never downloads anything)

Result (also written to ``OUT_DIR/learning.json``): ``scenario`` (the name from ``[simulation]``),
``learning`` (the parsed keys), ``runs`` (one per
seed: per agent its rewards, accuracy, own/external groups used and received per round, held-out
accuracy by round (with several ``datasets``: per family too, and the mean over families), the
family it was warm-started on, gossip and admission counters, a SHA-256 of its final weights; and the run's
``total_reward`` = sum over agents and rounds of each agent's mean own reward), ``summary`` over
seeds, and ``timing`` and ``wall_seconds`` (the only parts that differ between identical runs).
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from swarmnode.admit import AdmissionConfig, AdmissionPipeline, Rejected, task_families
from swarmnode.config import load_config
from swarmnode.errors import ConfigError
from swarmnode.gossip.core import (
    Admit,
    Announce,
    Announced,
    GossipConfig,
    GossipCore,
    GossipEvent,
    Pull,
    PullRequest,
    PullSucceeded,
    ReadAnnouncements,
    Retire,
    Serve,
)
from swarmnode.gossip.intake import DecodedEnvelopes, ExternalPool, decode_pulled, publication, verdict_events
from swarmnode.identity import NodeIdentity
from swarmnode.learn import zero_advantage
from swarmnode.policy import Policy, load_policy
from swarmnode.policy.evaluate import evaluate_accuracy
from swarmnode.policy.warmstart import WarmStartSettings, warm_start, warm_start_dir
from swarmnode.roles.convert import rollout_batch, to_scored, trained_texts
from swarmnode.rollout import make_engine
from swarmnode.store import CheckpointStore, Ledger
from swarmnode.tasks import DatasetSpec, Task, TaskMixture, default_mixture, family_names, mixture_from_specs
from swarmnode.train import ScoredGroup, Trainer
from swarmnode.wire import encode_envelope, seal, to_ms

#: Virtual time of round 0 (a plausible wall-clock value: envelopes carry it as ``sent_at``).
EPOCH = 1_700_000_000.0
PUBLISH_AT = 1.0  # seconds into a round at which agents publish
MAX_STEPS_PER_ROUND = 100_000  # guard against a driver loop that stops advancing

Progress = Callable[[str], None]


# ------------------------------------------------------------------------------------- scenario


@dataclass(frozen=True)
class ModelSpec:
    """One model of the swarm: a name and overrides of the packaged tiny Llama config."""

    name: str = "tiny"
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LearningScenario:
    """The ``[learning]`` table, validated (see the module docstring for each key)."""

    agents: int = 2
    rounds: int = 10
    seeds: tuple[int, ...] = (0,)
    mixing: str = "sapo"
    local_groups: int = 4
    external_groups: int = 4
    round_demand: int = 0
    prompts_per_round: int = 8
    group_size: int = 8
    max_new_tokens: int = 6
    temperature: float = 1.0
    algorithm: str = "grpo"
    engine: str = "torch"
    lr: float = 1e-4
    updates_per_round: int = 1
    precision: str = "fp32"
    shared_tasks: bool = False
    shared_prefix: bool = True  # learn.shared_prefix: each group's prompt scored once in the update
    eval_every: int = 0
    heldout_size: int = 200
    eval_seed: int = 0
    mixture: str = "default"
    datasets: tuple[DatasetSpec, ...] = ()
    labels: tuple[str, ...] = ()  # each dataset's optional label (its ``label`` key)
    specialists: bool = False
    warm_start_seed: int = 0
    warm_start_steps: int = 0
    cache_dir: str = ""
    threads: int = 1
    round_seconds: float = 30.0
    train_at: float = 0.8
    models: tuple[ModelSpec, ...] = (ModelSpec(),)

    @property
    def exchanges(self) -> bool:
        return self.mixing != "none" and self.external_groups > 0

    def model_of(self, agent: int) -> ModelSpec:
        return self.models[agent % len(self.models)]

    def training_mixture(self, seed: int) -> TaskMixture:
        """Every agent's training mixture (``datasets``, else the ``mixture`` preset) at ``seed``."""
        return TaskMixture(list(self.datasets), seed) if self.datasets else default_mixture(seed)

    def families(self) -> dict[str, DatasetSpec]:
        """Each dataset by its family name (``swarmnode.tasks.family_names``: its label, else its
        generator's name)."""
        return family_names(self.datasets)

    def warm_family(self, agent: int) -> str | None:
        """The family agent ``agent`` is warm-started on alone (None: the training mixture)."""
        if not self.specialists:
            return None
        labels = list(self.families())
        return labels[agent % len(labels)]


_INT_KEYS = {
    "agents": 1,
    "rounds": 0,
    "local_groups": 0,
    "external_groups": 0,
    "round_demand": 0,
    "prompts_per_round": 1,
    "group_size": 1,
    "max_new_tokens": 1,
    "updates_per_round": 1,
    "eval_every": 0,
    "heldout_size": 0,
    "eval_seed": 0,
    "warm_start_seed": 0,
    "warm_start_steps": 0,
    "threads": 1,
}
_CHOICES = {
    "mixing": ("none", "sapo", "hacpo", "joint", "receiver_baseline", "positive_only", "anchored", "replay"),
    "algorithm": ("grpo", "dapo", "gspo"),
    "engine": ("torch", "hf", "vllm"),
    "precision": ("fp32", "bf16"),
    "mixture": ("default",),
}


def parse_learning(scenario: Mapping[str, Any]) -> LearningScenario:
    """The ``[learning]`` table of a scenario (or the table itself), checked; errors name the key."""
    table = scenario.get("learning", scenario)
    if not isinstance(table, Mapping):
        raise ConfigError("[learning] must be a table")
    known = {f for f in LearningScenario.__dataclass_fields__} | {"seed"}
    unknown = sorted(set(table) - known - {"simulation"})
    if unknown:
        raise ConfigError(f"unknown [learning] key(s) {unknown}; known: {sorted(known)}")
    values: dict[str, Any] = {}
    for key, minimum in _INT_KEYS.items():
        if key in table:
            value = table[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ConfigError(f"learning.{key} must be an integer >= {minimum}, got {value!r}")
            values[key] = value
    for key, choices in _CHOICES.items():
        if key in table:
            if table[key] not in choices:
                raise ConfigError(f"learning.{key} must be one of {list(choices)}, got {table[key]!r}")
            values[key] = table[key]
    for key, low, high in (("lr", 0.0, 1.0), ("temperature", 0.0, 10.0), ("train_at", 0.0, 1.0)):
        if key in table:
            value = table[key]
            if isinstance(value, bool) or not isinstance(value, int | float) or not low < value <= high:
                raise ConfigError(f"learning.{key} must be a number in ({low}, {high}], got {value!r}")
            values[key] = float(value)
    if "round_seconds" in table:
        value = table["round_seconds"]
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 2 * PUBLISH_AT:
            raise ConfigError(f"learning.round_seconds must be a number >= {2 * PUBLISH_AT}, got {value!r}")
        values["round_seconds"] = float(value)
    if "shared_tasks" in table:
        if not isinstance(table["shared_tasks"], bool):
            raise ConfigError(f"learning.shared_tasks must be true or false, got {table['shared_tasks']!r}")
        values["shared_tasks"] = table["shared_tasks"]
    if "shared_prefix" in table:
        if not isinstance(table["shared_prefix"], bool):
            raise ConfigError(f"learning.shared_prefix must be true or false, got {table['shared_prefix']!r}")
        values["shared_prefix"] = table["shared_prefix"]
    if "cache_dir" in table:
        values["cache_dir"] = str(table["cache_dir"])
    if "datasets" in table:
        if "mixture" in table:
            raise ConfigError("give learning.datasets or learning.mixture, not both")
        values["datasets"], values["labels"] = _parse_datasets(table["datasets"])
    if "specialists" in table:
        if not isinstance(table["specialists"], bool):
            raise ConfigError(f"learning.specialists must be true or false, got {table['specialists']!r}")
        if table["specialists"] and len(values.get("datasets", ())) < 2:
            raise ConfigError("learning.specialists = true needs learning.datasets with at least two entries")
        values["specialists"] = table["specialists"]
    if "seed" in table and "seeds" in table:
        raise ConfigError("give learning.seeds (a list) or learning.seed, not both")
    simulation = scenario.get("simulation", {})
    fallback = simulation.get("seed", 0) if isinstance(simulation, Mapping) else 0
    seeds = table.get("seeds", [table["seed"]] if "seed" in table else [fallback])
    if (
        not isinstance(seeds, list | tuple)
        or not seeds
        or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds)
    ):
        raise ConfigError(f"learning.seeds must be a non-empty list of integers >= 0, got {seeds!r}")
    values["seeds"] = tuple(seeds)
    if "models" in table:
        models = table["models"]
        if not isinstance(models, list | tuple) or not models:
            raise ConfigError("learning.models must be a non-empty list of tables {name, overrides}")
        specs = []
        for i, model in enumerate(models):
            if not isinstance(model, Mapping) or set(model) - {"name", "overrides"}:
                raise ConfigError(f"learning.models[{i}] must be a table with keys name and overrides")
            overrides = model.get("overrides", {})
            if not isinstance(overrides, Mapping):
                raise ConfigError(f"learning.models[{i}].overrides must be a table")
            specs.append(ModelSpec(str(model.get("name", f"model{i}")), dict(overrides)))
        values["models"] = tuple(specs)
    parsed = LearningScenario(**values)
    if parsed.agents >= 1000:
        raise ConfigError("learning.agents must be below 1000 (agent seeds are 1000 * seed + index)")
    if parsed.mixing in ("hacpo", "joint") and not parsed.shared_tasks and parsed.exchanges:
        raise ConfigError(
            f"learning.mixing = {parsed.mixing!r} needs shared_tasks = true: it learns from other agents' "
            "answers to the prompts it answered itself"
        )
    return parsed


def _parse_datasets(entries: object) -> tuple[tuple[DatasetSpec, ...], tuple[str, ...]]:
    """``learning.datasets``: tables as ``[[tasks.datasets]]`` entries (plus an optional ``label``
    naming the family in results), each checked as a node checks its mixture at start
    (``mixture_from_specs``: generator, config keys, weight, safe scorer). Returns specs and labels."""
    if not isinstance(entries, list | tuple) or not entries:
        raise ConfigError(
            "learning.datasets must be a non-empty list of tables {name, config, weight, prompt_format}"
        )
    specs, labels = [], []
    allowed = {"name", "config", "weight", "prompt_format", "label"}
    for i, entry in enumerate(entries):
        where = f"learning.datasets[{i}]"
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str) or set(entry) - allowed:
            raise ConfigError(f"{where} must be a table with a name and only the keys {sorted(allowed)}")
        config = entry.get("config", {})
        weight = entry.get("weight", 1.0)
        if not isinstance(config, Mapping):
            raise ConfigError(f"{where}.config must be a table")
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise ConfigError(f"{where}.weight must be a number, got {weight!r}")
        fmt = entry.get("prompt_format", "question")
        label = str(entry.get("label", ""))
        specs.append(DatasetSpec(entry["name"], dict(config), float(weight), str(fmt), label))
        labels.append(label)
    # Raises ConfigError naming the entry (or two entries with one family name).
    mixture_from_specs(specs, 0, key="learning.datasets")
    return tuple(specs), tuple(labels)


# ------------------------------------------------------------------------------------- agents


@dataclass
class AgentLog:
    """Per-round record of one agent."""

    rewards: list[float] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)
    own_used: list[int] = field(default_factory=list)
    external_used: list[int] = field(default_factory=list)
    external_received: list[int] = field(default_factory=list)
    loss: list[float | None] = field(default_factory=list)
    heldout: dict[int, float] = field(default_factory=dict)
    heldout_by_family: dict[str, dict[int, float]] = field(default_factory=dict)


class Agent:
    """One learner: trainer, identity, gossip core, admission, and what the network handed it."""

    def __init__(
        self,
        index: int,
        seed: int,
        spec: LearningScenario,
        policy: Policy,
        model: ModelSpec,
        workdir: Path,
    ) -> None:
        self.index = index
        self.model = model
        node_seed = 1000 * seed + index
        task_seed = 1000 * seed if spec.shared_tasks else node_seed
        self.identity = NodeIdentity.from_seed(hashlib.sha256(f"swarmnode-sim:{node_seed}".encode()).digest())
        self.peer_id = self.identity.peer_id
        config = load_config(
            None,
            environ={},
            overrides={
                "node.seed": node_seed,
                "tasks.seed": task_seed,
                "tasks.heldout_size": 0,  # evaluated here, on one held-out set shared by every agent
                "rollout.prompts_per_round": spec.prompts_per_round,
                "rollout.group_size": spec.group_size,
                "rollout.max_new_tokens": spec.max_new_tokens,
                "rollout.temperature": spec.temperature,
                "learn.algorithm": spec.algorithm,
                "learn.lr": spec.lr,
                "learn.updates_per_round": spec.updates_per_round,
                "learn.precision": spec.precision,
                "learn.shared_prefix": spec.shared_prefix,
                "swarm.mixing": spec.mixing,
                "swarm.local_groups": spec.local_groups,
                "swarm.external_groups": spec.external_groups,
                "swarm.round_demand": spec.round_demand,
                "checkpoint.every_rounds": 10**9,  # a simulated run is never resumed
            },
        )
        self.mixture: TaskMixture = spec.training_mixture(task_seed)
        self.warm_family = spec.warm_family(index)
        self.ledger = Ledger(workdir / f"agent-{index}.sqlite")
        self.trainer = Trainer(
            config,
            policy,
            make_engine(spec.engine, policy),
            self.mixture,
            self.ledger,
            CheckpointStore(workdir / f"checkpoints-{index}"),
            eval_every=10**9,
        )
        self.trainer.node_id = self.peer_id
        self.max_new_tokens = spec.max_new_tokens
        # No digest_of: every pulled item's digest is its payload's own (decode_pulled, as in the
        # node's driver), so the core's check could never fail, and it would decode it a second time.
        self.core = GossipCore(
            GossipConfig(
                round_seconds=spec.round_seconds,
                read_interval=min(5.0, spec.round_seconds / 6),
                round_demand=spec.round_demand,
            ),
            self.peer_id,
            selection_key=f"swarmnode-sim:{node_seed}".encode(),  # seeded: runs repeat
        )
        max_new = spec.max_new_tokens
        self.admission = AdmissionPipeline(
            AdmissionConfig(
                allowed_tasks=task_families(self.mixture),
                system_prompt_sha256=policy.system_prompt_sha256,
                local_peer_id=self.peer_id,
            ),
            now=EPOCH,
            # As the node's: completions are rendered to the ids we train, and one longer than we
            # generate is refused. Without it such a group was admitted, and ended the whole run
            # when its conversion raised (red team rt33 F4).
            render=lambda texts: trained_texts(policy, texts, max_new),
        )
        self.payloads: dict[bytes, bytes] = {}
        self.pending: list[GossipEvent] = []
        self.decoded = DecodedEnvelopes()  # pulled payloads' decodes, until their Admit
        self.pool = ExternalPool()  # the node's pool: each round's admitted groups, taken at training
        self.received = 0  # external groups admitted this round
        self.sources: dict[str, int] = {}  # sender peer id -> groups admitted, over the run
        self.sapo = spec.mixing == "sapo"
        self.log = AgentLog()

    def close(self) -> None:
        self.ledger.close()

    def publish(self, groups: list[ScoredGroup], swarm_round: int, now: float) -> None:
        policy = self.trainer.policy
        batch = rollout_batch(
            groups,
            policy.model_id,
            policy.version,
            swarm_round,
            system_prompt_sha256=policy.system_prompt_sha256,
        )
        envelope = seal(self.identity, batch, to_ms(now))
        data = encode_envelope(envelope)
        event = publication(envelope, data)
        # As the node's driver: our own envelope handed back by a peer is a replay, never a peer's.
        self.admission.remember_own(envelope, now)
        self.payloads[event.digest] = data
        self.pending.append(event)

    def pulled(self, request_id: int, peer: str, payloads: Sequence[bytes], now: float) -> None:
        """A pull's answer, decoded once as the node's driver does (no bytes here are not envelopes)."""
        pulled = decode_pulled(payloads, self.decoded)
        for payload in pulled.not_envelopes:
            self.judge(peer, None, payload, now)
        self.pending.append(PullSucceeded(request_id, peer, pulled.items, pulled.unreadable))

    def admit(self, action: Admit, now: float) -> None:
        self.judge(action.peer, action.digest, action.payload, now)

    def judge(self, peer: str, digest: bytes | None, payload: bytes, now: float) -> None:
        """Admission of ``payload`` from ``peer`` (``digest``: the core's Admit, None: not an envelope)."""
        envelope = self.decoded.take(payload)
        verdict = self.admission.admit(payload, now, via=peer, solicited=True, envelope=envelope)
        self.pending += verdict_events(peer, digest, verdict, self.admission.ban_left_by(verdict, peer, now))
        if isinstance(verdict, Rejected):
            return
        swarm_round = self.core.current_round(now)
        for admitted in verdict.groups:
            self.received += 1
            self.sources[admitted.sender] = self.sources.get(admitted.sender, 0) + 1
            if self.sapo and zero_advantage(admitted.rewards):
                # SAPO drops groups without signal before its uniform draw (learn.sapo.select_groups),
                # so skipping their re-tokenization changes nothing but the time (~5 ms a group).
                continue
            self.pool.add(to_scored(admitted, self.trainer.policy, self.max_new_tokens), swarm_round)

    def weights_sha256(self) -> str:
        digest = hashlib.sha256()
        for name, tensor in sorted(self.trainer.policy.model.state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().contiguous().numpy().tobytes())
        return digest.hexdigest()


class MemoryNetwork:
    """Carries announcements and pulls between agents' gossip cores with no latency, on a virtual clock."""

    def __init__(self, agents: Sequence[Agent]) -> None:
        self.agents = {agent.peer_id: agent for agent in agents}
        self.order = list(agents)
        self.records: dict[int, dict[tuple[str, int], tuple[bytes, ...]]] = {}

    def _perform(self, agent: Agent, actions: Sequence[object], now: float) -> None:
        for action in actions:
            if isinstance(action, Announce):
                table = self.records.setdefault(action.round, {})
                table[(agent.peer_id, action.part)] = action.digests
            elif isinstance(action, ReadAnnouncements):
                for r in action.rounds:
                    for (peer, _part), digests in sorted(self.records.get(r, {}).items()):
                        if peer != agent.peer_id:
                            agent.pending.append(Announced(peer, r, digests))
            elif isinstance(action, Pull):
                target = self.agents[action.peer]
                served = target.core.handle(PullRequest(agent.peer_id, action.digests), now)
                payloads: list[bytes] = []
                for answer in served:
                    if isinstance(answer, Serve):
                        payloads = [target.payloads[d] for d in answer.digests if d in target.payloads]
                self._perform(target, [a for a in served if not isinstance(a, Serve)], now)
                agent.pulled(action.request_id, action.peer, payloads, now)
            elif isinstance(action, Admit):
                agent.admit(action, now)
            elif isinstance(action, Retire):
                agent.payloads.pop(action.digest, None)
            # CancelPull: pulls complete at once here, so there is nothing to stop.

    def step(self, now: float) -> None:
        """Run every core at ``now`` (timers, then events) until no agent has an event left to feed."""
        first = True
        while first or any(agent.pending for agent in self.order):
            first = False
            for agent in self.order:
                events, agent.pending = agent.pending, []
                # handle_all runs the timers too, as the node's driver relies on.
                actions = agent.core.handle_all(events, now) if events else agent.core.poll(now)
                self._perform(agent, actions, now)
        for agent in self.order:
            agent.decoded.clear()  # every pull result was handled: what is left, its core dropped

    def run_until(self, start: float, end: float) -> int:
        """Drive every core from ``start`` to ``end``, jumping between deadlines; returns steps taken."""
        now, steps = start, 0
        while now <= end:
            self.step(now)
            steps += 1
            if steps > MAX_STEPS_PER_ROUND:
                raise RuntimeError(f"gossip did not settle within {MAX_STEPS_PER_ROUND} steps")
            deadlines = [d for a in self.order if (d := a.core.next_deadline()) is not None]
            nxt = min(deadlines, default=math.inf)
            now = nxt if nxt > now else now + 1e-3
        # Records expire with their round (cores read the current round and read_back_rounds before it).
        current = self.order[0].core.current_round(end)
        for r in [r for r in self.records if r < current - 4]:
            del self.records[r]
        return steps


# ------------------------------------------------------------------------------------- running


WarmKey = tuple[str, str | None]  # (model name, the family it is warm-started on alone; None: the mixture)


def warm_start_keys(spec: LearningScenario) -> list[WarmKey]:
    """The distinct warm starts a scenario's agents begin from, in agent order."""
    keys: list[WarmKey] = []
    for agent in range(spec.agents):
        key = (spec.model_of(agent).name, spec.warm_family(agent))
        if key not in keys:
            keys.append(key)
    return keys


def _warm_args(spec: LearningScenario, key: WarmKey) -> tuple[TaskMixture, WarmStartSettings, dict[str, Any]]:
    """What ``warm_start`` is given for one warm start: its mixture, settings and model overrides."""
    name, family = key
    model = next(spec.model_of(a) for a in range(spec.agents) if spec.model_of(a).name == name)
    settings = (
        WarmStartSettings(
            max_steps=spec.warm_start_steps, target_accuracy=2.0, eval_every=spec.warm_start_steps
        )
        if spec.warm_start_steps
        else WarmStartSettings()
    )
    mixture = (
        spec.training_mixture(spec.warm_start_seed)
        if family is None
        else TaskMixture([spec.families()[family]], spec.warm_start_seed)
    )
    return mixture, settings, dict(model.overrides)


def warm_policy(spec: LearningScenario, key: WarmKey, cache: Path, say: Progress) -> Path:
    """One warm start of the scenario (built into ``cache`` once, then read from it)."""
    mixture, settings, overrides = _warm_args(spec, key)
    if key[1] is not None:
        say(f"warm start of {key[0]} on {key[1]} alone")
    return warm_start(
        cache,
        mixture,
        spec.warm_start_seed,
        progress=say,
        settings=settings,
        model_overrides=overrides or None,
    )


def warm_policy_dir(spec: LearningScenario, key: WarmKey, cache: Path) -> Path:
    """Where ``warm_policy`` builds or finds that warm start (two scenarios share it if equal), run
    as ``run_learning`` runs it: on ``spec.threads`` threads, which its cache key includes."""
    mixture, settings, overrides = _warm_args(spec, key)
    threads = torch.get_num_threads()
    torch.set_num_threads(spec.threads)
    try:
        return warm_start_dir(cache, mixture, spec.warm_start_seed, settings, overrides or None)
    finally:
        torch.set_num_threads(threads)


def cache_of(spec: LearningScenario, out_dir: Path) -> Path:
    """Where a scenario's warm starts are cached (``cache_dir``, default ``OUT_DIR/cache``)."""
    return Path(spec.cache_dir).expanduser() if spec.cache_dir else Path(out_dir) / "cache"


def _warm_policies(spec: LearningScenario, cache: Path, say: Progress) -> dict[WarmKey, Path]:
    return {key: warm_policy(spec, key, cache, say) for key in warm_start_keys(spec)}


#: The held-out sets: one per family when the mixture has several (label -> tasks), else {"": tasks}.
HeldOut = dict[str, list[Task]]


def _heldout_sets(spec: LearningScenario) -> HeldOut:
    if not spec.heldout_size:
        return {}
    mixture = spec.training_mixture(spec.eval_seed)
    if len(spec.datasets) > 1:
        return mixture.heldout_by_family(spec.heldout_size)
    return {"": mixture.heldout(spec.heldout_size)}


def _evaluate(agent: Agent, sets: HeldOut, r: int) -> None:
    """Greedy held-out accuracy at round ``r``: per family when there are several, and their mean."""
    scores = {
        label: evaluate_accuracy(
            agent.trainer.policy, tasks, agent.trainer.engine, max_new_tokens=agent.max_new_tokens
        )
        for label, tasks in sets.items()
    }
    agent.log.heldout[r] = statistics.fmean(scores.values())
    if len(scores) > 1:
        for label, value in scores.items():
            agent.log.heldout_by_family.setdefault(label, {})[r] = value


def _run_seed(
    spec: LearningScenario, seed: int, paths: Mapping[WarmKey, Path], heldout: HeldOut, say: Progress
) -> tuple[dict[str, Any], dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="swarmnode-sim-") as tmp:
        agents = [
            Agent(
                i,
                seed,
                spec,
                load_policy(paths[(spec.model_of(i).name, spec.warm_family(i))]),
                spec.model_of(i),
                Path(tmp),
            )
            for i in range(spec.agents)
        ]
        network = MemoryNetwork(agents)
        names = {agent.peer_id: f"agent{agent.index}" for agent in agents}
        round_seconds: list[float] = []
        started, cpu_started = time.perf_counter(), time.process_time()
        try:
            if heldout:
                for agent in agents:
                    _evaluate(agent, heldout, 0)
            for r in range(1, spec.rounds + 1):
                t_round = time.perf_counter()
                # Round r of the run is swarm round base + r, starting on a round boundary of the cores.
                swarm_round = math.ceil(EPOCH / spec.round_seconds) + r
                t0 = swarm_round * spec.round_seconds
                generated = []
                for agent in agents:
                    own, tokens, gen_seconds = agent.trainer.generate_groups(agent.trainer.round + 1)
                    generated.append((own, tokens, gen_seconds))
                    if spec.exchanges:
                        agent.publish(own, swarm_round, t0 + PUBLISH_AT)
                if spec.exchanges:
                    network.run_until(t0 + PUBLISH_AT, t0 + spec.train_at * spec.round_seconds)
                for agent, (own, tokens, gen_seconds) in zip(agents, generated, strict=True):
                    external = agent.pool.take_all(swarm_round)
                    received, agent.received = agent.received, 0
                    m = agent.trainer.train_round(own, external, tokens=tokens, gen_seconds=gen_seconds)
                    log = agent.log
                    log.rewards.append(m.mean_reward)
                    log.accuracy.append(m.accuracy)
                    log.own_used.append(m.groups_used)
                    log.external_used.append(m.external_used)
                    log.external_received.append(received)
                    log.loss.append(None if math.isnan(m.loss) else m.loss)
                    if heldout and (r == spec.rounds or (spec.eval_every and r % spec.eval_every == 0)):
                        _evaluate(agent, heldout, r)
                round_seconds.append(time.perf_counter() - t_round)
                mean = statistics.fmean(a.log.rewards[-1] for a in agents)
                received = sum(a.log.external_received[-1] for a in agents)
                used = sum(a.log.external_used[-1] for a in agents)
                say(
                    f"seed {seed} round {r}/{spec.rounds}: mean reward {mean:.3f}, external groups "
                    f"received {received} / trained on {used}, {round_seconds[-1]:.1f} s"
                )
            record = {
                "seed": seed,
                "total_reward": sum(sum(a.log.rewards) for a in agents),
                "agents": [
                    {
                        "index": a.index,
                        "name": names[a.peer_id],
                        "peer_id": a.peer_id,
                        "model": a.model.name,
                        "parameters": sum(p.numel() for p in a.trainer.policy.model.parameters()),
                        "total_reward": sum(a.log.rewards),
                        **{k: v for k, v in asdict(a.log).items() if k != "heldout_by_family"},
                        "external_sources": {names.get(p, p): n for p, n in sorted(a.sources.items())},
                        "heldout": {str(k): v for k, v in a.log.heldout.items()},
                        **(
                            {
                                "warm_family": a.warm_family,
                                "heldout_by_family": {
                                    family: {str(k): v for k, v in curve.items()}
                                    for family, curve in a.log.heldout_by_family.items()
                                },
                            }
                            if spec.datasets
                            else {}
                        ),
                        "gossip": {
                            k: v
                            for k, v in a.core.stats.as_dict().items()
                            if k
                            in (
                                "published",
                                "offers_selected",
                                "pulls_started",
                                "pulls_succeeded",
                                "admits",
                                "accepted",
                                "rejected",
                            )
                        },
                        "admission": dict(sorted(a.admission.counts().items())),
                        "weights_sha256": a.weights_sha256(),
                    }
                    for a in agents
                ],
            }
        finally:
            for agent in agents:
                agent.close()
    timing = {
        "seed": seed,
        "seconds": time.perf_counter() - started,
        # CPU time of this process: close to the wall time a run would take alone on one core.
        "cpu_seconds": time.process_time() - cpu_started,
        "round_seconds": round_seconds,
    }
    return record, timing


def _summary(spec: LearningScenario, runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    totals = [run["total_reward"] for run in runs]
    per_round = [
        statistics.fmean(statistics.fmean(a["rewards"][r] for a in run["agents"]) for run in runs)
        for r in range(spec.rounds)
    ]
    by_model: dict[str, dict[str, list[float]]] = {}
    for run in runs:
        for a in run["agents"]:
            entry = by_model.setdefault(a["model"], {"start": [], "end": [], "total_reward": []})
            entry["total_reward"].append(a["total_reward"])
            if a["heldout"]:
                entry["start"].append(a["heldout"]["0"])
                entry["end"].append(a["heldout"][str(max(int(k) for k in a["heldout"]))])
    summary: dict[str, Any] = {
        "total_reward_mean": statistics.fmean(totals),
        "total_reward_stdev": statistics.stdev(totals) if len(totals) > 1 else 0.0,
        "total_reward_per_seed": totals,
        "mean_reward_per_round": per_round,
        "by_model": {
            name: {
                "total_reward_mean": statistics.fmean(v["total_reward"]),
                "heldout_start_mean": statistics.fmean(v["start"]) if v["start"] else None,
                "heldout_end_mean": statistics.fmean(v["end"]) if v["end"] else None,
                "heldout_end_per_agent": v["end"],
            }
            for name, v in by_model.items()
        },
    }
    if spec.specialists and spec.heldout_size:
        summary["specialists"] = _specialist_summary(runs)
    return summary


def _specialist_summary(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Held-out accuracy of specialists on their own family and on the others' (mean over the
    other families), at the start and the end, per run (seed) and as mean and sd over runs."""
    per_run: dict[str, list[float]] = {"own_start": [], "own_end": [], "others_start": [], "others_end": []}
    for run in runs:
        values: dict[str, list[float]] = {k: [] for k in per_run}
        for a in run["agents"]:
            curves = a["heldout_by_family"]
            last = str(max(int(k) for k in a["heldout"]))
            own = a["warm_family"]
            others = [f for f in curves if f != own]
            values["own_start"].append(curves[own]["0"])
            values["own_end"].append(curves[own][last])
            values["others_start"].append(statistics.fmean(curves[f]["0"] for f in others))
            values["others_end"].append(statistics.fmean(curves[f][last] for f in others))
        for key, v in values.items():
            per_run[key].append(statistics.fmean(v))
    return {
        key: {
            "mean": statistics.fmean(v),
            "sd": statistics.stdev(v) if len(v) > 1 else 0.0,
            "per_seed": v,
        }
        for key, v in per_run.items()
    }


def run_learning(
    scenario: Mapping[str, Any], out_dir: Path, progress: Progress | None = None
) -> dict[str, Any]:
    """Run a learning-mode scenario (one run per seed); returns the result and writes ``learning.json``."""
    spec = parse_learning(scenario)
    say: Progress = progress or (lambda _line: None)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(spec.threads)  # results depend on it (float reduction order)
    cache = cache_of(spec, out_dir)
    started = time.perf_counter()
    paths = _warm_policies(spec, cache, say)
    warm_seconds = time.perf_counter() - started
    heldout = _heldout_sets(spec)
    runs, timings = [], []
    for seed in spec.seeds:
        record, timing = _run_seed(spec, seed, paths, heldout, say)
        runs.append(record)
        timings.append(timing)
    return _record(scenario, spec, runs, timings, time.perf_counter() - started, warm_seconds, out_dir)


def merge_seeds(
    scenario: Mapping[str, Any], parts: Sequence[Mapping[str, Any]], out_dir: Path
) -> dict[str, Any]:
    """One result for ``scenario`` from ``run_learning`` results of its seeds run apart (each part
    run on the same scenario with ``seeds`` cut to some of them, e.g. one process per seed): the
    same record and summary as one run over every seed (a seed's run does not depend on the
    others). Writes ``out_dir/learning.json``; its wall time is the parts' sum."""
    spec = parse_learning(scenario)
    by_seed = {
        run["seed"]: (run, timing)
        for part in parts
        for run, timing in zip(part["runs"], part["timing"]["runs"], strict=True)
    }
    missing = [s for s in spec.seeds if s not in by_seed]
    if missing:
        raise ValueError(f"no run of seed(s) {missing} among the parts")
    runs = [by_seed[s][0] for s in spec.seeds]
    timings = [by_seed[s][1] for s in spec.seeds]
    wall = sum(float(part["wall_seconds"]) for part in parts)
    warm = max(float(part["timing"]["warm_start_seconds"]) for part in parts)
    return _record(scenario, spec, runs, timings, wall, warm, Path(out_dir))


def _record(
    scenario: Mapping[str, Any],
    spec: LearningScenario,
    runs: Sequence[Mapping[str, Any]],
    timings: Sequence[Mapping[str, Any]],
    wall: float,
    warm_seconds: float,
    out_dir: Path,
) -> dict[str, Any]:
    """The result record of a learning run (written to ``out_dir/learning.json``)."""
    scenario_record = asdict(spec)
    scenario_record["models"] = [asdict(m) for m in spec.models]
    if not spec.datasets:  # the record of a run on the preset mixture is as it was before datasets
        del scenario_record["datasets"], scenario_record["labels"], scenario_record["specialists"]
    simulation = scenario.get("simulation", {})
    name = simulation.get("name", "learning") if isinstance(simulation, Mapping) else "learning"
    result = {
        "mode": "learning",
        "scenario": str(name),
        "learning": scenario_record,
        "wall_seconds": wall,
        "runs": list(runs),
        "summary": _summary(spec, runs),
        "timing": {
            "threads": spec.threads,
            "warm_start_seconds": warm_seconds,
            "runs": list(timings),
            "seconds_per_round_mean": statistics.fmean(s for t in timings for s in t["round_seconds"])
            if spec.rounds
            else 0.0,
        },
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "learning.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    return result
