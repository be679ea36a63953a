"""Reproducible supervised warm start of the built-in tiny model, cached under the node home.

Owns: a short supervised pass on task demonstrations (``prompt`` -> ``answer``
``<eos>``, loss on the answer and EOS tokens only; AdamW lr 1e-3, batch 128) so
that RL starts well above zero accuracy and well below the ceiling. It stops by
evaluation, not by step count (DESIGN.md "Learnability": the 2-digit half of
chain_sum appears suddenly, so a fixed step count lands on either side of it):
every ``eval_every`` steps it measures greedy accuracy on "hard" tasks (an
operand of two or more digits) and stops once that reaches ``target_accuracy``,
or at ``max_steps``. The result is saved atomically to
``home/models/tiny-warm-<hash of every setting>/`` with ``warmstart.json``
(settings, steps, time, accuracies); a second call with the same settings
returns that directory at once.

Determinism: the model init, the data stream and the optimizer are functions of
``seed`` and the mixture, so the same settings give the same weights on the same
machine and thread count (float summation order can differ across thread counts).
Must not: run RL or touch the network.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from swarmnode.errors import ModelError
from swarmnode.policy.chat_model import build_chat_policy, chat_config_dict, chat_tokenizer_sha256
from swarmnode.policy.evaluate import evaluate_accuracy
from swarmnode.policy.model import Policy, build_tiny_policy, load_policy, save_policy, tiny_config_dict
from swarmnode.policy.tokenizer import DEFAULT_ALPHABET
from swarmnode.rollout.torch_engine import TorchEngine
from swarmnode.tasks import Task, TaskMixture
from swarmnode.tasks.scoring import ANSWER_CLOSE, ANSWER_OPEN
from swarmnode.train.batch import shared_prefix_logprobs

#: Bump when the procedure changes in a way that changes its result (invalidates caches).
WARM_START_FORMAT = 1
#: The built-in models (``model.builtin``).
Builtin = Literal["tiny", "chat"]
#: New tokens a chat answer may take in the warm start's evaluations (``<answer>`` ... ``</answer>``
#: and EOS around the digits).
CHAT_ANSWER_TOKENS = 24
#: Tokens per packed sequence in the chat warm start (``_shared_prefix_loss``): attention costs the
#: square of a pack's length, so with a 1 M model long packs cost more than the shared prefix saves
#: (2,048: 1.6 CPU s a step of 128 against 1.1 unshared; measured with other work beside it).
WARM_START_PACK_TOKENS = 320
INFO_FILE = "warmstart.json"
_MULTI_DIGIT = re.compile(r"\d{2,}")


@dataclass(frozen=True)
class WarmStartSettings:
    """Everything that decides the warm-started weights (hashed into the cache directory name)."""

    lr: float = 1e-3
    batch_size: int = 128
    weight_decay: float = 0.01
    max_steps: int = 1500
    eval_every: int = 25
    eval_tasks: int = 200
    target_accuracy: float = 0.12  # greedy accuracy on hard tasks that ends the pass
    heldout_tasks: int = 200


#: A specialist's warm start (``tasks.warm_start_datasets``, the specialists of ``swarmnode swarm``):
#: one small family learnt to mastery. The default target (12% on hard tasks) is for the 1-2 digit
#: chain_sum, whose RL has room to climb; a 1-digit family has no hard tasks, so the target applies
#: to all of them, and 12% would stop a specialist long before it knows its family.
SPECIALIST_WARM_START = WarmStartSettings(max_steps=1000, target_accuracy=0.95)


def is_hard(task: Task) -> bool:
    """A task whose prompt has an operand of two or more digits (the half that is learnt late)."""
    return _MULTI_DIGIT.search(task.prompt.split("=", 1)[0]) is not None


def _mixture_description(mixture: TaskMixture) -> dict[str, Any]:
    return {
        "seed": mixture.seed,
        "specs": [
            {"name": s.name, "config": s.config, "weight": s.weight, "prompt_format": s.prompt_format}
            for s in mixture.specs
        ],
    }


def _settings_description(
    mixture: TaskMixture,
    seed: int,
    settings: WarmStartSettings,
    model_overrides: Mapping[str, Any] | None = None,
    builtin: Builtin = "tiny",
) -> dict[str, Any]:
    description: dict[str, Any] = {
        "format": WARM_START_FORMAT,
        # Without overrides this is the packaged config, so existing cache keys are unchanged.
        "model": {**tiny_config_dict(), **(model_overrides or {})},
        "alphabet": DEFAULT_ALPHABET,
        "mixture": _mixture_description(mixture),
        "seed": seed,
        "settings": asdict(settings),
        # Float reductions (and so the weights and the stopping step) depend on the thread count.
        "torch_threads": torch.get_num_threads(),
    }
    if builtin == "chat":  # the tiny model's keys stay as they were
        description["builtin"] = "chat"
        description["model"] = chat_config_dict()
        description["tokenizer_sha256"] = chat_tokenizer_sha256()
        del description["alphabet"]
    return description


def warm_start_dir(
    home: Path,
    mixture: TaskMixture,
    seed: int,
    settings: WarmStartSettings | None = None,
    model_overrides: Mapping[str, Any] | None = None,
    builtin: Builtin = "tiny",
) -> Path:
    """Where ``warm_start`` caches its result for these settings."""
    description = _settings_description(
        mixture, seed, settings or WarmStartSettings(), model_overrides, builtin
    )
    digest = hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()[:12]
    return Path(home) / "models" / f"{builtin}-warm-{digest}"


def read_warm_start_info(path: Path) -> dict[str, Any]:
    """The ``warmstart.json`` written beside a warm-started model."""
    try:
        value = json.loads((Path(path) / INFO_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelError(f"no readable warm-start record in {path}: {exc}") from exc
    if not isinstance(value, dict):
        raise ModelError(f"warm-start record in {path} is not a JSON object")
    return value


def _encode_example(policy: Policy, task: Task) -> tuple[list[int], int]:
    """(prompt + answer + eos token ids, number of prompt tokens). A chat policy's answer is the
    tagged one its system prompt asks for (``<answer>84</answer>``), the tiny model's bare."""
    prompt = policy.encode_prompt(task.prompt)
    answer_text = str(task.entry["answer"])
    if policy.chat_prompts:
        answer_text = f"{ANSWER_OPEN}{answer_text}{ANSWER_CLOSE}"
    answer = policy.tokenizer(answer_text, add_special_tokens=False)["input_ids"]
    ids = [*prompt, *answer, policy.eos_token_id]
    unk = policy.tokenizer.unk_token_id
    if unk is not None and unk in ids:
        raise ModelError(
            f"task {task.id.key()} ({task.prompt!r} -> {task.entry['answer']!r}) has characters outside the "
            f"tiny model's alphabet {DEFAULT_ALPHABET!r}; warm start needs a compact arithmetic mixture"
        )
    return ids, len(prompt)


