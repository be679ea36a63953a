"""Training checkpoints on disk: written atomically, verified by hash, the last K kept.

Owns the checkpoint directory layout, its manifest, and the write / verify / load / prune
rules. It must not decide when to checkpoint, nor build models or optimizers: it stores
state dicts and hands them back (on the CPU; the caller moves them).

Layout: ``<directory>/ckpt-<seq>-round-<round>/`` holding

- ``model.safetensors``: the model state dict. Tensors that are the same tensor under two
  names (tied embeddings) are stored once; the manifest lists the aliases and loading gives
  both names the same tensor back. Other storage sharing is broken by copying.
- ``optimizer.pt``: the optimizer state dict (``torch.save``).
- ``trainer_state.pt``: ``{"rng": rng_state, "extra": extra}`` (``torch.save``).
- ``manifest.json``: round, policy version, the sha256 and size of each file above, and a
  sha256 of the manifest's own body. Written last.

``seq`` grows by one with each save, so "latest" means "most recently written": after a
resume from an older checkpoint, the newly written ones win over any abandoned newer ones.
The ``.pt`` files are read with ``torch.load(weights_only=True)``, so a checkpoint never
runs code; ``save`` refuses states that such a load could not read back.

A save writes everything into a hidden temporary directory, fsyncs each file, writes the
manifest, fsyncs the directory, renames it to its final name and fsyncs the parent. So a
directory under a final name is always complete; a crash leaves at most a hidden
temporary directory, removed by the next save. Pruning renames a checkpoint to a hidden
name before deleting it, for the same reason. One process writes a directory at a time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import random
import re
import secrets
import shutil
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch
import torch
from safetensors import SafetensorError

from swarmnode.errors import CheckpointError
from swarmnode.ops.faults import fault_point
from swarmnode.store.atomic import fsync_dir, fsync_file

__all__ = [
    "CheckpointState",
    "CheckpointStore",
    "capture_rng_state",
    "restore_rng_state",
]

log = logging.getLogger(__name__)

FORMAT = "swarmnode-checkpoint"
FORMAT_VERSION = 1
MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
TRAINER_STATE_FILE = "trainer_state.pt"
MANIFEST_FILE = "manifest.json"
_DATA_FILES = (MODEL_FILE, OPTIMIZER_FILE, TRAINER_STATE_FILE)
_NAME = re.compile(r"^ckpt-(\d+)-round-(\d+)$")
_TMP_PREFIX = ".tmp-"
_TRASH_PREFIX = ".trash-"
# Exactly the names save() and _prune() give their own hidden directories: only these are
# ever removed as leftovers, whatever else someone keeps in the directory.
_LEFTOVER = re.compile(r"^\.(tmp|trash)-ckpt-\d+-round-\d+-[0-9a-f]{8}$")
_HASH_CHUNK = 1 << 20
# What reading a checkpoint that passed its hashes can still raise (weights_only refusing a
# pickle, a safetensors header from an incompatible writer, a missing key).
_LOAD_ERRORS = (
    OSError,
    RuntimeError,
    KeyError,
    TypeError,
    ValueError,
    EOFError,
    pickle.UnpicklingError,
    SafetensorError,
)


@dataclass
class CheckpointState:
    """Everything needed to resume training exactly at the end of ``round``."""

    round: int
    policy_version: int
    model_state: dict[str, torch.Tensor]
    optimizer_state: dict[str, Any]
    rng_state: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


# -- RNG state -----------------------------------------------------------------------------


def capture_rng_state() -> dict[str, Any]:
    """The state of Python's, NumPy's and torch's global RNGs, in a form weights_only loads."""
    np_state = np.random.get_state(legacy=True)
    if not isinstance(np_state, tuple):  # only a non-MT19937 global generator gives a dict
        raise TypeError(f"unexpected numpy global RNG state {type(np_state).__name__}")
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np_state
    state: dict[str, Any] = {
        "python": random.getstate(),
        # NumPy's key array is stored as a tensor: weights_only refuses ndarray pickles.
        "numpy": (
            str(np_name),
            torch.from_numpy(np.asarray(np_keys, dtype=np.int64)),
            int(np_pos),
            int(np_has_gauss),
            float(np_gauss),
        ),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put the global RNGs back to a state from ``capture_rng_state`` (each one that it holds)."""
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "numpy" in state:
        np_name, np_keys, np_pos, np_has_gauss, np_gauss = state["numpy"]
        np.random.set_state((np_name, np_keys.numpy().astype(np.uint32), np_pos, np_has_gauss, np_gauss))
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# -- helpers -------------------------------------------------------------------------------

_WEIGHTS_ONLY_LEAVES = (
    type(None),
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    torch.Tensor,
    torch.Size,
    torch.dtype,
    torch.device,
)


def _check_weights_only(obj: Any, where: str) -> None:
    """Raise TypeError if ``torch.load(weights_only=True)`` could not read ``obj`` back."""
    kind = type(obj)
    if kind in (dict, OrderedDict):
        for key, value in obj.items():
            _check_weights_only(key, f"{where} key {key!r}")
            _check_weights_only(value, f"{where}[{key!r}]")
    elif kind in (list, tuple):
        for i, value in enumerate(obj):
            _check_weights_only(value, f"{where}[{i}]")
    # Exact types on purpose: a subclass (numpy.float64 is a float) may not load back.
    elif kind not in _WEIGHTS_ONLY_LEAVES and not isinstance(obj, torch.Tensor):
        raise TypeError(
            f"checkpoint {where} holds a {kind.__module__}.{kind.__qualname__}, which a weights-only "
            "load cannot read back; store plain containers, numbers, strings and tensors"
        )


def _prepare_model_state(
    model_state: dict[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors safetensors accepts (CPU, contiguous, no two sharing memory) and the alias map.

    A name whose tensor is exactly the same view as an earlier name's (tied weights) becomes
    an alias of it; any other overlap with an earlier tensor's memory is broken by a copy.
    """
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen_views: dict[tuple[Any, ...], str] = {}
    seen_storages: set[tuple[str, int]] = set()
    for name, tensor in model_state.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"model_state[{name!r}] is a {type(tensor).__name__}, not a tensor")
        t = tensor.detach()
        if t.numel() == 0:
            tensors[name] = t.cpu().clone()
            continue
        storage = (str(t.device), t.untyped_storage().data_ptr())
        view = (*storage, t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        if view in seen_views:
            aliases[name] = seen_views[view]
            continue
        seen_views[view] = name
        if storage in seen_storages:
            t = t.clone(memory_format=torch.contiguous_format)
        elif not t.is_contiguous():
            t = t.contiguous()
        seen_storages.add(storage)
        tensors[name] = t.cpu()
    return tensors, aliases


def _sha256_file(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def _body_is_well_formed(body: dict[str, Any]) -> bool:
    """Whether a manifest body has every field ``load`` reads, with the right types."""
    files = body.get("files")
    return (
        all(type(body.get(key)) is int for key in ("seq", "round", "policy_version"))
        and isinstance(body.get("model_keys"), list)
        and all(isinstance(k, str) for k in body["model_keys"])
        and isinstance(body.get("aliases"), dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in body["aliases"].items())
        and isinstance(files, dict)
        and all(
            isinstance(files.get(name), dict)
            and isinstance(files[name].get("sha256"), str)
            and type(files[name].get("bytes")) is int
            for name in _DATA_FILES
        )
    )


def _torch_save(obj: Any, path: Path) -> None:
    with path.open("wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


# -- the store -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Entry:
    seq: int
    round: int
    path: Path


class CheckpointStore:
    """Checkpoints under ``directory`` (created on the first save), keeping the ``keep`` newest."""

    def __init__(self, directory: Path, keep: int = 3) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.directory = Path(directory)
        self.keep = keep

    # -- listing -------------------------------------------------------------------------

    def _entries(self) -> list[_Entry]:
        if not self.directory.is_dir():
            return []
        entries = []
        for child in self.directory.iterdir():
            match = _NAME.match(child.name)
            if match and child.is_dir():
                entries.append(_Entry(int(match.group(1)), int(match.group(2)), child))
        return sorted(entries, key=lambda e: e.seq)

    def paths(self) -> list[Path]:
        """Checkpoint directories under their final names, oldest first (none are verified)."""
        return [e.path for e in self._entries()]

    # -- writing -------------------------------------------------------------------------

    def save(self, state: CheckpointState) -> Path:
        """Write ``state`` as the newest checkpoint, atomically; prune to ``keep``; return its path."""
        _check_weights_only(state.optimizer_state, "optimizer_state")
        _check_weights_only(state.rng_state, "rng_state")
        _check_weights_only(state.extra, "extra")
        if int(state.round) < 0:
            raise ValueError(f"checkpoint round must be >= 0, got {state.round}")
        tensors, aliases = _prepare_model_state(state.model_state)

        self.directory.mkdir(parents=True, exist_ok=True)
        self._remove_leftovers()
        entries = self._entries()
        seq = entries[-1].seq + 1 if entries else 1
        final = self.directory / f"ckpt-{seq:08d}-round-{int(state.round)}"
        tmp = self.directory / f"{_TMP_PREFIX}{final.name}-{secrets.token_hex(4)}"
        tmp.mkdir(mode=0o700)  # a checkpoint is private to the node's user (issue 19)
        try:
            safetensors.torch.save_file(tensors, str(tmp / MODEL_FILE), metadata={"format": "pt"})
            fsync_file(tmp / MODEL_FILE)
            fault_point("ckpt_partial")
            _torch_save(state.optimizer_state, tmp / OPTIMIZER_FILE)
            _torch_save({"rng": state.rng_state, "extra": state.extra}, tmp / TRAINER_STATE_FILE)
            files = {}
            for name in _DATA_FILES:
                digest, size = _sha256_file(tmp / name)
                files[name] = {"sha256": digest, "bytes": size}
            body = {
                "format": FORMAT,
                "format_version": FORMAT_VERSION,
                "seq": seq,
                "round": int(state.round),
                "policy_version": int(state.policy_version),
                "created_at": time.time(),
                "model_keys": list(state.model_state),
                "aliases": aliases,
                "files": files,
            }
            manifest = {"body": body, "sha256": hashlib.sha256(_canonical(body)).hexdigest()}
            with (tmp / MANIFEST_FILE).open("wb") as f:
                f.write(json.dumps(manifest, indent=1, sort_keys=True).encode())
                f.flush()
                os.fsync(f.fileno())
            for written in tmp.iterdir():
                os.chmod(written, 0o600)
            fsync_dir(tmp)
            fault_point("ckpt_unrenamed")
            os.rename(tmp, final)
        except BaseException:
            # Only our own temporary directory is removed; no final name was created.
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        fsync_dir(self.directory)
        fault_point("ckpt_unpruned")
        self._prune()
        return final

    def _prune(self) -> None:
        entries = self._entries()
        doomed = entries[: max(0, len(entries) - self.keep)]
        if not doomed:
            return
        trash = []
        for entry in doomed:
            # Rename first: a crash half-way through a delete must not leave a partial
            # checkpoint under a final name.
            target = self.directory / f"{_TRASH_PREFIX}{entry.path.name}-{secrets.token_hex(4)}"
            os.rename(entry.path, target)
            trash.append(target)
        fsync_dir(self.directory)
        for target in trash:
            shutil.rmtree(target)

    def _remove_leftovers(self) -> None:
        """Delete temporary and trash directories left by a crashed save or prune."""
        for child in self.directory.iterdir():
            if _LEFTOVER.match(child.name) and child.is_dir():
                log.info("removing %s, left over from an interrupted checkpoint write", child)
                shutil.rmtree(child)

    # -- reading -------------------------------------------------------------------------

    def _read_manifest(self, path: Path) -> dict[str, Any]:
        manifest_path = path / MANIFEST_FILE
        try:
            raw = manifest_path.read_bytes()
        except FileNotFoundError:
            raise CheckpointError(f"checkpoint {path}: {MANIFEST_FILE} is missing") from None
        except OSError as exc:
            raise CheckpointError(f"checkpoint {path}: cannot read {MANIFEST_FILE}: {exc}") from exc
        try:
            manifest = json.loads(raw)
            body = manifest["body"]
            expected = manifest["sha256"]
            actual = hashlib.sha256(_canonical(body)).hexdigest()
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"checkpoint {path}: {MANIFEST_FILE} is unreadable ({exc})") from exc
        if actual != expected:
            raise CheckpointError(f"checkpoint {path}: {MANIFEST_FILE} does not match its own sha256")
        if not isinstance(body, dict) or body.get("format") != FORMAT:
            raise CheckpointError(f"checkpoint {path}: not a swarmnode checkpoint")
        if body.get("format_version") != FORMAT_VERSION:
            raise CheckpointError(
                f"checkpoint {path}: format version {body.get('format_version')} is not the one this "
                f"swarmnode reads ({FORMAT_VERSION})"
            )
        if not _body_is_well_formed(body):
            raise CheckpointError(f"checkpoint {path}: {MANIFEST_FILE} is missing fields or has wrong types")
        match = _NAME.match(path.name)
        if match and (int(match.group(1)), int(match.group(2))) != (body["seq"], body["round"]):
            raise CheckpointError(f"checkpoint {path}: its name does not match its manifest")
        return body

    def verify(self, path: Path) -> None:
        """Raise CheckpointError (saying why) unless every file of checkpoint ``path`` matches its hash."""
        body = self._read_manifest(path)
        self._verify_files(path, body)

    def _verify_files(self, path: Path, body: dict[str, Any]) -> None:
        for name in _DATA_FILES:
            want = body["files"][name]
            try:
                digest, size = _sha256_file(path / name)
            except FileNotFoundError:
                raise CheckpointError(f"checkpoint {path}: {name} is missing") from None
            except OSError as exc:
                raise CheckpointError(f"checkpoint {path}: cannot read {name}: {exc}") from exc
            if size != want["bytes"]:
                raise CheckpointError(
                    f"checkpoint {path}: {name} is truncated or padded "
                    f"({size} bytes, expected {want['bytes']})"
                )
            if digest != want["sha256"]:
                raise CheckpointError(f"checkpoint {path}: {name} does not match its sha256 (corrupt)")

    def load(self, path: Path) -> CheckpointState:
        """Verify and load checkpoint ``path``; CheckpointError (saying why) if it is unusable."""
        path = Path(path)
        body = self._read_manifest(path)
        self._verify_files(path, body)
        try:
            tensors = safetensors.torch.load_file(str(path / MODEL_FILE), device="cpu")
            optimizer_state = torch.load(path / OPTIMIZER_FILE, map_location="cpu", weights_only=True)
            trainer_state = torch.load(path / TRAINER_STATE_FILE, map_location="cpu", weights_only=True)
            model_state: dict[str, torch.Tensor] = {}
            for key in body["model_keys"]:
                alias = body["aliases"].get(key)
                model_state[key] = tensors[alias] if alias is not None else tensors[key]
            rng_state = trainer_state["rng"]
            extra = trainer_state["extra"]
        # The hashes matched, so this is a checkpoint we wrote but cannot read (a bug, or a
        # file from an incompatible torch): still a reason to fall back, never to crash.
        except _LOAD_ERRORS as exc:
            raise CheckpointError(
                f"checkpoint {path}: cannot be loaded ({type(exc).__name__}: {exc})"
            ) from exc
        return CheckpointState(
            round=int(body["round"]),
            policy_version=int(body["policy_version"]),
            model_state=model_state,
            optimizer_state=optimizer_state,
            rng_state=rng_state,
            extra=extra,
        )

    def load_latest(self) -> CheckpointState | None:
        """The newest checkpoint that verifies, or None if there is none.

        A newer checkpoint that fails verification is skipped with a WARNING naming it and
        the reason. CheckpointError if checkpoints exist but none of them is usable.
        """
        skipped: list[Path] = []

        def warn(path: Path, exc: CheckpointError) -> None:
            log.warning("skipping unusable checkpoint %s: %s", path.name, exc)
            skipped.append(path)

        newest = self.load_newest(on_skip=warn)
        if newest is None:
            return None
        state, path = newest
        if skipped:
            log.warning("resuming from older checkpoint %s (round %d)", path.name, state.round)
        return state

    def load_newest(
        self, on_skip: Callable[[Path, CheckpointError], None] | None = None
    ) -> tuple[CheckpointState, Path] | None:
        """The newest checkpoint that verifies and its directory, or None if there is none; each
        newer one that fails is handed to ``on_skip``. CheckpointError if none of them is usable."""
        failures: list[str] = []
        for path in reversed(self.paths()):
            try:
                return self.load(path), path
            except CheckpointError as exc:
                if on_skip is not None:
                    on_skip(path, exc)
                failures.append(str(exc))
        if failures:
            raise CheckpointError(
                f"no usable checkpoint in {self.directory} ({len(failures)} found, none verifies):\n  "
                + "\n  ".join(failures)
                + "\nrestore them from a backup, or move them aside to start training from scratch"
            )
        return None
