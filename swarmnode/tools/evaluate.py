"""``swarmnode evaluate``: did this node's policy get better? Its held-out accuracy now against the
model it started from, on the same tasks, per task family, greedy and sampled.

The node's status shows greedy held-out accuracy: one completion a task at temperature 0. GRPO
raises the expected reward of the policy the node samples from, and a policy can get better at
that without its greedy answer changing (a small model's greedy answer is often already its most
likely right one). So this command measures both on one held-out set (``--tasks`` tasks of the
node's held-out seed, never trained on, split evenly over the mixture's families and rounded up
to a whole number each):

- **greedy**: the share of tasks whose greedy completion solves them;
- **sampled**: the share of ``samples`` completions a task, drawn at the node's
  ``rollout.temperature`` and ``rollout.top_p``, that solve it (each task weighs the same).

Start and now answer the same tasks, so each figure is a paired difference: its 95% interval is
1.96 standard errors of the per-task differences (a normal approximation: read it with some tens of
tasks or more; none below two), and the sampled draws use the same random stream for both
policies. The start is the model the node begins from (``roles.common.build_policy``:
``model.path``, or the built-in model's warm start, which must be the one cached in the home: the
same flags as the run, since its cache key holds the seed, the mixture and the threads); now is
its newest verified checkpoint (or ``--checkpoint``), checked to fit the model before any work.

    swarmnode evaluate --home runs/demo                  # 200 held-out tasks, 8 samples each
    swarmnode evaluate --home H --tasks 1000 --json      # more tasks: narrower intervals

Must not: train, write anything into the node's home, or build a warm start (one built here would
not be the model the node started from).
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import torch

from swarmnode.config import Config
from swarmnode.errors import ConfigError
from swarmnode.home import NodeHome
from swarmnode.policy import evaluate as policy_evaluate
from swarmnode.policy.evaluate import default_engine, task_scores
from swarmnode.policy.model import Policy
from swarmnode.roles.common import build_mixture, build_policy, configure_threads, warm_start_cache
from swarmnode.tasks import Task
from swarmnode.tasks.scoring import solved
from swarmnode.tools.export import (
    check_checkpoint_fits,
    check_policy_home,
    load_checkpoint_into,
    node_checkpoint,
)
from swarmnode.train.trainer import heldout_sets

#: z for a two-sided 95% interval (normal approximation of the mean of per-task differences).
Z95 = 1.96
#: The row that pools every family's tasks (each family holds the same number).
ALL = "all families"


@dataclass(frozen=True)
class Comparison:
    """One family's accuracy at the start and now, over the same tasks."""

    family: str
    tasks: int
    start: float
    now: float
    #: now - start, and the half-width of its 95% interval (paired over tasks; None under two tasks)
    change: float
    interval: float | None


@dataclass(frozen=True)
class Evaluation:
    round: int
    policy_version: int
    checkpoint: str
    samples: int
    sample_seed: int
    temperature: float
    top_p: float
    max_new_tokens: int
    greedy: list[Comparison]
    #: empty when ``samples`` is 0
    sampled: list[Comparison]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def paired(family: str, start: Sequence[float], now: Sequence[float]) -> Comparison:
    """Mean accuracy of each, and their mean per-task difference with its 95% half-width (None for one
    task: one difference says nothing of its spread)."""
    if len(start) != len(now) or not start:
        raise ValueError(f"paired scores need the same tasks on both sides: {len(start)} vs {len(now)}")
    diffs = [b - a for a, b in zip(start, now, strict=True)]
    return Comparison(
        family=family,
        tasks=len(diffs),
        start=statistics.fmean(start),
        now=statistics.fmean(now),
        change=statistics.fmean(diffs),
        interval=Z95 * statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else None,
    )


#: About how many completions are generated between two progress lines (a 0.5 B model on a CPU
#: takes minutes for this many); rounded to whole ``EVAL_BATCH`` slices, whose boundaries the
#: sampled draws depend on, so the figures do not.
PROGRESS_EVERY = 2048


