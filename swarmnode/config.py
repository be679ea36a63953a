"""One typed configuration: TOML file < environment (``SWARMNODE_SECTION__KEY``) < flags.

Owns: the schema, its defaults and its validation messages, and the [swarm]
settings it advises for a swarm of N nodes (``large_swarm_settings``). Must not read
anything but the config file and the environment it is given.
"""

from __future__ import annotations

import os
import textwrap
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from swarmnode.errors import ConfigError

#: What a chat model is asked to do with every question (``rollout.system_prompt``): the final
#: answer inside the tag ``swarmnode.tasks.scoring.extract_answer`` reads.
DEFAULT_SYSTEM_PROMPT = (
    "You are a careful problem solver. Think it through briefly, then give only the final answer "
    "inside <answer></answer> tags, for example <answer>42</answer>."
)
#: The longest system prompt a config may set, in characters (it is in every prompt).
MAX_SYSTEM_PROMPT_CHARS = 4096
#: What ``learn.lora_target_modules`` adapts by default: every projection of a Llama / Qwen / Mistral
#: decoder layer (attention and MLP), as in peft's and TRL's examples for these families.
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

CONFIG_FILE = "swarmnode.toml"
ENV_PREFIX = "SWARMNODE_"


class Section(BaseModel):
    # coerce_numbers_to_str: `--set node.name=1` or SWARMNODE_NODE__NAME=1 is the name "1".
    model_config = ConfigDict(extra="forbid", validate_assignment=True, coerce_numbers_to_str=True)


