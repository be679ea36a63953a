"""`swarmnode evaluate`: the node's checkpointed policy against the model it started from, on the
same held-out tasks, greedy and sampled, each change with a paired 95% interval."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
import torch

from swarmnode.cli import EXIT_ERROR, EXIT_OK, EXIT_USAGE, main
from swarmnode.config import load_config
from swarmnode.home import NodeHome
from swarmnode.policy import evaluate as policy_evaluate
from swarmnode.policy.evaluate import task_scores
from swarmnode.policy.model import build_tiny_policy
from swarmnode.policy.warmstart import _batch
from swarmnode.roles.common import build_mixture
from swarmnode.roles.solo import run_solo
from swarmnode.store.checkpoint import CheckpointStore
from swarmnode.tasks import Task
from swarmnode.tasks.scoring import solved
from swarmnode.tools import evaluate
from swarmnode.tools.evaluate import ALL, paired
from swarmnode.train.trainer import heldout_sets

from .conftest import checkpoint_of

TASKS = 4
NO_WARM_START = ["--set", "model.warm_start=false", "--tasks", str(TASKS)]


def heldout_tasks() -> list[Task]:
    """The held-out tasks `evaluate --tasks TASKS` answers under the default config."""
    config = load_config(None, environ={}, overrides={"model.warm_start": False})
    return [t for family in heldout_sets(build_mixture(config), TASKS).values() for t in family]


def taught_checkpoint(home: NodeHome) -> None:
    """A checkpoint whose policy was taught the held-out tasks' answers (supervised, from the same
    random start the node builds): greedy, it solves what the start model cannot."""
    tasks = heldout_tasks()
    torch.manual_seed(0)
    policy = build_tiny_policy(0)
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=3e-3)
    input_ids, labels = _batch(policy, tasks)
    for _ in range(150):
        optimizer.zero_grad()
        policy.model(input_ids=input_ids, labels=labels).loss.backward()
        optimizer.step()
    CheckpointStore(home.checkpoints).save(checkpoint_of(policy.model, optimizer, 40))


def test_evaluate_compares_the_newest_checkpoint_with_the_start_on_the_same_tasks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = NodeHome(tmp_path / "node").ensure()
    taught_checkpoint(home)
    argv = ["evaluate", "--home", str(home.root), *NO_WARM_START, "--samples", "3", "--json"]
    assert main(argv) == EXIT_OK
    result = json.loads(capsys.readouterr().out)
    assert result["round"] == 40 and result["samples"] == 3 and result["max_new_tokens"] == 8
    assert result["sample_seed"] == 0
    [greedy] = result["greedy"]  # the default mixture has one family
    assert greedy["tasks"] == TASKS
    assert greedy["start"] == 0.0 and greedy["now"] == 1.0 and greedy["change"] == 1.0
    assert greedy["interval"] == 0.0  # every task moved by exactly 1

    # The figures are the node's own scorer on the node's own held-out tasks, recomputed here.
    tasks = heldout_tasks()
    start = build_tiny_policy(0)
    per_draw = task_scores(
        start,
        [t for t in tasks for _ in range(3)],
        greedy=False,
        max_new_tokens=8,
        generator=torch.Generator().manual_seed(0),
    )
    [sampled] = result["sampled"]
    assert sampled["start"] == pytest.approx(sum(solved(s) for s in per_draw) / len(per_draw))
    assert sampled["now"] > 0.5  # the taught policy samples its answers too

    # The table a person reads.
    assert main(["evaluate", "--home", str(home.root), *NO_WARM_START, "--samples", "0"]) == EXIT_OK
    text = capsys.readouterr().out
    assert "round 40" in text and "0.000 -> 1.000" in text and "+1.000 ± 0.000" in text
    assert "sampled" not in text  # --samples 0: greedy only


def test_the_change_and_its_interval_are_paired_over_tasks() -> None:
    row = paired("add", [1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0])
    assert (row.start, row.now, row.change) == (0.5, 0.75, 0.25)
    # differences 0, 1, 0, 0: sd 0.5, so 1.96 x 0.5 / sqrt(4)
    assert row.interval == pytest.approx(1.96 * 0.5 / math.sqrt(4))
    assert paired(ALL, [0.25], [0.75]).interval is None  # one task: no spread to speak of
    with pytest.raises(ValueError, match="same tasks"):
        paired("add", [1.0], [1.0, 0.0])


def test_bad_arguments_and_a_home_without_checkpoints_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = NodeHome(tmp_path / "node").ensure()
    assert main(["evaluate", "--home", str(home.root), *NO_WARM_START]) == EXIT_ERROR
    assert "no checkpoint in" in capsys.readouterr().err
    taught_checkpoint(home)
    assert main(["evaluate", "--home", str(home.root), "--tasks", "0"]) == EXIT_USAGE
    assert "--tasks must be at least 1" in capsys.readouterr().err
    assert main(["evaluate", "--home", str(home.root), "--samples", "-1"]) == EXIT_USAGE
    assert "--samples must be at least 0" in capsys.readouterr().err
    # A warm start not in the home is not the model the node started from: refused, not built.
    assert main(["evaluate", "--home", str(home.root), "--tasks", str(TASKS)]) == EXIT_USAGE
    assert "pass the flags the node ran with" in capsys.readouterr().err
    assert not (home.models.exists() and any(home.models.iterdir()))
    # A checkpoint that does not fit is named before any evaluation runs.
    lora = [*NO_WARM_START, "--set", "learn.lora_rank=4"]
    assert main(["evaluate", "--home", str(home.root), *lora]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert "does not fit the configured model" in err and "pass the run's learn.lora_rank" in err
    assert "the start model on" not in err
    worker = ["--set", "node.role=worker", "--set", "worker.learner=/ip4/127.0.0.1/tcp/1/p2p/x"]
    assert main(["evaluate", "--home", str(home.root), *worker]) == EXIT_USAGE
    assert "a worker trains nothing" in capsys.readouterr().err


def test_a_long_evaluation_says_how_far_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    home = NodeHome(tmp_path / "node").ensure()
    taught_checkpoint(home)
    monkeypatch.setattr(policy_evaluate, "EVAL_BATCH", 5)  # slices are whole generate() batches
    monkeypatch.setattr(evaluate, "PROGRESS_EVERY", 5)
    assert main(["evaluate", "--home", str(home.root), *NO_WARM_START, "--samples", "3", "--json"]) == EXIT_OK
    out, err = capsys.readouterr()
    sliced = json.loads(out)
    assert "  start, sampled: 5 of 12 completions\n  start, sampled: 10 of 12 completions\n" in err
    assert "  round 40, sampled: 10 of 12 completions\n" in err
    assert "start: " not in err  # 4 greedy completions: one slice, no line
    # The figures do not depend on the progress lines: slices follow generate()'s batches.
    monkeypatch.setattr(evaluate, "PROGRESS_EVERY", 4096)
    assert main(["evaluate", "--home", str(home.root), *NO_WARM_START, "--samples", "3", "--json"]) == EXIT_OK
    assert json.loads(capsys.readouterr().out) == sliced


def test_a_solo_run_points_to_evaluate_and_evaluate_reads_its_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = {
        "model.warm_start": False,
        "tasks.heldout_size": TASKS,
        "rollout.prompts_per_round": 2,
        "rollout.group_size": 2,
        "node.threads": 1,
    }
    home = NodeHome(tmp_path / "node")
    out = io.StringIO()
    run_solo(
        load_config(None, environ={}, overrides=settings), home, max_rounds=2, out=out, install_signals=False
    )
    assert (
        f"swarmnode evaluate --home {home.root} --tasks 1000 (with this run's --seed and --set flags)"
        in out.getvalue()
    )
    flags = [a for key, value in settings.items() for a in ("--set", f"{key}={str(value).lower()}")]
    assert main(["evaluate", "--home", str(home.root), *flags, "--tasks", str(TASKS), "--json"]) == EXIT_OK
    assert json.loads(capsys.readouterr().out)["round"] == 2
