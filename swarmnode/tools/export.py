"""``swarmnode export``: a node's current policy as a Hugging Face directory other tools load.

The policy a node trains lives in its checkpoints (``HOME/checkpoints``: weights, optimizer, RNG;
``swarmnode.store.checkpoint``), not in a model directory. Exporting rebuilds the model the node
started from (``roles.common.build_policy``: ``model.path``, or the built-in tiny model's cached
warm start), loads the newest verified checkpoint's weights into it (strictly: a checkpoint of
another architecture is an error naming the mismatch) and writes the result with
``policy.save_pretrained``'s atomic writer: safetensors weights, ``config.json``, the tokenizer
(and its chat template when it has one), plus ``swarmnode_export.json`` saying where it came from.

    swarmnode export --home runs/swarm/node-0 --out exported/
    AutoModelForCausalLM.from_pretrained("exported/")  # transformers, anywhere

A node that trains LoRA adapters (``learn.lora_rank``) is exported merged (the plain model above),
or with ``--adapter`` as the adapter alone in peft's format (``adapter_config.json``,
``adapter_model.safetensors``, the tokenizer): ``PeftModel.from_pretrained(base, "exported/")`` on
the model the node started from (``model.path``, recorded as ``base_model_name_or_path``).

Must not: train, or write anything into the node's home.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from swarmnode.config import Config
from swarmnode.errors import CheckpointError, ConfigError, ModelError
from swarmnode.home import NodeHome
from swarmnode.policy.model import Policy, save_adapter, save_policy
from swarmnode.roles.common import build_mixture, build_policy, configure_threads
from swarmnode.store.checkpoint import CheckpointState, CheckpointStore

#: Written beside the weights: which node, round and checkpoint the export holds.
PROVENANCE_FILE = "swarmnode_export.json"


@dataclass(frozen=True)
class Exported:
    out: Path
    round: int
    policy_version: int
    checkpoint: Path
    parameters: int


def check_policy_home(config: Config, home: NodeHome, verb: str) -> None:
    """A ``ConfigError`` unless ``home`` is a directory of a node that trains (checkpoints a policy)."""
    if not home.root.is_dir():
        raise ConfigError(f"--home {home.root} is not a directory")
    if config.node.role == "worker":
        raise ConfigError(f"a worker trains nothing and keeps no checkpoint: {verb} its learner's home")


def node_checkpoint(home: NodeHome, checkpoint: Path | None, say: TextIO) -> tuple[CheckpointState, Path]:
    """The given checkpoint, or the newest one that verifies (a damaged newer one is named on ``say``
    and skipped); an error naming the folder when there is none."""
    store = CheckpointStore(home.checkpoints)
    if checkpoint is not None:
        return store.load(checkpoint), checkpoint
    newest = store.load_newest(on_skip=lambda path, exc: print(f"skipping {path.name}: {exc}", file=say))
    if newest is None:
        raise CheckpointError(
            f"no checkpoint in {home.checkpoints}: the node has not saved a policy yet "
            "(it checkpoints every checkpoint.every_rounds rounds and when it stops)"
        )
    return newest


def check_checkpoint_fits(policy: Policy, state: CheckpointState, path: Path, config: Config) -> None:
    """A ``ModelError`` naming how ``state``'s weights differ from ``policy``'s (missing, unexpected,
    other shapes: counts and a few names), and the flag that likely explains it, before any work
    (``swarmnode evaluate`` would otherwise find it after its whole start pass)."""
    ours = policy.model.state_dict()
    theirs = state.model_state
    missing = sorted(set(ours) - set(theirs))
    unexpected = sorted(set(theirs) - set(ours))
    shapes = sorted(k for k in set(ours) & set(theirs) if tuple(ours[k].shape) != tuple(theirs[k].shape))
    if not (missing or unexpected or shapes):
        return
    parts = [
        f"{len(names)} {what} (e.g. {', '.join(names[:3])})"
        for names, what in (
            (missing, "weights missing"),
            (unexpected, "unexpected"),
            (shapes, "of other shapes"),
        )
        if names
    ]
    hint = ""
    if any("lora_" in k for k in unexpected):
        hint = "; it holds LoRA adapters: pass the run's --set learn.lora_rank=R"
    elif any("lora_" in k for k in missing):
        hint = (
            "; this config trains LoRA adapters the checkpoint does not hold: pass the run's learn.lora_rank"
        )
    model = config.model.path or f"the built-in {config.model.builtin} model"
    raise ModelError(
        f"checkpoint {path} does not fit the configured model ({model}): {'; '.join(parts)}{hint}"
    )


def load_checkpoint_into(policy: Policy, state: CheckpointState, path: Path, config: Config) -> None:
    """``state``'s weights into ``policy`` (built by ``build_policy`` from the same config), strictly:
    a checkpoint of another architecture is an error naming the mismatch."""
    check_checkpoint_fits(policy, state, path, config)
    try:
        policy.model.load_state_dict(state.model_state, strict=True)
    except RuntimeError as exc:  # anything the check above does not see
        raise ModelError(f"checkpoint {path} does not fit the configured model: {exc}") from exc
    policy.version = state.policy_version


def export_policy(
    config: Config,
    home: NodeHome,
    out: Path,
    *,
    checkpoint: Path | None = None,
    force: bool = False,
    adapter: bool = False,
    say: TextIO | None = None,
) -> Exported:
    """Write ``home``'s newest (or the given) checkpoint as an HF model directory at ``out``;
    progress and skipped checkpoints go to ``say`` (default: standard error)."""
    say = say or sys.stderr
    check_policy_home(config, home, "export")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise ConfigError(f"--out {out} exists and is not empty (use --force to replace it)")
    if out.resolve() == home.root.resolve() or home.root.resolve() in out.resolve().parents:
        raise ConfigError(f"--out {out} is inside the node's home {home.root}; export elsewhere")
    if adapter and config.learn.lora_rank == 0:
        raise ConfigError(
            "--adapter: this node trains no LoRA adapter (learn.lora_rank is 0); export the whole model "
            "without --adapter"
        )
    state, path = node_checkpoint(home, checkpoint, say)
    configure_threads(config)  # as the node ran: its warm-start cache is keyed by torch's threads
    policy = build_policy(config, home, build_mixture(config), say=say)
    load_checkpoint_into(policy, state, path, config)
    provenance = {
        "format": "swarmnode-export",
        "model_id": policy.model_id,
        "round": state.round,
        "policy_version": state.policy_version,
        "checkpoint": path.name,
        "home": str(home.root.resolve()),
    }
    extra_files = {PROVENANCE_FILE: json.dumps(provenance, indent=2) + "\n"}
    if adapter:
        save_adapter(policy, out, base_model=config.model.path, extra_files=extra_files)
        parameters = sum(p.numel() for n, p in policy.model.named_parameters() if "lora_" in n)
    else:
        save_policy(policy, out, extra_files=extra_files)
        parameters = sum(p.numel() for n, p in policy.model.named_parameters() if "lora_" not in n)
    return Exported(out, state.round, state.policy_version, path, parameters)