class NodeConfig(Section):
    name: str = Field("node", description="Human-readable name shown in logs and /status.")
    role: Literal["trainer", "learner", "worker"] = Field(
        "trainer",
        description="trainer: swarm member (gossip + train); learner: trains on recruited workers' "
        "rollouts; worker: generates for worker.learner.",
    )
    seed: int = Field(0, ge=0, description="Seed for task sampling, model init and generation.")
    threads: int = Field(0, ge=0, description="torch CPU threads; 0 = all cores.")
    malloc_mmap_threshold_kib: int = Field(
        0,
        ge=0,
        le=32 * 1024,
        description="glibc's mmap threshold in KiB (0 = glibc's default): every larger block gets its "
        "own mapping, returned to the kernel when freed: a training node's peak RSS falls to what it "
        "uses (README, 'Memory for a real model'), at a CPU cost.",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Log verbosity.")


class ModelConfig(Section):
    path: str = Field(
        "",
        description="Local HF model directory. Empty = the built-in tiny model with its cached warm start.",
    )
    engine: Literal["torch", "hf", "vllm"] = Field("torch", description="Rollout engine.")
    builtin: Literal["tiny", "chat"] = Field(
        "tiny",
        description="The built-in model when path is empty: 'tiny' (1 M-parameter Llama, character "
        "tokenizer, compact prompts) or 'chat' (1 M-parameter Qwen2, byte-level BPE tokenizer, ChatML "
        "chat template, answers in <answer></answer>: the path a Qwen2.5-Instruct checkpoint takes).",
    )
    warm_start: bool = Field(True, description="Warm-start the built-in model on task demonstrations.")


class TaskDatasetConfig(Section):
    """One ``[[tasks.datasets]]`` (or ``[[tasks.warm_start_datasets]]``) entry: a generator in a mixture.

    The shape is checked here; whether the generator exists, takes these config keys and can be
    scored safely is checked when the node builds its mixture at start
    (``swarmnode.tasks.mixture.mixture_from_specs``), before any other work."""

    name: str = Field(
        description="reasoning-gym generator, e.g. 'chain_sum' (`swarmnode tasks audit --all`)."
    )
    config: dict[str, Any] = Field(
        default_factory=dict,
        description="That generator's config keys (its reasoning-gym config dataclass; not seed or size).",
    )
    weight: float = Field(
        1.0, gt=0.0, allow_inf_nan=False, description="Relative sampling weight (> 0, finite)."
    )
    prompt_format: Literal["question", "compact"] = Field(
        "question",
        description="'question': the generator's question text; 'compact': the bare arithmetic "
        "expression and '=' (the built-in tiny model's format).",
    )
    label: str = Field(
        "",
        pattern=r"^[A-Za-z0-9_.-]{0,32}$",
        description="The family's name in held-out results, status and the ledger (letters, digits, "
        "'_', '.', '-'; at most 32). Empty = the generator's name.",
    )


class TasksConfig(Section):
    mixture: Literal["default", "sapo"] = Field(
        "default",
        description="Preset mixture when tasks.datasets is empty: 'default': 2-term chain_sum (tiny model); "
        "'sapo': SAPO's nine generators.",
    )
    datasets: list[TaskDatasetConfig] = Field(
        default_factory=list,
        description="Your own mixture, replacing the preset: one [[tasks.datasets]] table per generator "
        "with name, config (a table), weight (default 1), prompt_format ('question' or 'compact'; "
        "default 'question') and label (the family's name in held-out results; default the generator's). "
        "Empty = the tasks.mixture preset; setting both a non-default "
        "tasks.mixture and tasks.datasets is an error. Peers accept only groups of the families "
        "listed here (others are refused task_not_allowed, charged to nobody).",
    )
    warm_start_datasets: list[TaskDatasetConfig] = Field(
        default_factory=list,
        description="Mixture the built-in tiny model is warm-started on (a specialist), same entry shape "
        "as tasks.datasets, as [[tasks.warm_start_datasets]] tables. Empty = the training mixture. "
        "Used only when model.path is empty and model.warm_start is true; each mixture gets its own "
        "cache directory under HOME/models. A specialist's warm start stops at 95% greedy accuracy "
        "(on its 2-digit tasks if it has any) or 1,000 steps.",
    )
    heldout_size: int = Field(
        200,
        ge=0,
        description="Held-out tasks for greedy accuracy evaluation, split evenly over the mixture's "
        "families (status and the ledger give each family's accuracy and their mean).",
    )
    seed: int = Field(
        -1,
        ge=-1,
        description="Task stream seed; -1 = node.seed. The same value on every node makes peers "
        "answer the same prompts each swarm round (HACPO's joint groups).",
    )

    @model_validator(mode="after")
    def _preset_or_datasets(self) -> TasksConfig:
        if self.datasets and self.mixture != "default":
            raise ValueError(
                f"tasks.mixture = {self.mixture!r} and tasks.datasets are both set: tasks.datasets replaces "
                "the preset, so remove one of the two keys"
            )
        return self


class RolloutConfig(Section):
    prompts_per_round: int = Field(16, ge=1, le=4096, description="Prompts (groups) sampled per round.")
    group_size: int = Field(8, ge=1, le=256, description="Completions per prompt (G).")
    temperature: float = Field(1.0, gt=0.0, le=10.0, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling threshold.")
    max_new_tokens: int = Field(
        8,
        ge=1,
        le=4096,
        description="Completion length cap. Unset: 8 for a model without a chat template (the tiny "
        "model), 64 for the built-in chat model, 256 for a model.path chat model.",
    )
    chat_template: bool = Field(
        True,
        description="Render prompts through the model tokenizer's chat template when it has one: "
        "system_prompt, then the task's question as the user turn, then the assistant turn opened. "
        "false: the bare question (base models). The built-in tiny model has no template.",
    )
    system_prompt: str = Field(
        DEFAULT_SYSTEM_PROMPT,
        max_length=MAX_SYSTEM_PROMPT_CHARS,
        description="The system turn of chat-format prompts (asks for the answer in <answer></answer>, "
        "which the scorers read); empty = no system turn.",
    )


class LearnConfig(Section):
    algorithm: Literal["grpo", "dapo", "gspo"] = Field("grpo", description="Loss on the node's own groups.")
    lr: float = Field(1e-4, gt=0.0, le=1.0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay.")
    updates_per_round: int = Field(1, ge=1, le=64, description="Optimizer steps per round (k).")
    eps_low: float = Field(
        0.2,
        ge=0.0,
        le=1.0,
        description=(
            "Lower clip range (token ratio: GRPO, DAPO). GSPO and HACPO's own samples clip a "
            "sequence ratio: 3e-4 unless set to a value other than 0.2."
        ),
    )
    eps_high: float = Field(
        0.28,
        ge=0.0,
        le=10.0,
        description=(
            "Upper clip range (clip-higher; GSPO and HACPO: 4e-4 unless set to a value other than 0.28)."
        ),
    )
    beta: float = Field(0.0, ge=0.0, description="k3 KL coefficient to the initial policy; 0 disables.")
    aggregation: Literal[
        "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
    ] = Field("seq-mean-token-mean", description="Loss aggregation (verl names).")
    scale_rewards: Literal["group", "batch", "none"] = Field("group", description="Advantage std scaling.")
    drop_zero_advantage: bool = Field(True, description="Skip groups whose rewards are all equal.")
    max_grad_norm: float = Field(1.0, gt=0.0, description="Gradient clipping norm.")
    stale_loss: Literal["m2po", "same"] = Field(
        "m2po",
        description="Loss for a step with own groups older than the policy (learner with workers): "
        "M2PO (ALGORITHMS.md §4), or the same loss as fresh data.",
    )
    m2po_tau: float = Field(0.04, gt=0.0, description="M2PO second-moment threshold tau.")
    shared_prefix: bool = Field(
        True,
        description="Score each group's prompt once in the update (a group's completions packed behind "
        "its prompt, short groups binned into sequences of up to 128 tokens; exact up to float rounding). "
        "False: one row per completion, the prompt repeated.",
    )
    lora_rank: int = Field(
        0,
        ge=0,
        le=1024,
        description="LoRA rank (peft): train low-rank adapters on a frozen base instead of every weight; "
        "0 = full fine-tuning. A learner's workers receive each version as the adapter alone "
        "(learner.adapter_broadcast).",
    )
    lora_alpha: float = Field(
        16.0,
        gt=0.0,
        le=65_536.0,  # alpha / rank is a broadcast's adapter_scale: finite, in (0, 65536] (SPEC 1.5)
        allow_inf_nan=False,
        description="LoRA scale numerator: updates scale by alpha / rank.",
    )
    lora_target_modules: list[str] = Field(
        default_factory=lambda: list(DEFAULT_LORA_TARGETS),
        min_length=1,
        description="Module names LoRA adapts (Llama / Qwen / Mistral names: attention and MLP projections).",
    )
    micro_batch_tokens: int = Field(
        0,
        ge=0,
        description="Run an update at most this many tokens through the model at a time (whole groups; "
        "exact: the loss's gradient is taken on all log-probs, then pushed back a micro-batch at a time); "
        "costs one more forward pass per step. 0 = the whole update at once.",
    )
    gradient_checkpointing: bool = Field(
        False,
        description="Recompute each decoder layer's activations in the backward pass instead of keeping "
        "them: less memory, about a third more compute per update.",
    )
    precision: Literal["fp32", "bf16"] = Field(
        "fp32",
        description="Arithmetic of the update's forward and backward passes: bf16 runs them in bfloat16 "
        "(torch.autocast) on hardware with bf16 units (an error elsewhere); weights, optimizer, rollouts "
        "and broadcasts stay float32, and on a CPU attention too. Faster (a Qwen2-shaped update 2.6x on "
        "an avx512_bf16 CPU), at the price of rounding the update's log-probs by ~1e-3.",
    )


class CheckpointConfig(Section):
    every_rounds: int = Field(10, ge=1, description="Write a checkpoint every N rounds.")
    keep: int = Field(3, ge=1, le=1000, description="Checkpoints kept on disk.")


class SwarmConfig(Section):
    mixing: Literal[
        "none", "sapo", "hacpo", "joint", "receiver_baseline", "positive_only", "anchored", "replay"
    ] = Field(
        "none",
        description="How external groups are used: SAPO, HACPO, or a transfer rule of "
        "swarmnode.learn.transfer (joint, receiver_baseline, positive_only, anchored, replay).",
    )
    local_groups: int = Field(
        4, ge=0, description="I: own groups per update (SAPO; HACPO uses every own group)."
    )
    external_groups: int = Field(4, ge=0, description="J: external groups per update (SAPO and HACPO).")
    replay_demos: int = Field(
        64,
        ge=0,
        le=1024,
        description="K: remembered verified demonstrations replayed per update (mixing = replay).",
    )
    replay_memory: int = Field(
        256,
        ge=1,
        le=1024,  # an add to a full family costs O(drops x senders), senders <= 8 a prompt
        description=(
            "Prompts with verified answers kept per family, 8 answers each (mixing = replay); an answer"
            " takes about 4 bytes a prompt and completion token (up to max_new_tokens: 17 KiB at 4,096)."
        ),
    )
    round_demand: int = Field(
        0,
        ge=0,
        le=4096,
        description="Peers' batches to pull per round, drawn fairly over their announcers at the round's "
        "end (core.demand); 0: pull every batch announced. In a large swarm about 1.5 x external_groups"
        " / rollout.prompts_per_round (a batch holds a peer's groups of a round), at least 2.",
    )
    announce_buckets: int = Field(
        1,
        ge=1,
        le=65536,
        description="DHT keys each round's announcement records are spread over (the same on every node "
        "of a swarm); 1: one key per round. In a large swarm about N / 64.",
    )
    read_buckets: int = Field(
        0,
        ge=0,
        le=65536,
        description="Announcement buckets a node reads per round at first (0: all); it reads more while "
        "a round's offers fall short of round_demand.",
    )
    relay: bool = Field(
        False,
        description="Serve and announce the peers' batches this node admitted, in their round and while "
        "their author does, within the gossip serve budgets and 64 MiB (SPEC 1.4): shares the upload of "
        "a batch many nodes pull.",
    )
    initial_peers: list[str] = Field(default_factory=list, description="Bootstrap multiaddrs.")
    peers_file: str = Field("", description="File with one bootstrap multiaddr per line.")
    host_maddrs: list[str] = Field(
        default_factory=lambda: ["/ip4/127.0.0.1/tcp/0"], description="libp2p listen multiaddrs."
    )
    announce_maddrs: list[str] = Field(default_factory=list, description="Multiaddrs announced to peers.")
    client_mode: bool = Field(False, description="Do not accept incoming connections (behind NAT).")
    round_seconds: float = Field(
        30.0, gt=0.0, description="Swarm round length; rounds are wall-clock epochs."
    )
    staleness_bound: int = Field(
        8,
        ge=0,
        description="Max policy-version lag of an accepted rollout (learner/worker mode; SAPO peers' "
        "versions are independent counters, so it does not apply between them). A worker abandons "
        "fetching a version once one more than this many versions newer is announced.",
    )


class LearnerConfig(Section):
    groups_per_step: int = Field(
        8, ge=1, le=4096, description="B: worker groups per learner step (role learner)."
    )
    margin: float = Field(
        0.2, ge=0.0, le=10.0, description="Activate workers until R >= (1 + margin) * B / T."
    )
    activation: Literal["planner", "all"] = Field(
        "planner", description="planner: cheapest set that keeps the learner busy; all: every worker."
    )
    max_wait_seconds: float = Field(
        120.0, gt=0.0, description="A step waits at most this long for B groups, then trains on what it has."
    )
    spot_check_rate: float = Field(
        0.25,
        ge=0.0,
        le=1.0,
        description="Share of a worker's batches spot-checked (one group each: its log-probs re-computed "
        "and its tokens checked against keyed sampling); every batch while the worker has a strike.",
    )
    spot_check_tokens: int = Field(16, ge=1, le=4096, description="Tokens re-computed per spot check.")
    spot_check_tolerance: float = Field(
        1e-3, gt=0.0, description="Max |reported - recomputed| log-prob for a token to pass."
    )
    spot_check_strikes: int = Field(
        1, ge=1, le=100, description="Failed spot checks before a worker is deactivated."
    )
    adapter_broadcast: bool = Field(
        True,
        description="With learn.lora_rank > 0, broadcast each version as its LoRA adapter alone (workers "
        "add it to the base model they loaded, which must be the learner's); false: the whole merged "
        "model, which workers of releases before adapter broadcasts need.",
    )
    keyed_sampling: bool = Field(
        True,
        description="Give each activation a fresh sampling seed and check spot-checked tokens against "
        "keyed sampling (protocol/SPEC.md 1.8): catches a worker sampling from anything but the "
        "version it claims. Workers must then sample with the torch engine and the learner's "
        "rollout.temperature and rollout.top_p.",
    )
    keyed_margin: float = Field(
        1e-4,
        gt=0.0,
        le=0.01,
        description="A token that is not keyed sampling's choice is skipped, not failed, when every CDF "
        "boundary between the two lies within this margin of the threshold (kernel drift; raise it "
        "for bf16 workers).",
    )
    chunk_bytes: int = Field(
        4 * 1024 * 1024, ge=64 * 1024, description="Weight broadcast chunk size in bytes."
    )
    lease_seconds: int = Field(60, ge=1, le=86400, description="An activation lapses unless renewed.")
    recruit_seconds: float = Field(5.0, gt=0.0, description="How often worker offers are re-read.")
    rate_window: float = Field(
        30.0, gt=0.0, description="Seconds of deliveries over which a worker's rate is measured."
    )
    drift_hold: float = Field(
        30.0, gt=0.0, description="A measured rate off the plan this long is adopted (re-plan)."
    )
    offers_per_network: int = Field(
        8,
        ge=1,
        le=256,
        description="Offers pushed to the learner that it keeps from one network (IPv4 /24, IPv6 /48).",
    )


class WorkerConfig(Section):
    learner: str = Field("", description="Peer id of the learner to work for (role worker).")
    learner_address: str = Field(
        "",
        pattern=r"^$|^[^\s:]+:[0-9]{1,5}$|^\[[0-9a-fA-F:.]+\]:[0-9]{1,5}$",
        description="Learner data plane host:port to use when the DHT has no record of it; empty = DHT only.",
    )
    price: float = Field(1.0, ge=0.0, description="Asked price per 1,000 completions.")
    slowdown: float = Field(
        1.0,
        ge=1.0,
        le=1000.0,
        description="Simulated slower hardware: each batch takes this many times its real time.",
    )
    hardware: str = Field("", description="Hardware advertised to learners; empty = detected (cpu:N).")


class DataPlaneConfig(Section):
    host: str = Field("127.0.0.1", description="Direct TCP data plane bind address.")
    port: int = Field(0, ge=0, le=65535, description="Data plane port; 0 = pick a free one.")
    advertise: str = Field("", description="host:port peers dial; empty = the bound address.")
    upload_rate: float = Field(
        0.0, ge=0.0, description="Upload cap in bytes/s shared by all uploads; 0 = unlimited."
    )


class VerifyConfig(Section):
    workers: int = Field(2, ge=1, le=64, description="Sandboxed verifier processes that score completions.")
    completion_cpu_s: float = Field(
        1.0, gt=0, le=60, description="CPU seconds one completion's scoring may take before it is refused."
    )
    batch_cpu_s: float = Field(
        5.0, gt=0, le=600, description="CPU seconds one envelope's (or round's) scoring may take."
    )
    memory_mb: int = Field(1024, ge=64, description="Address space a verifier may add after its start.")


class ApiConfig(Section):
    host: str = Field("127.0.0.1", description="Local HTTP API bind address.")
    port: int = Field(0, ge=0, le=65535, description="Local HTTP API port; 0 = pick a free one.")


class Config(Section):
    node: NodeConfig = Field(default_factory=NodeConfig)  # type: ignore[arg-type]
    model: ModelConfig = Field(default_factory=ModelConfig)  # type: ignore[arg-type]
    tasks: TasksConfig = Field(default_factory=TasksConfig)  # type: ignore[arg-type]
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)  # type: ignore[arg-type]
    learn: LearnConfig = Field(default_factory=LearnConfig)  # type: ignore[arg-type]
    learner: LearnerConfig = Field(default_factory=LearnerConfig)  # type: ignore[arg-type]
    worker: WorkerConfig = Field(default_factory=WorkerConfig)  # type: ignore[arg-type]
    dataplane: DataPlaneConfig = Field(default_factory=DataPlaneConfig)  # type: ignore[arg-type]
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)  # type: ignore[arg-type]
    swarm: SwarmConfig = Field(default_factory=SwarmConfig)  # type: ignore[arg-type]
    api: ApiConfig = Field(default_factory=ApiConfig)  # type: ignore[arg-type]
    verify: VerifyConfig = Field(default_factory=VerifyConfig)  # type: ignore[arg-type]


def _describe_location(loc: tuple[int | str, ...], data: Any) -> tuple[str, str]:
    """Split an error location at its first list index: ``("tasks", "datasets", 2, "weight")`` ->
    ``("tasks.datasets[2] (products)", "weight")``, naming the entry by its ``name`` when it has one.
    Without a list index: ``(dotted key, "")``."""
    where = ""
    node = data
    for at, part in enumerate(loc):
        if isinstance(part, int):
            where += f"[{part}]"
            node = node[part] if isinstance(node, list) and 0 <= part < len(node) else None
            name = node.get("name") if isinstance(node, dict) else None
            if isinstance(name, str):
                where += f" ({name})"
            return where, ".".join(str(p) for p in loc[at + 1 :])
        where = f"{where}.{part}" if where else str(part)
        node = node.get(part) if isinstance(node, dict) else None
    return where, ""


def _format_error(error: ValidationError, data: Any = None) -> str:
    lines = []
    for item in error.errors():
        where, rest = _describe_location(item["loc"], data)
        prefix, key = (f"{where}: ", rest) if rest else ("", where)
        value = item.get("input")
        if item["type"] == "extra_forbidden":
            lines.append(
                f"{prefix}unknown config key '{key}' "
                "(check the spelling; `swarmnode config reference` lists every key)"
            )
        elif item["type"] == "missing":
            lines.append(f"{prefix}missing config key '{key}'")
        elif item["type"] == "value_error":
            lines.append(f"invalid config: {item.get('ctx', {}).get('error', item['msg'])}")
        else:
            lines.append(f"{prefix}invalid config value {key} = {value!r}: {item['msg']}")
    return "\n".join(lines)


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"config key '{dotted}': '{part}' is not a section")
        node = child
    node[parts[-1]] = value


