"""Checkpoints: atomic on disk, the last K kept, exact round trips, corruption detected by hash."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from swarmnode.errors import CheckpointError
from swarmnode.store import CheckpointState, CheckpointStore, capture_rng_state, restore_rng_state
from swarmnode.store.checkpoint import MANIFEST_FILE, MODEL_FILE, OPTIMIZER_FILE

from .tiny_tied_lm import TiedLM, make_optimizer, train_step


def trained_state(round: int = 1, seed: int = 0) -> tuple[TiedLM, torch.optim.AdamW, CheckpointState]:
    torch.manual_seed(seed)
    model = TiedLM()
    optimizer = make_optimizer(model)
    train_step(model, optimizer)
    state = CheckpointState(
        round=round,
        policy_version=round + 100,
        model_state=model.state_dict(),
        optimizer_state=optimizer.state_dict(),
        rng_state=capture_rng_state(),
        extra={"tokens_seen": 1234, "note": "hello", "history": [1.5, 2.5]},
    )
    return model, optimizer, state


def assert_nested_equal(a: object, b: object, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            assert_nested_equal(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where  # type: ignore[arg-type]
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_nested_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def test_load_latest_of_an_empty_store_is_none(tmp_path: Path) -> None:
    assert CheckpointStore(tmp_path / "checkpoints").load_latest() is None


def test_checkpoint_round_trips_model_optimizer_rng_and_extra_exactly(tmp_path: Path) -> None:
    _, _, state = trained_state()
    store = CheckpointStore(tmp_path)
    store.save(state)
    loaded = store.load_latest()
    assert loaded is not None
    assert (loaded.round, loaded.policy_version) == (1, 101)
    assert list(loaded.model_state) == list(state.model_state)
    assert_nested_equal(state.model_state, loaded.model_state, "model_state")
    assert_nested_equal(state.optimizer_state, loaded.optimizer_state, "optimizer_state")
    assert_nested_equal(state.rng_state, loaded.rng_state, "rng_state")
    assert loaded.extra == state.extra


def test_resuming_from_a_checkpoint_continues_training_bit_for_bit(tmp_path: Path) -> None:
    model, optimizer, state = trained_state()
    store = CheckpointStore(tmp_path)
    store.save(state)

    # The original run continues for two more steps.
    expected_losses = [train_step(model, optimizer) for _ in range(2)]

    # A fresh process-like restart: new objects, other RNG state, then restore.
    torch.manual_seed(999)
    resumed = TiedLM()
    resumed_optimizer = make_optimizer(resumed)
    loaded = store.load_latest()
    assert loaded is not None
    resumed.load_state_dict(loaded.model_state)
    resumed_optimizer.load_state_dict(loaded.optimizer_state)
    restore_rng_state(loaded.rng_state)
    losses = [train_step(resumed, resumed_optimizer) for _ in range(2)]

    assert losses == expected_losses
    assert_nested_equal(model.state_dict(), resumed.state_dict())
    assert resumed.head.weight is resumed.embed.weight


def test_tied_weights_are_stored_once_and_come_back_tied(tmp_path: Path) -> None:
    _, _, state = trained_state()
    path = CheckpointStore(tmp_path).save(state)
    manifest = json.loads((path / MANIFEST_FILE).read_text())["body"]
    assert manifest["aliases"] == {"head.weight": "embed.weight"}
    loaded = CheckpointStore(tmp_path).load(path)
    assert loaded.model_state["head.weight"] is loaded.model_state["embed.weight"]


def test_partially_shared_and_non_contiguous_tensors_are_stored_as_copies(tmp_path: Path) -> None:
    fused = torch.arange(12.0).reshape(3, 4)
    model_state = {"fused": fused, "first_row": fused[0], "transposed": fused.t(), "empty": torch.empty(0)}
    store = CheckpointStore(tmp_path)
    store.save(CheckpointState(round=1, policy_version=1, model_state=model_state, optimizer_state={}))
    loaded = store.load_latest()
    assert loaded is not None
    assert_nested_equal(model_state, loaded.model_state)


def test_rng_state_restores_python_numpy_and_torch_draws() -> None:
    state = capture_rng_state()
    expected = (random.random(), float(np.random.rand()), torch.rand(3))
    random.random(), np.random.rand(), torch.rand(5)  # move every generator on
    restore_rng_state(state)
    got = (random.random(), float(np.random.rand()), torch.rand(3))
    assert got[:2] == expected[:2] and torch.equal(got[2], expected[2])


def test_store_keeps_only_the_last_k_checkpoints(tmp_path: Path) -> None:
    _, _, state = trained_state()
    store = CheckpointStore(tmp_path, keep=2)
    paths = []
    for r in range(1, 6):
        state.round = r
        paths.append(store.save(state))
    assert store.paths() == paths[-2:]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in paths[-2:])
    loaded = store.load_latest()
    assert loaded is not None and loaded.round == 5


def test_latest_means_most_recently_written_even_for_an_older_round(tmp_path: Path) -> None:
    _, _, state = trained_state()
    store = CheckpointStore(tmp_path, keep=3)
    state.round = 7
    store.save(state)
    state.round = 5  # e.g. resumed from round 5 after round 7 was found corrupt
    store.save(state)
    loaded = store.load_latest()
    assert loaded is not None and loaded.round == 5


def test_checkpoint_is_complete_and_verified_before_it_appears_under_its_final_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CheckpointStore(tmp_path)
    _, _, state = trained_state()
    seen: list[tuple[str, str]] = []
    real_rename = os.rename

    def checking_rename(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        src, dst = Path(src), Path(dst)
        if not dst.name.startswith(".trash-"):
            assert src.name.startswith(".")  # written under a hidden temporary name
            assert not dst.exists()
            store.verify(src)  # every file and the manifest already complete
            seen.append((src.name, dst.name))
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", checking_rename)
    path = store.save(state)
    assert [dst for _, dst in seen] == [path.name]


def test_failed_save_leaves_no_new_checkpoint_and_keeps_the_previous_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CheckpointStore(tmp_path, keep=1)
    _, _, state = trained_state()
    good = store.save(state)

    def full_disk(obj: object, f: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    state.round = 2
    with pytest.raises(OSError, match="No space left"):
        store.save(state)
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == [good]
    loaded = store.load_latest()
    assert loaded is not None and loaded.round == 1


def test_leftovers_of_an_interrupted_save_are_ignored_then_removed(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    _, _, state = trained_state()
    store.save(state)
    leftover = tmp_path / ".tmp-ckpt-00000002-round-2-deadbeef"
    leftover.mkdir()
    (leftover / MODEL_FILE).write_bytes(b"half a model")
    loaded = store.load_latest()
    assert loaded is not None and loaded.round == 1
    mine = tmp_path / ".tmp-my-own-notes"
    mine.mkdir()
    state.round = 2
    store.save(state)
    assert not leftover.exists()
    assert mine.exists()  # only the store's own temporary names are ever removed


def test_state_that_a_weights_only_load_cannot_read_is_refused_at_save(tmp_path: Path) -> None:
    _, _, state = trained_state()
    state.extra = {"when": np.float64(1.0)}
    with pytest.raises(TypeError, match=r"extra\['when'\]"):
        CheckpointStore(tmp_path).save(state)
    assert list(tmp_path.iterdir()) == []


def _two_checkpoints(tmp_path: Path) -> tuple[CheckpointStore, Path, Path]:
    store = CheckpointStore(tmp_path, keep=3)
    _, _, state = trained_state(round=1)
    old = store.save(state)
    _, _, state = trained_state(round=2, seed=1)
    new = store.save(state)
    return store, old, new


def _assert_falls_back(
    store: CheckpointStore, bad: Path, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="swarmnode.store"):
        loaded = store.load_latest()
    assert loaded is not None and loaded.round == 1
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any(bad.name in r.getMessage() and reason in r.getMessage() for r in warnings), [
        r.getMessage() for r in warnings
    ]


def test_truncated_newer_checkpoint_is_skipped_with_a_warning_naming_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, _, new = _two_checkpoints(tmp_path)
    model_file = new / MODEL_FILE
    model_file.write_bytes(model_file.read_bytes()[: model_file.stat().st_size // 2])
    _assert_falls_back(store, new, "truncated", caplog)


def test_bit_flipped_newer_checkpoint_is_skipped_with_a_warning_naming_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, _, new = _two_checkpoints(tmp_path)
    optimizer_file = new / OPTIMIZER_FILE
    data = bytearray(optimizer_file.read_bytes())
    data[len(data) // 2] ^= 0x10
    optimizer_file.write_bytes(bytes(data))
    _assert_falls_back(store, new, "sha256", caplog)


def test_newer_checkpoint_without_manifest_is_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, _, new = _two_checkpoints(tmp_path)
    (new / MANIFEST_FILE).unlink()
    _assert_falls_back(store, new, "missing", caplog)


def test_newer_checkpoint_with_edited_manifest_is_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, _, new = _two_checkpoints(tmp_path)
    manifest = json.loads((new / MANIFEST_FILE).read_text())
    manifest["body"]["round"] = 99
    (new / MANIFEST_FILE).write_text(json.dumps(manifest))
    _assert_falls_back(store, new, "sha256", caplog)


def rehash(path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    """Edit a checkpoint's manifest body and re-sign its hashes, as someone with write access could."""
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    body = manifest["body"]
    for name, entry in body["files"].items():
        data = (path / name).read_bytes()
        entry.update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    edit(body)
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    manifest["sha256"] = hashlib.sha256(canonical).hexdigest()
    (path / MANIFEST_FILE).write_text(json.dumps(manifest))


