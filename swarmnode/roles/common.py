"""What every role builds the same way from its config and home.

Owns: the task mixture, the policy (a local HF directory or the built-in tiny model, warm-started),
torch's thread count, the rollout engine ``model.engine`` names, the model family a PeerRecord
advertises, the hivemind runtime's settings, the verifier pool's gauges, and the Ctrl-C flag of the
blocking roles. Must not: run a role (``solo``, ``trainer``, ``learner``, ``worker``, ``bootstrap``).
"""

from __future__ import annotations

import functools
import signal
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import FrameType
from typing import Any, Protocol, TextIO

import torch

from swarmnode.config import Config, TaskDatasetConfig
from swarmnode.errors import EngineUnavailable, ModelError
from swarmnode.home import NodeHome
from swarmnode.net.config import NetConfig
from swarmnode.net.hivemind_runtime import HivemindRuntime
from swarmnode.ops.allocator import set_mmap_threshold
from swarmnode.ops.api import serve_forever
from swarmnode.ops.dashboard import Dashboard
from swarmnode.ops.metrics import Metrics
from swarmnode.policy import Policy, PromptFormat, build_tiny_policy, load_policy
from swarmnode.policy.chat import check_chat_template
from swarmnode.policy.chat_model import build_chat_policy
from swarmnode.policy.lora import apply_lora
from swarmnode.policy.warmstart import SPECIALIST_WARM_START, WarmStartSettings, warm_start, warm_start_dir
from swarmnode.rollout import RolloutEngine, make_engine
from swarmnode.tasks import DatasetSpec, TaskMixture, default_mixture, mixture_from_specs, sapo_mixture
from swarmnode.verify import VerifierPool


def _specs(entries: list[TaskDatasetConfig]) -> list[DatasetSpec]:
    return [DatasetSpec(e.name, dict(e.config), e.weight, e.prompt_format, e.label) for e in entries]


def task_seed(config: Config) -> int:
    """The task stream seed: ``tasks.seed``, or ``node.seed`` when it is -1."""
    return config.tasks.seed if config.tasks.seed >= 0 else config.node.seed


def build_mixture(config: Config) -> TaskMixture:
    """The training mixture: ``tasks.datasets`` when given (each entry checked now, before any
    work; a bad one is a ``ConfigError`` naming it), else the ``tasks.mixture`` preset."""
    seed = task_seed(config)
    if config.tasks.datasets:
        return mixture_from_specs(_specs(config.tasks.datasets), seed, key="tasks.datasets")
    if config.tasks.mixture == "sapo":
        return sapo_mixture(seed)
    return default_mixture(seed)


def build_warm_start_mixture(config: Config, mixture: TaskMixture) -> TaskMixture:
    """What the built-in tiny model is warm-started on: ``tasks.warm_start_datasets`` (a specialist)
    when given, else the training ``mixture``. Same seed and checks as ``build_mixture``."""
    if not config.tasks.warm_start_datasets:
        return mixture
    return mixture_from_specs(
        _specs(config.tasks.warm_start_datasets), task_seed(config), key="tasks.warm_start_datasets"
    )


def _warm_start_settings(config: Config) -> WarmStartSettings | None:
    """A specialist's warm-start settings (``tasks.warm_start_datasets``), else the default (None)."""
    return SPECIALIST_WARM_START if config.tasks.warm_start_datasets else None


def warm_start_cache(config: Config, home: NodeHome, mixture: TaskMixture) -> Path | None:
    """Where ``build_policy`` finds (or builds) this config's warm start in ``home``; None when the
    config names no warm start (``model.path``, or ``model.warm_start = false``). The key holds the
    seed, the warm-start mixture and torch's threads: call after ``configure_threads``."""
    if config.model.path or not config.model.warm_start:
        return None
    return warm_start_dir(
        home.root,
        build_warm_start_mixture(config, mixture),
        config.node.seed,
        _warm_start_settings(config),
        builtin=config.model.builtin,
    )


def build_policy(config: Config, home: NodeHome, mixture: TaskMixture, say: TextIO = sys.stderr) -> Policy:
    """The configured model: a local HF directory, or a built-in model (``model.builtin``)
    warm-started (cached) on ``build_warm_start_mixture``. ``tasks.warm_start_datasets`` is checked
    even when unused. Sets ``rollout.max_new_tokens`` to ``default_max_new_tokens`` for this model
    when the config leaves it unset (before anything reads it)."""
    warm_mixture = build_warm_start_mixture(config, mixture)
    if config.model.path:
        policy = load_policy(Path(config.model.path).expanduser())
    elif not config.model.warm_start:
        build = build_chat_policy if config.model.builtin == "chat" else build_tiny_policy
        policy = build(config.node.seed)
    else:
        path = warm_start(
            home.root,
            warm_mixture,
            config.node.seed,
            progress=lambda line: print(line, file=say),
            settings=_warm_start_settings(config),
            builtin=config.model.builtin,
        )
        policy = load_policy(path)
    policy.prompt_format = PromptFormat(config.rollout.chat_template, config.rollout.system_prompt)
    if policy.chat_prompts:  # a broken or clock-reading template fails here, at start, naming the model
        check_chat_template(policy.tokenizer, config.rollout.system_prompt, model_id=policy.model_id)
        policy.encode_prompt("1+1=")
    if "max_new_tokens" not in config.rollout.model_fields_set:
        config.rollout.max_new_tokens = default_max_new_tokens(config, policy)
    if config.node.role != "worker":  # a worker trains nothing: it loads its learner's merged weights
        train_setup(config, policy)
    return policy


