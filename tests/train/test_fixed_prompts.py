"""simulations/fixed_prompts.py: the node's Trainer on the same prompts every round."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "simulations" / "fixed_prompts.py"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fixed_prompts", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_it_trains_on_the_same_tasks_every_round_and_records_each_round(
    quick_model: Path, tmp_path: Path
) -> None:
    out = tmp_path / "record.json"
    argv = ["--model-dir", str(quick_model), "--rounds", "3", "--prompts", "2", "--group-size", "2"]
    assert load_script().main([*argv, "--max-new-tokens", "8", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert len(record["reward_per_round"]) == len(record["completion_tokens_per_round"]) == 3
    assert record["distinct_task_sets"] == 1  # every round trained on the same tasks
    assert all(0.0 <= r <= 1.0 for r in record["reward_per_round"])
    assert all(1 <= n <= 8 for n in record["completion_tokens_per_round"])
    assert 0.0 <= record["heldout_start"] <= 1.0 and 0.0 <= record["heldout_end"] <= 1.0


def test_a_directory_without_a_saved_policy_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        load_script().main(["--model-dir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "not a saved policy" in capsys.readouterr().err