def _parse_env_value(raw: str) -> Any:
    """Env values are TOML literals when they parse as one (numbers, booleans, lists), else strings."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """``SWARMNODE_LEARN__LR=3e-4`` -> ``{"learn.lr": 3e-4}`` (double underscore separates the section)."""
    out: dict[str, Any] = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        dotted = name[len(ENV_PREFIX) :].lower().replace("__", ".")
        out[dotted] = _parse_env_value(raw)
    return out


def load_config(
    path: Path | None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Read ``path`` (may be None or absent), apply env then flag overrides, validate."""
    data: dict[str, Any] = {}
    if path is not None and path.exists():
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    for dotted, value in env_overrides(os.environ if environ is None else environ).items():
        _set_dotted(data, dotted, value)
    for dotted, value in (overrides or {}).items():
        _set_dotted(data, dotted, value)
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        source = f" (from {path})" if path is not None and path.exists() else ""
        raise ConfigError(_format_error(exc, data) + source) from exc


def _toml_key(key: str) -> str:
    return key if key and all(c.isascii() and (c.isalnum() or c in "_-") for c in key) else _toml_value(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, BaseModel):  # a [[tasks.datasets]] entry: an inline table
        value = value.model_dump()
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(str(k))} = {_toml_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


#: Keys whose value, when the config leaves them unset, comes from the model at start
#: (``roles.common.default_max_new_tokens``). ``render_commented_config`` writes them commented out
#: unless set, so a file ``swarmnode init`` wrote does not pin the tiny model's 8 tokens on a chat
#: model named later (its answers were cut at 8 tokens).
DERIVED_WHEN_UNSET = frozenset({("rollout", "max_new_tokens")})


def render_commented_config(config: Config | None = None) -> str:
    """The config as a TOML file with every key's description as a comment; a key of
    ``DERIVED_WHEN_UNSET`` that ``config`` leaves unset is written commented out."""
    config = config or Config()
    lines = [
        "# swarmnode configuration.",
        "# Precedence: this file < environment (SWARMNODE_SECTION__KEY=value) < command-line flags.",
        "",
    ]
    for section_name, field in Config.model_fields.items():
        section = getattr(config, section_name)
        lines.append(f"[{section_name}]")
        for key, sub in type(section).model_fields.items():
            lines.append(f"# {sub.description}")
            unset = (section_name, key) in DERIVED_WHEN_UNSET and key not in section.model_fields_set
            lines.append(f"{'# ' if unset else ''}{key} = {_toml_value(getattr(section, key))}")
        lines.append("")
        del field
    return "\n".join(lines)


def reference_markdown() -> str:
    """A configuration reference table generated from the schema (README embeds it)."""
    rows = ["| key | default | env | description |", "|---|---|---|---|"]
    defaults = Config()
    for section_name in Config.model_fields:
        section = getattr(defaults, section_name)
        for key, sub in type(section).model_fields.items():
            env = f"SWARMNODE_{section_name.upper()}__{key.upper()}"
            default = _toml_value(getattr(section, key))
            rows.append(f"| `{section_name}.{key}` | `{default}` | `{env}` | {sub.description} |")
    return "\n".join(rows)


#: Nodes whose announcement records share one DHT key in a large swarm: ``swarm.announce_buckets``
#: is about N / 64 (README, "In a large swarm"; ``simulations/README.md``, "Gossip at scale").
NODES_PER_ANNOUNCE_BUCKET = 64
#: The least ``swarm.round_demand`` of a large swarm: one failed or refused batch is replaced.
MIN_ROUND_DEMAND = 2
#: Buckets a node reads a round at first in a large swarm: enough with a demand (it reads more
#: while a round's offers fall short of it).
LARGE_SWARM_READ_BUCKETS = 2


@dataclass(frozen=True)
class LargeSwarmSettings:
    """The ``[swarm]`` settings of a swarm of about ``nodes`` nodes (``large_swarm_settings``)."""

    nodes: int
    round_demand: int
    announce_buckets: int
    read_buckets: int
    #: Why ``round_demand`` is what it is, for the comment above it.
    demand_basis: str


def large_swarm_settings(nodes: int, config: Config | None = None) -> LargeSwarmSettings:
    """``swarm.round_demand``, ``announce_buckets`` and ``read_buckets`` for a swarm of about ``nodes``
    nodes, under ``config`` (default: the defaults). README, "In a large swarm":

    - round_demand = max(2, ceil(1.5 x swarm.external_groups / rollout.prompts_per_round)): a
      peer's batch holds its groups of a round; 2 where the node trains on no peer's group
      (``external_groups = 0`` or ``mixing = "none"``);
    - announce_buckets = max(1, ceil(nodes / 64)), the same on every node of the swarm;
    - read_buckets = 2 where there is more than one bucket, else 0 (all).

    Raises ConfigError naming the value for ``nodes < 1``, or a swarm too large for the keys' limits."""
    config = config or Config()
    if nodes < 1:
        raise ConfigError(f"--nodes must be at least 1 (got {nodes})")
    buckets = -(-nodes // NODES_PER_ANNOUNCE_BUCKET)  # ceil
    bucket_limit = _field_limit(SwarmConfig, "announce_buckets")
    if buckets > bucket_limit:
        raise ConfigError(
            f"--nodes {nodes} needs swarm.announce_buckets = {buckets}, above its limit {bucket_limit} "
            f"(at most {bucket_limit * NODES_PER_ANNOUNCE_BUCKET:,} nodes)"
        )
    swarm, per_batch = config.swarm, config.rollout.prompts_per_round
    if swarm.mixing == "none":
        demand = MIN_ROUND_DEMAND
        basis = (
            f'swarm.mixing = "none" trains on no peer\'s group (swarm.external_groups is unused): the least '
            f"demand, {MIN_ROUND_DEMAND}; with a sharing rule, 1.5 x swarm.external_groups / "
            f"rollout.prompts_per_round, at least {MIN_ROUND_DEMAND}"
        )
    elif swarm.external_groups == 0:
        demand = MIN_ROUND_DEMAND
        basis = (
            f"swarm.external_groups = 0 trains on no peer's group: the least demand, {MIN_ROUND_DEMAND} "
            f"(swarm.mixing = {swarm.mixing!r} may still learn from peers' batches)"
        )
    else:
        wanted = -(-3 * swarm.external_groups // (2 * per_batch))  # ceil(1.5 x J / groups per batch)
        demand = max(MIN_ROUND_DEMAND, wanted)
        basis = (
            f"1.5 x swarm.external_groups ({swarm.external_groups}) / rollout.prompts_per_round "
            f"({per_batch}, the groups in a peer's batch) = {1.5 * swarm.external_groups / per_batch:g}, "
            f"rounded up: {wanted}, at least {MIN_ROUND_DEMAND}"
        )
    demand_limit = _field_limit(SwarmConfig, "round_demand")
    if demand > demand_limit:
        raise ConfigError(
            f"swarm.round_demand would be {demand}, above its limit {demand_limit}: swarm.external_groups "
            f"= {swarm.external_groups} is far more than rollout.prompts_per_round = {per_batch}"
        )
    return LargeSwarmSettings(
        nodes=nodes,
        round_demand=demand,
        announce_buckets=max(1, buckets),
        read_buckets=LARGE_SWARM_READ_BUCKETS if buckets > 1 else 0,
        demand_basis=basis,
    )


def _field_limit(model: type[BaseModel], key: str) -> int:
    """The ``le`` bound of an integer field."""
    for item in model.model_fields[key].metadata:
        limit = getattr(item, "le", None)
        if isinstance(limit, int):
            return limit
    raise KeyError(f"{model.__name__}.{key} has no upper bound")


def render_large_swarm(settings: LargeSwarmSettings) -> str:
    """``large_swarm_settings`` as a commented ``[swarm]`` TOML block (``swarmnode config large-swarm``)."""
    n, nodes = settings.nodes, f"{settings.nodes:,} node{'s' if settings.nodes != 1 else ''}"
    header = (
        f"swarmnode config large-swarm --nodes {n}: the [swarm] settings of a swarm of about {nodes} "
        '(README, "In a large swarm"). Merge them into the [swarm] table of swarmnode.toml (a second '
        "[swarm] table is a TOML error), or pass each as --set swarm.KEY=VALUE."
    )
    if settings.announce_buckets == 1:
        header += " A swarm this small also runs well on the defaults (every batch pulled, one key)."
    demand = (
        "Peers' batches pulled a round, drawn fairly over their announcers at the round's end (0 pulls "
        f"every batch announced, which grows with the swarm): {settings.demand_basis}."
    )
    if settings.announce_buckets > 1:
        where = (
            f"ceil({n} / {NODES_PER_ANNOUNCE_BUCKET}), about {NODES_PER_ANNOUNCE_BUCKET} nodes' records a key"
        )
    else:
        where = f"one key holds the records of {nodes} (up to {NODES_PER_ANNOUNCE_BUCKET})"
    buckets = (
        f"DHT keys a round's announcement records are spread over: {where}. It must be the same on "
        "every node of the swarm: a node with another value writes and reads other keys and misses its "
        "peers. The swarm's bootstrap operator publishes it with the bootstrap addresses; no node "
        "chooses it alone."
    )
    if settings.read_buckets:
        read = (
            f"Buckets read a round at first ({settings.read_buckets} is enough with a demand); more "
            "while a round's offers fall short of round_demand."
        )
    else:
        read = "Buckets read a round at first: 0, all of them (there is one)."
    relay = (
        "Relaying stays off with a demand: a node pulls right after the round, before relays list what "
        'they pulled, so relays would only serve retries (README, "In a large swarm").'
    )
    return "\n".join(
        [
            _comment(header),
            "[swarm]",
            _comment(demand),
            f"round_demand = {settings.round_demand}",
            _comment(buckets),
            f"announce_buckets = {settings.announce_buckets}",
            _comment(read),
            f"read_buckets = {settings.read_buckets}",
            _comment(relay),
            "relay = false",
        ]
    )


def _comment(text: str, width: int = 96) -> str:
    return textwrap.fill(text, width, initial_indent="# ", subsequent_indent="# ", break_on_hyphens=False)
