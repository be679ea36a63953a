"""Rollout workers that do not sample what they claim, each a real worker process (issue #20).

Run as ``SWARMNODE_CHEAT=KIND python -m swarmnode.testing.cheaters run --home DIR`` (the same
arguments as ``swarmnode``; ``LocalSwarm.start_node(name, module=CHEATER, env=...)``). The worker
is the real ``WorkerNode`` (activation, weights, batches, the learner's seeds); only its engine is
wrapped, so each cheat differs from an honest worker in what it samples and nothing else. Every
kind but ``liar`` reports the honest log-probs, under the version it claims, of the tokens it sends
(recomputed with the learner's rule): every log-prob spot check passes, and only the learner's
keyed-sampling token checks (protocol/SPEC.md 1.8) can tell.

Kinds (``KINDS``):
    liar         samples honestly, adds 0.5 nats to every reported log-prob (clipped at 0)
    greedy       argmax decoding, no seed
    temperature  keyed sampling with the learner's seed at temperature 0.7 instead of the configured one
    stale        keyed sampling with weights at least 2 versions older than the one it claims
    smaller      keyed sampling with a cheaper model: the first layer of the claimed version's
                 network alone (same embeddings and head), one forward per token at half the cost
    replay       sends its first real batch again and again, relabelled with the current version

The cheat's ``/status`` gains ``cheat``: its kind and the batch (``batches_sent`` + 1) from which
it cheated (``stale`` is honest until it holds a version 2 behind; ``replay`` from its second
batch), so a bench can count the batches the learner took before deactivating it.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from swarmnode.policy.model import Policy
from swarmnode.rollout.sampling_keys import SamplingKeys
from swarmnode.rollout.torch_engine import TorchEngine
from swarmnode.rollout.types import Completion, GenerationResult, SamplingParams
from swarmnode.train.batch import completion_logprobs

KINDS = ("liar", "greedy", "temperature", "stale", "smaller", "replay")
CHEATER = "swarmnode.testing.cheaters"
LIE = 0.5  # nats added by the liar: a worker claiming a sharper policy than it sampled from
COLD = 0.7  # the temperature cheat's temperature


class CheatingEngine:
    """The worker's torch engine, wrapped: ``generate`` samples the cheat's way (see the module
    docstring) while the worker holds real weights, and honestly before (its start-up
    calibration, with skeleton weights)."""

    def __init__(self, kind: str, worker: Any) -> None:
        if kind not in KINDS:
            raise SystemExit(f"SWARMNODE_CHEAT must be one of {', '.join(KINDS)}, got {kind!r}")
        self.kind = kind
        self.worker = worker
        self.real: TorchEngine = worker.engine
        self.policy: Policy = worker.policy
        self.cheating_from: int | None = None
        self.snapshots: dict[int, dict[str, torch.Tensor]] = {}  # version -> weights (stale)
        self.shadow: Policy | None = None  # the other model a cheat samples from
        self.replayed: GenerationResult | None = None
        self.replayed_tasks: list[Any] | None = None
        self.last_tasks: list[Any] = []
        sample = worker.mixture.sample

        def sample_tasks(index: int, n: int, **kwargs: Any) -> list[Any]:
            # The replay cheat asks for the same tasks again: its stored completions answer them.
            self.last_tasks = self.replayed_tasks or sample(index, n, **kwargs)
            return self.last_tasks

        worker.mixture.sample = sample_tasks

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def generate(
        self,
        prompts: list[str],
        n: int,
        params: SamplingParams,
        generator: torch.Generator | None = None,
        *,
        keys: SamplingKeys | None = None,
    ) -> GenerationResult:
        version = self.policy.version
        if version < 0:
            return self.real.generate(prompts, n, params, generator, keys=keys)
        cheated = self._cheat(prompts, n, params, generator, keys)
        if cheated is None:
            honest = self.real.generate(prompts, n, params, generator, keys=keys)
            if self.kind == "replay":  # every later batch is this one again
                self.replayed, self.replayed_tasks = copy.deepcopy(honest), list(self.last_tasks)
            return honest
        if self.cheating_from is None:
            self.cheating_from = self.worker.batches_sent + 1
        return cheated

    def _cheat(
        self,
        prompts: list[str],
        n: int,
        params: SamplingParams,
        generator: torch.Generator | None,
        keys: SamplingKeys | None,
    ) -> GenerationResult | None:
        version = self.policy.version
        if self.kind == "liar":
            result = self.real.generate(prompts, n, params, generator, keys=keys)
            for group in result.completions:
                for c in group:
                    c.logprobs = [min(0.0, lp + LIE) for lp in c.logprobs]
            return result
        if self.kind == "greedy":
            result = self.real.generate(prompts, n, dataclasses.replace(params, temperature=0.0), generator)
        elif self.kind == "temperature":
            cold = dataclasses.replace(params, temperature=COLD)
            result = self.real.generate(prompts, n, cold, generator, keys=keys)
        elif self.kind == "stale":
            self.snapshots[version] = {
                k: v.detach().clone() for k, v in self.policy.model.state_dict().items()
            }
            old = [v for v in self.snapshots if v <= version - 2]
            if not old:
                return None  # honest until it holds weights at least 2 versions behind its claim
            for gone in [v for v in self.snapshots if v < max(old)]:
                del self.snapshots[gone]
            # The newest weights at least 2 versions old (versions can move on by several between
            # two batches: waiting for exactly version - 2 left it honest most of the time).
            result = self._shadow_generate(self.snapshots[max(old)], prompts, n, params, generator, keys)
        elif self.kind == "smaller":
            result = self._shadow_generate(
                self.policy.model.state_dict(), prompts, n, params, generator, keys, 1
            )
        else:  # replay
            if self.replayed is None:
                return None  # its first real batch is honest (``generate`` keeps it)
            result = copy.deepcopy(self.replayed)
        return self._honest_logprobs(result, params)

    def _shadow_generate(
        self,
        weights: dict[str, torch.Tensor],
        prompts: list[str],
        n: int,
        params: SamplingParams,
        generator: torch.Generator | None,
        keys: SamplingKeys | None,
        layers: int | None = None,
    ) -> GenerationResult:
        if self.shadow is None:
            model = copy.deepcopy(self.policy.model)
            if layers is not None:  # keep the first ``layers`` decoder layers: a cheaper network
                inner: Any = model.model
                inner.layers = inner.layers[:layers]
                model.config.num_hidden_layers = layers  # type: ignore[union-attr]
            self.shadow = dataclasses.replace(self.policy, model=model)
        self.shadow.model.load_state_dict(weights, strict=False)
        self.shadow.version = self.policy.version
        return TorchEngine(self.shadow).generate(prompts, n, params, generator, keys=keys)

    def _honest_logprobs(self, result: GenerationResult, params: SamplingParams) -> GenerationResult:
        """The sent tokens' log-probs under the claimed version with the learner's rule, as an
        honest worker reports them; the result relabelled with that version."""
        model = self.policy.model
        for prompt, group in zip(result.prompt_ids, result.completions, strict=True):
            rows = [c.token_ids for c in group]
            with torch.no_grad():
                values, _ = completion_logprobs(
                    model, [prompt] * len(rows), rows, params.temperature, self.policy.pad_token_id
                )
            for i, c in enumerate(group):
                group[i] = Completion(
                    c.token_ids, [float(v) for v in values[i, : len(c.token_ids)]], c.text, c.finished
                )
        result.policy_version = self.policy.version
        return result


def run_cheaters(
    root: Path,
    model: Path,
    kinds: Sequence[str] = KINDS,
    *,
    rate: float = 0.25,
    tokens: int = 16,
    timeout: float = 900.0,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """A learner (every worker activated, ``rate`` of batches spot-checked, ``tokens`` per check,
    deactivation at the first failed check), one honest worker and one cheating worker of each
    kind, all real processes (``LocalSwarm`` under ``root``, the warm-started ``model``). Runs
    until every cheat was deactivated or ``timeout``; returns, per cheat, the batch it cheated
    from and the learner's record of it, the honest worker's record, and the checking's share of
    the learner's busy time."""
    from swarmnode.identity import load_or_create_identity
    from swarmnode.testing.swarm import LocalSwarm

    swarm = LocalSwarm(root, model, round_seconds=30.0)
    try:
        swarm.start_bootstrap()
        home = swarm.write_node_config(
            "learner",
            0,
            **{
                "node.role": "learner",
                "learner.activation": "all",
                "learner.groups_per_step": 4,
                "learner.recruit_seconds": 1.0,
                "learner.spot_check_rate": rate,
                "learner.spot_check_tokens": tokens,
                "learner.spot_check_strikes": 1,
                "swarm.staleness_bound": 4,
            },
        )
        learner_id = load_or_create_identity(home.identity_key).peer_id
        names = {"w-honest": "honest", **{f"w-{kind}": kind for kind in kinds}}
        ids = {}
        for i, name in enumerate(names):
            worker = swarm.write_node_config(
                name, 10 + i, **{"node.role": "worker", "worker.learner": learner_id}
            )
            ids[name] = load_or_create_identity(worker.identity_key).peer_id
        swarm.start_node("learner")
        for name, kind in names.items():
            if kind == "honest":
                swarm.start_node(name)
            else:
                swarm.start_node(name, module=CHEATER, env={"SWARMNODE_CHEAT": kind})
        started = time.monotonic()
        last_said = 0.0

        def caught(name: str, records: dict[str, Any]) -> bool:
            """Deactivated after a failed spot check, or refused at intake and dropped (a cheat
            whose batches never reach a spot check: ``replay``'s repeated groups are duplicates)."""
            if (records.get(ids[name]) or {}).get("first_deactivated_after"):
                return True
            cheat = swarm.status(name) or {}
            return bool((cheat.get("cheat") or {}).get("cheating_from_batch")) and not cheat.get(
                "active", True
            )

        def all_caught() -> dict[str, Any] | None:
            nonlocal last_said
            status = swarm.status("learner")
            if status is None:
                return None
            done = [n for n in names if n != "w-honest" and caught(n, status["spot_checks_by_worker"])]
            if time.monotonic() - last_said > 30:
                last_said = time.monotonic()
                say(
                    f"  {time.monotonic() - started:.0f} s: learner step {status['steps_this_run']}, "
                    f"cheats dropped {len(done)}/{len(names) - 1}"
                )
            return status if len(done) == len(names) - 1 else None

        learner = swarm.wait(all_caught, "every cheat to be dropped", timeout=timeout)
        out: dict[str, Any] = {"cheats": {}, "honest": learner["spot_checks_by_worker"].get(ids["w-honest"])}
        for name, kind in names.items():
            if kind == "honest":
                continue
            cheat_status = swarm.status(name) or {}
            out["cheats"][kind] = {
                "cheating_from_batch": (cheat_status.get("cheat") or {}).get("cheating_from_batch"),
                "deactivated_reason": cheat_status.get("deactivated_reason", ""),
                "record": learner["spot_checks_by_worker"].get(ids[name]),
                "trained_completions": learner["completions_by_worker"].get(ids[name], 0),
            }
        out["learner"] = {
            "steps": learner["steps_this_run"],
            "spot_check_seconds": learner["spot_check_seconds"],
            "busy_s": learner["busy_s"],
            "spot_check_share_of_busy": learner["spot_check_share_of_busy"],
            "keyed_token_checks": learner["metrics"].get("keyed_token_checks", {}),
            "worker_batches_refused": learner["metrics"].get("worker_batches_refused", {}),
        }
        return out
    finally:
        swarm.close()


def main() -> int:
    from swarmnode import cli
    from swarmnode.roles import worker as worker_module

    kind = os.environ.get("SWARMNODE_CHEAT", "")
    honest = worker_module.WorkerNode

    class CheatingWorker(honest):  # type: ignore[misc, valid-type]
        def _build(self) -> None:
            super()._build()
            self.engine = CheatingEngine(kind, self)

        def status(self) -> dict[str, Any]:
            engine = self.engine
            return {**super().status(), "cheat": {"kind": kind, "cheating_from_batch": engine.cheating_from}}

    worker_module.WorkerNode = CheatingWorker  # type: ignore[misc]
    return cli.main(sys.argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