def train_setup(config: Config, policy: Policy) -> None:
    """What ``learn`` asks of the model a role trains: LoRA adapters (``learn.lora_rank``) and
    gradient checkpointing (``learn.gradient_checkpointing``)."""
    learn = config.learn
    if learn.lora_rank > 0:
        with torch.random.fork_rng(devices=[]):  # A's random start from node.seed: a run repeats
            torch.manual_seed(config.node.seed)
            policy.model = apply_lora(
                policy.model, learn.lora_rank, learn.lora_alpha, learn.lora_target_modules
            )
    if learn.gradient_checkpointing:
        # Non-reentrant checkpointing: gradients reach the adapters even though the frozen base's
        # inputs do not require grad (the reentrant variant would silently train nothing).
        kwargs = {"use_reentrant": False}
        model: Any = policy.model
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x's name
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        elif hasattr(model, "gradient_checkpointing_enable"):
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        else:
            raise ModelError("learn.gradient_checkpointing: this model cannot checkpoint its layers")


#: ``rollout.max_new_tokens`` when the config does not set it: the tiny model answers in a few
#: characters; the built-in chat model in ``<answer>...</answer>`` after a short thought; a user's
#: chat model reasons before it answers.
TINY_MAX_NEW_TOKENS, BUILTIN_CHAT_MAX_NEW_TOKENS, CHAT_MAX_NEW_TOKENS = 8, 64, 256


def default_max_new_tokens(config: Config, policy: Policy) -> int:
    """The completion length cap for ``policy`` when ``rollout.max_new_tokens`` is not set."""
    if not policy.chat_prompts:
        return TINY_MAX_NEW_TOKENS
    return BUILTIN_CHAT_MAX_NEW_TOKENS if not config.model.path else CHAT_MAX_NEW_TOKENS


def configure_threads(config: Config) -> None:
    """The process's compute settings: torch's threads and glibc's mmap threshold (``node``)."""
    if config.node.threads > 0:
        torch.set_num_threads(config.node.threads)
    set_mmap_threshold(config.node.malloc_mmap_threshold_kib)


class StopFlag:
    """Set by SIGINT/SIGTERM; the loop checks it between rounds."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def install(self) -> None:
        def handler(signum: int, frame: FrameType | None) -> None:
            if self.event.is_set():  # second Ctrl-C: the user really wants out now
                raise KeyboardInterrupt
            print("\nstopping after this round (Ctrl-C again to abort)...", file=sys.stderr)
            self.event.set()

        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)


class ServedRole(Protocol):
    """What a role hands the API job: its settings, home, metrics, documents and runtime."""

    config: Config
    home: NodeHome
    metrics: Metrics

    @property
    def runtime(self) -> HivemindRuntime: ...

    def status(self) -> dict[str, Any]: ...

    async def dashboard(self) -> Dashboard: ...


def api_job(role: ServedRole) -> Callable[[], Awaitable[None]]:
    """The job every role runs beside its own: the HTTP API (``/status``, ``/metrics``, ``/healthz``
    while its runtime runs, the page and its ``/dashboard.json``) on ``api.host``:``api.port`` until
    cancelled, its bound port in ``HOME/api.port``."""
    return functools.partial(
        serve_forever,
        role.metrics,
        role.status,
        lambda: role.runtime.is_running,
        role.config.api.host,
        role.config.api.port,
        role.home.root / "api.port",
        role.dashboard,
    )


def role_engine(config: Config, policy: Policy) -> RolloutEngine:
    """The rollout engine ``model.engine`` names, serving ``policy`` (``rollout.make_engine``).

    Every role builds its engine here: a trainer and a solo run generate with it, a learner uses it
    for held-out evaluation and keeps it in step with each new version, a worker generates with it
    and loads each received version into it. One that cannot run here fails at start, naming the key
    and its value.
    """
    try:
        return make_engine(config.model.engine, policy)
    except EngineUnavailable as exc:
        raise EngineUnavailable(
            f"model.engine = {config.model.engine!r} cannot run the {config.node.role} here: {exc}"
        ) from exc


def model_family(policy: Policy) -> str:
    """The family a PeerRecord advertises: the model's HF ``model_type`` ("llama", "qwen2", ...)."""
    return str(getattr(getattr(policy.model, "config", None), "model_type", "") or "")


def verifier_gauges(metrics: Metrics, verifier: VerifierPool) -> None:
    """The verification boundary's counters in ``/metrics``."""
    stats = verifier.stats()
    metrics.set("verifier_batches", "Batches scored by the verifier pool", stats["batches"])
    metrics.set("verifier_timeouts", "Batches refused verifier_timeout", stats["timeouts"])
    metrics.set("verifier_failures", "Batches refused verifier_failed", stats["failed"])
    metrics.set("verifier_restarts", "Verifier workers replaced", stats["restarts"])
    metrics.set("verifier_cpu_seconds", "CPU the verifier workers spent", stats["cpu_seconds"])


def net_config(config: Config, home: NodeHome) -> NetConfig:
    """The hivemind runtime's settings from a node's config (every role uses the same)."""
    s = config.swarm
    return NetConfig(
        identity_path=home.p2p / "libp2p.key",
        host_maddrs=tuple(s.host_maddrs),
        announce_maddrs=tuple(s.announce_maddrs),
        initial_peers=tuple(s.initial_peers),
        peers_file=Path(s.peers_file) if s.peers_file else None,
        client_mode=s.client_mode,
    )


__all__ = [
    "ServedRole",
    "StopFlag",
    "api_job",
    "build_mixture",
    "build_policy",
    "build_warm_start_mixture",
    "configure_threads",
    "model_family",
    "net_config",
    "role_engine",
    "task_seed",
    "train_setup",
    "verifier_gauges",
]