def test_newer_checkpoint_with_a_malformed_manifest_is_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, _, new = _two_checkpoints(tmp_path)
    rehash(new, lambda body: body.pop("model_keys"))
    _assert_falls_back(store, new, "missing fields", caplog)


class _Evil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("echo should never run",))


def test_checkpoint_whose_pickle_would_run_code_is_skipped_not_executed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, _, new = _two_checkpoints(tmp_path)
    torch.save({"state": _Evil()}, new / OPTIMIZER_FILE)
    rehash(new, lambda body: None)
    _assert_falls_back(store, new, "cannot be loaded", caplog)


def test_checkpoint_error_when_checkpoints_exist_but_none_verifies(tmp_path: Path) -> None:
    store, old, new = _two_checkpoints(tmp_path)
    for path in (old, new):
        (path / MODEL_FILE).write_bytes(b"")
    with pytest.raises(CheckpointError) as info:
        store.load_latest()
    message = str(info.value)
    assert old.name in message and new.name in message and "none verifies" in message
    assert old.exists() and new.exists()  # nothing is deleted on the way


def test_negative_round_is_refused(tmp_path: Path) -> None:
    _, _, state = trained_state(round=-1)
    with pytest.raises(ValueError, match="round"):
        CheckpointStore(tmp_path).save(state)


def test_keep_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="keep"):
        CheckpointStore(tmp_path, keep=0)