def _scores(
    policy: Policy, tasks: list[Task], config: Config, *, greedy: bool, seed: int, say: TextIO, label: str
) -> list[float]:
    """``task_scores`` over ``tasks`` in slices, a progress line after each but the last."""
    engine = default_engine(policy)  # a fresh engine: it serves the weights the policy holds now
    generator = torch.Generator().manual_seed(seed)  # one stream across the slices
    batch = policy_evaluate.EVAL_BATCH
    step = max(PROGRESS_EVERY // batch, 1) * batch
    scores: list[float] = []
    for at in range(0, len(tasks), step):
        scores += task_scores(
            policy,
            tasks[at : at + step],
            engine,
            greedy=greedy,
            temperature=config.rollout.temperature,
            top_p=config.rollout.top_p,
            max_new_tokens=config.rollout.max_new_tokens,
            generator=generator,
        )
        if len(scores) < len(tasks):
            print(f"  {label}: {len(scores):,} of {len(tasks):,} completions", file=say, flush=True)
    return scores


def _per_task(
    policy: Policy, tasks: list[Task], samples: int, config: Config, seed: int, say: TextIO, label: str
) -> tuple[list[float], list[float]]:
    """Each task's greedy score (0 or 1) and its share of ``samples`` sampled completions that solve it."""
    greedy = [
        float(solved(s)) for s in _scores(policy, tasks, config, greedy=True, seed=seed, say=say, label=label)
    ]
    if samples == 0:
        return greedy, []
    repeated = [task for task in tasks for _ in range(samples)]
    scores = _scores(policy, repeated, config, greedy=False, seed=seed, say=say, label=f"{label}, sampled")
    return greedy, [
        sum(solved(s) for s in scores[i * samples : (i + 1) * samples]) / samples for i in range(len(tasks))
    ]


def evaluate_node(
    config: Config,
    home: NodeHome,
    *,
    checkpoint: Path | None = None,
    tasks: int = 200,
    samples: int = 8,
    seed: int = 0,
    say: TextIO | None = None,
) -> Evaluation:
    """The start model and ``home``'s newest (or the given) checkpoint on ``tasks`` held-out tasks;
    progress goes to ``say`` (default: standard error)."""
    say = say or sys.stderr
    if tasks < 1:
        raise ConfigError(f"--tasks must be at least 1, got {tasks}")
    if samples < 0:
        raise ConfigError(f"--samples must be at least 0 (0: greedy only), got {samples}")
    check_policy_home(config, home, "evaluate")
    state, path = node_checkpoint(home, checkpoint, say)
    configure_threads(config)  # as the node ran: its warm-start cache is keyed by torch's threads
    mixture = build_mixture(config)
    cache = warm_start_cache(config, home, mixture)
    if cache is not None and not cache.is_dir():
        raise ConfigError(
            f"the warm start these settings name ({cache.name}) is not in {home.models}: pass the flags "
            "the node ran with (--seed, --set node.threads=..., model.builtin, tasks.*); a warm start "
            "built now would not be the model it started from"
        )
    policy = build_policy(config, home, mixture, say=say)
    check_checkpoint_fits(policy, state, path, config)  # now, not after the start's whole pass
    by_family = heldout_sets(mixture, tasks)
    flat = [task for family_tasks in by_family.values() for task in family_tasks]
    print(f"the start model on {len(flat)} held-out tasks ({samples} samples each)", file=say, flush=True)
    start = _per_task(policy, flat, samples, config, seed, say, "start")
    load_checkpoint_into(policy, state, path, config)
    print(f"round {state.round} ({path.name}) on the same tasks", file=say, flush=True)
    now = _per_task(policy, flat, samples, config, seed, say, f"round {state.round}")

    def compare(which: int) -> list[Comparison]:
        rows, at = [], 0
        for family, family_tasks in by_family.items():
            span = slice(at, at + len(family_tasks))
            rows.append(paired(family, start[which][span], now[which][span]))
            at += len(family_tasks)
        if len(by_family) > 1:
            rows.append(paired(ALL, start[which], now[which]))
        return rows

    return Evaluation(
        round=state.round,
        policy_version=state.policy_version,
        checkpoint=path.name,
        samples=samples,
        sample_seed=seed,
        temperature=config.rollout.temperature,
        top_p=config.rollout.top_p,
        max_new_tokens=config.rollout.max_new_tokens,
        greedy=compare(0),
        sampled=compare(1) if samples else [],
    )


def _change(row: Comparison) -> str:
    interval = "(no interval: one task)" if row.interval is None else f"± {row.interval:.3f}"
    return f"{row.change:+.3f} {interval}"


def render(evaluation: Evaluation) -> str:
    """The table ``swarmnode evaluate`` prints."""
    e = evaluation
    lines = [
        f"round {e.round} (policy version {e.policy_version}, {e.checkpoint}) against the start model; "
        f"change with its 95% interval",
        "",
    ]
    header = f"{'family':<16} {'tasks':>5}  {'greedy: start -> now':<22} {'change':<16}"
    sampled = {row.family: row for row in e.sampled}
    if sampled:
        header += f"  {f'sampled (T {e.temperature:g}, x{e.samples}): start -> now':<34} change"
    lines.append(header)
    for row in e.greedy:
        line = f"{row.family:<16} {row.tasks:>5}  {row.start:.3f} -> {row.now:.3f}{'':<8} {_change(row)}"
        if sampled:
            s = sampled[row.family]
            line += f"  {s.start:.3f} -> {s.now:.3f}{'':<20} {_change(s)}"
        lines.append(line)
    return "\n".join(lines)