def _batch(policy: Policy, tasks: list[Task]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded input ids and labels (-100 on prompt and padding: loss on answer + EOS only)."""
    examples = [_encode_example(policy, task) for task in tasks]
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), policy.pad_token_id, dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    for row, (ids, prompt_len) in enumerate(examples):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, prompt_len : len(ids)] = torch.tensor(ids[prompt_len:])
    return input_ids, labels


def _shared_prefix_loss(policy: Policy, tasks: list[Task]) -> torch.Tensor:
    """The same loss as ``_batch``'s (mean cross-entropy over the answer and EOS tokens), with the
    prompt tokens every example shares (a chat prompt's system turn and user header: about 45 of
    its 65 tokens under the default system prompt) run once per pack instead of once per example
    (``train.batch``'s shared-prefix forward)."""
    examples = [_encode_example(policy, task) for task in tasks]
    # The prompts' common prefix, less at least one prompt token (a completion's first token is
    # scored from the prompt's last position).
    columns = zip(*(ids for ids, _ in examples), strict=False)  # position by position, to the shortest
    common = next((i for i, column in enumerate(columns) if len(set(column)) > 1), len(examples[0][0]))
    prefix = min(common, *(prompt_len - 1 for _, prompt_len in examples))
    shared = examples[0][0][:prefix]
    rests = [ids[prefix:] for ids, _ in examples]
    logp, mask = shared_prefix_logprobs(
        policy.model,
        [shared] * len(rests),
        rests,
        pad_token_id=policy.pad_token_id,
        pack_tokens=WARM_START_PACK_TOKENS,
    )
    answer = torch.zeros_like(mask)
    for row, (ids, prompt_len) in enumerate(examples):
        answer[row, prompt_len - prefix : len(ids) - prefix] = 1.0
    return -(logp * answer).sum() / answer.sum()


def _eval_tasks(mixture: TaskMixture, seed: int, count: int) -> list[Task]:
    """``count`` hard tasks from a stream of their own (all tasks if the mixture has no hard ones)."""
    pool = mixture.sample(0, 4 * count, stream=f"warmstart-eval:{seed}")
    hard = [task for task in pool if is_hard(task)]
    return (hard or pool)[:count]


def warm_start(
    home: Path,
    mixture: TaskMixture,
    seed: int,
    progress: Callable[[str], None] | None = None,
    *,
    settings: WarmStartSettings | None = None,
    model_overrides: Mapping[str, Any] | None = None,
    builtin: Builtin = "tiny",
) -> Path:
    """Warm-start a built-in model on ``mixture`` (cached); returns the saved model directory.

    ``builtin``: the tiny model, or the chat model (``chat_model``: asked through its chat
    template with the default system prompt, taught to answer inside ``<answer></answer>``).
    ``model_overrides`` warm-start a variant of the tiny config instead (``build_tiny_policy``)."""
    settings = settings or WarmStartSettings()
    if builtin == "chat" and model_overrides:
        raise ModelError("model_overrides apply to the tiny model only")
    target = warm_start_dir(home, mixture, seed, settings, model_overrides, builtin)
    if (target / INFO_FILE).is_file():
        return target
    say = progress or (lambda _message: None)
    started = time.perf_counter()
    policy = build_chat_policy(seed) if builtin == "chat" else build_tiny_policy(seed, model_overrides)
    answer_tokens = CHAT_ANSWER_TOKENS if builtin == "chat" else 8
    model = policy.model
    engine = TorchEngine(policy)
    eval_set = _eval_tasks(mixture, seed, settings.eval_tasks)
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    stream = f"warmstart:{seed}"
    step, loss_value, hard_accuracy, stopped_by = 0, float("nan"), 0.0, "max_steps"
    model.train()
    while step < settings.max_steps:
        tasks = mixture.sample(step, settings.batch_size, stream=stream)
        if policy.chat_prompts:
            loss = _shared_prefix_loss(policy, tasks)
        else:
            input_ids, labels = _batch(policy, tasks)
            loss = model(input_ids=input_ids, labels=labels).loss  # type: ignore[operator]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        step += 1
        loss_value = float(loss.detach())
        if step % settings.eval_every == 0 or step == settings.max_steps:
            model.eval()
            hard_accuracy = evaluate_accuracy(
                policy, eval_set, engine, greedy=True, max_new_tokens=answer_tokens
            )
            model.train()
            say(
                f"warm start step {step}: loss {loss_value:.3f}, "
                f"hard-task greedy accuracy {hard_accuracy:.1%}"
            )
            if hard_accuracy >= settings.target_accuracy:
                stopped_by = "target"
                break
    model.eval()
    train_seconds = time.perf_counter() - started
    heldout = mixture.heldout(settings.heldout_tasks)
    greedy = evaluate_accuracy(policy, heldout, engine, greedy=True, max_new_tokens=answer_tokens)
    sampled = evaluate_accuracy(
        policy,
        heldout,
        engine,
        greedy=False,
        temperature=1.0,
        max_new_tokens=answer_tokens,
        generator=torch.Generator().manual_seed(seed),
    )
    info = {
        "settings": _settings_description(mixture, seed, settings, model_overrides, builtin),
        "steps": step,
        "stopped_by": stopped_by,
        "train_seconds": round(train_seconds, 3),
        "final_loss": loss_value,
        "hard_greedy_accuracy": hard_accuracy,
        "heldout": {"count": len(heldout), "greedy_accuracy": greedy, "sampled_t1_accuracy": sampled},
        "parameters": sum(p.numel() for p in model.parameters()),
        "threads": torch.get_num_threads(),
    }
    save_policy(policy, target, extra_files={INFO_FILE: json.dumps(info, indent=2, sort_keys=True)})
    say(
        f"warm start done in {train_seconds:.1f} s ({step} steps, {stopped_by}): held-out accuracy "
        f"greedy {greedy:.1%}, sampled T=1 {sampled:.1%}; saved to {target}"
    )
    return target


def load_warm_started(
    home: Path, mixture: TaskMixture, seed: int, progress: Callable[[str], None] | None = None
) -> Policy:
    """``warm_start`` then ``load_policy`` of its result."""
    return load_policy(warm_start(home, mixture, seed, progress))
