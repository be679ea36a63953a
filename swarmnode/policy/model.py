"""The policy: a Hugging Face causal LM plus its tokenizer, loaded and saved in HF format.

Owns: loading any local HF causal LM directory (``AutoModelForCausalLM`` +
``AutoTokenizer``, never the network), saving one atomically (safetensors via
``save_pretrained``, temp dir, fsync, rename), building the built-in tiny model
from the package config, and the prompt/completion encoding rule every engine uses.
Must not: train, sample or know about tasks.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
import uuid
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

# A node tokenizes a handful of short texts at a time (a group's completions): the tokenizers
# library's thread pool costs ~3x the CPU of encoding them in the calling thread (62 vs 22 us for a
# group of 8 on 2 cores) and competes with torch's threads. Set before tokenizers is first used; an
# explicit setting in the environment wins.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from swarmnode.config import DEFAULT_SYSTEM_PROMPT
from swarmnode.errors import ModelError
from swarmnode.policy.chat import has_chat_template, render_chat_prompt
from swarmnode.policy.lora import adapter_config, adapter_state_dict, has_lora, plain_copy
from swarmnode.policy.tokenizer import DEFAULT_ALPHABET, build_char_tokenizer
from swarmnode.wire import system_prompt_id

TINY_MODEL_ID = "swarmnode-tiny"
#: Prompts a policy keeps tokenized (a round's prompts and its peers' re-derived ones).
PROMPT_CACHE = 4096
#: Attribute saved into config.json so a reloaded policy keeps its model id.
MODEL_ID_CONFIG_KEY = "swarmnode_model_id"

# What from_pretrained/save_pretrained raise on a missing, partial or foreign directory.
_LOAD_ERRORS = (OSError, ValueError, KeyError, TypeError, RuntimeError, AttributeError, json.JSONDecodeError)


@dataclass(frozen=True)
class PromptFormat:
    """How a task's question becomes a prompt (``rollout.chat_template``, ``rollout.system_prompt``).

    With ``chat_template`` on and a tokenizer that has one, the question is the user turn of a
    chat, after ``system_prompt`` (no system turn when empty), and the assistant turn is opened
    (``swarmnode.policy.chat``); otherwise the prompt is ``[bos] + question``."""

    chat_template: bool = True
    system_prompt: str = DEFAULT_SYSTEM_PROMPT


@dataclass
class Policy:
    """A causal LM, its tokenizer, a model id (names the weights' lineage), a version counter and
    the rule that turns a question into prompt tokens."""

    model: nn.Module
    tokenizer: PreTrainedTokenizerBase
    model_id: str
    version: int = 0
    prompt_format: PromptFormat = field(default_factory=PromptFormat)
    #: Prompts already rendered and tokenized (a chat template renders in ~0.1-0.3 ms, a bare
    #: prompt's tokenizer call takes ~0.1 ms, and every admitted peer group re-derives its prompt:
    #: in the specialists simulator each prompt is encoded four times a round): (tokenizer,
    #: format, question) -> ids, bounded.
    _prompt_ids: OrderedDict[tuple[int, PromptFormat, str], array[int]] = field(
        default_factory=OrderedDict, repr=False, compare=False
    )

    @property
    def chat_prompts(self) -> bool:
        """Are prompts rendered through the tokenizer's chat template?"""
        return self.prompt_format.chat_template and has_chat_template(self.tokenizer)

    @property
    def system_prompt_sha256(self) -> bytes:
        """What this policy's rollout groups carry as ``system_prompt_sha256`` (SPEC.md 1.3): empty
        for bare question prompts, ``system_prompt_id`` of the system turn for chat prompts."""
        return system_prompt_id(self.prompt_format.system_prompt) if self.chat_prompts else b""

    @property
    def bos_token_id(self) -> int | None:
        value = self.tokenizer.bos_token_id
        return int(value) if value is not None else None

    @property
    def eos_token_id(self) -> int:
        value = self.tokenizer.eos_token_id
        if value is None:
            generation_config = getattr(self.model, "generation_config", None)
            value = getattr(generation_config, "eos_token_id", None)
            if isinstance(value, list):
                value = value[0] if value else None
        if value is None:
            raise ModelError(
                f"policy {self.model_id!r} has no EOS token; its tokenizer must define eos_token"
            )
        return int(value)

    @property
    def pad_token_id(self) -> int:
        value = self.tokenizer.pad_token_id
        return int(value) if value is not None else self.eos_token_id

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def encode_prompt(self, text: str) -> list[int]:
        """The prompt tokens for question ``text``.

        With ``chat_prompts``: the chat template's rendering (``render_chat_prompt``) tokenized as
        is; the template writes every special token the model expects (Llama 3's BOS included), so
        none is added. Otherwise ``[bos] + tokens`` when the tokenizer has a BOS token, else the
        tokens alone. Special tokens are never added by the tokenizer itself, so HF tokenizers
        that add BOS in a post-processor and ones that do not end up with the same rule.
        """
        key = (id(self.tokenizer), self.prompt_format, text)
        cached = self._prompt_ids.pop(key, None)  # least recently used first out (never raises)
        if cached is None:
            # array: 4 bytes a token, not a tuple's 8 plus 28 per id object above 256 (4,096
            # prompts under a 4,096-character system prompt held 394 MiB as tuples; red team)
            cached = array("i", self._tokenize_prompt(text))
            if not cached:
                raise ModelError(f"policy {self.model_id!r} encodes prompt {text!r} to no tokens")
        self._prompt_ids[key] = cached
        if len(self._prompt_ids) > PROMPT_CACHE:
            self._prompt_ids.popitem(last=False)
        return list(cached)

    def _tokenize_prompt(self, text: str) -> list[int]:
        if self.chat_prompts:
            rendered = render_chat_prompt(
                self.tokenizer, text, self.prompt_format.system_prompt, model_id=self.model_id
            )
            return list(self.tokenizer(rendered, add_special_tokens=False)["input_ids"])
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        bos = self.bos_token_id
        return ids if bos is None else [bos, *ids]

    def decode_completion(self, ids: Sequence[int]) -> str:
        """The text of a completion: everything before the first EOS, special tokens skipped."""
        return self.decode_completions([ids])[0]

    def decode_completions(self, rows: Iterable[Sequence[int]]) -> list[str]:
        """``decode_completion`` of each row (the EOS id looked up once: ~8 us a lookup through the
        tokenizer, as much as a short row's decode)."""
        eos = self.eos_token_id
        texts = []
        for ids in rows:
            ids = list(ids)
            if eos in ids:
                ids = ids[: ids.index(eos)]
            texts.append(str(self.tokenizer.decode(ids, skip_special_tokens=True)))
        return texts


def resolve_model_path(spec: str | os.PathLike[str]) -> Path:
    """Where a model spec points: a directory as is; a Hugging Face cache repo folder
    (``models--org--name``, with ``refs/main``) -> its current snapshot; ``org/name`` that is
    not a local path -> its snapshot in the local HF cache (offline: never downloads)."""
    path = Path(spec).expanduser()
    ref = path / "refs" / "main"
    if ref.is_file():
        return path / "snapshots" / ref.read_text().strip()
    if path.exists() or str(spec).count("/") != 1 or str(spec).startswith((".", "/", "~")):
        return path
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(str(spec), local_files_only=True))
    except LocalEntryNotFoundError as exc:
        raise ModelError(
            f"model {spec!r} is neither a local directory nor in the Hugging Face cache; "
            "download it first (e.g. `huggingface-cli download " + str(spec) + "`) or give a path"
        ) from exc


def load_policy(
    path: str | os.PathLike[str], *, version: int = 0, dtype: torch.dtype = torch.float32
) -> Policy:
    """Load a local HF causal-LM directory (``local_files_only``).

    Raises ``ModelError`` naming the path on any failure.
    """
    directory = resolve_model_path(path)
    if not directory.is_dir():
        raise ModelError(
            f"no model directory at {directory}: expected config.json, weights and tokenizer files"
        )
    try:
        with _quiet_progress_bars():
            tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, local_files_only=True)
    except _LOAD_ERRORS as exc:
        raise ModelError(f"cannot load a causal LM + tokenizer from {directory}: {exc}") from exc
    model.eval()
    model_id = getattr(model.config, MODEL_ID_CONFIG_KEY, None) or directory.name
    return Policy(model=model, tokenizer=tokenizer, model_id=str(model_id), version=version)


@contextmanager
def _quiet_progress_bars() -> Iterator[None]:
    """Hide transformers' per-call shard progress bars (a node saves often; they are noise)."""
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _fsync_tree(directory: Path) -> None:
    for root, _dirs, files in os.walk(directory):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(root))


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_policy(
    policy: Policy, path: str | os.PathLike[str], *, extra_files: Mapping[str, str] | None = None
) -> None:
    """Write ``policy`` to ``path`` atomically: safetensors weights, config, tokenizer.

    The directory is written under a temporary name beside ``path``, fsynced and
    renamed into place, so a reader sees either the old directory or the complete
    new one. ``extra_files`` (name -> text) are written into the same directory
    before the rename (e.g. warm-start metadata). A model training LoRA adapters is
    saved merged, as the plain model other tools load (``save_adapter``: the adapter alone).
    """

    def fill(staging: Path) -> None:
        model = plain_copy(policy.model) if has_lora(policy.model) else policy.model
        setattr(model.config, MODEL_ID_CONFIG_KEY, policy.model_id)
        with _quiet_progress_bars():
            model.save_pretrained(staging)  # type: ignore[operator]
        policy.tokenizer.save_pretrained(staging)

    _write_directory(Path(path), fill, extra_files, "the policy")


def save_adapter(
    policy: Policy,
    path: str | os.PathLike[str],
    *,
    base_model: str = "",
    extra_files: Mapping[str, str] | None = None,
) -> None:
    """Write ``policy``'s LoRA adapter alone to ``path`` (atomically, as ``save_policy``) in peft's
    format, ``adapter_config.json`` and ``adapter_model.safetensors``, with the tokenizer:
    ``PeftModel.from_pretrained(base, path)`` loads it onto the model the node started from
    (``base_model``, recorded as the config's ``base_model_name_or_path``)."""
    from safetensors.torch import save_file

    def fill(staging: Path) -> None:
        config = copy.deepcopy(adapter_config(policy.model))
        config.base_model_name_or_path = base_model
        config.save_pretrained(str(staging))
        save_file(adapter_state_dict(policy.model), str(staging / "adapter_model.safetensors"))
        policy.tokenizer.save_pretrained(staging)

    _write_directory(Path(path), fill, extra_files, "the adapter")


def _write_directory(
    target: Path, fill: Callable[[Path], None], extra_files: Mapping[str, str] | None, what: str
) -> None:
    """Create ``target`` atomically: ``fill`` writes a staging directory beside it (plus
    ``extra_files``), which is fsynced and renamed into place (replacing an old ``target``)."""
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=parent))
    except OSError as exc:
        raise ModelError(f"cannot create a directory to save {what} at {target}: {exc}") from exc
    try:
        fill(staging)
        for name, text in (extra_files or {}).items():
            if Path(name).name != name:
                raise ModelError(f"extra file name {name!r} must be a plain file name")
            (staging / name).write_text(text, encoding="utf-8")
        _fsync_tree(staging)
        if target.exists():
            # A non-empty directory cannot be renamed over; move the old one aside first.
            retired = parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(target, retired)
            os.replace(staging, target)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.replace(staging, target)
        _fsync_dir(parent)
    except _LOAD_ERRORS as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise ModelError(f"cannot save {what} to {target}: {exc}") from exc
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def tiny_config_dict() -> dict[str, Any]:
    """The packaged tiny model config (``swarmnode/policy/tiny/config.json``)."""
    text = resources.files("swarmnode.policy").joinpath("tiny/config.json").read_text(encoding="utf-8")
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ModelError("swarmnode/policy/tiny/config.json must hold a JSON object")
    return value


def build_tiny_policy(seed: int, overrides: Mapping[str, Any] | None = None) -> Policy:
    """The built-in tiny Llama (about 1 M parameters) with random weights, deterministic in ``seed``.

    ``overrides`` replace keys of the packaged config (e.g. ``hidden_size``, ``num_hidden_layers``) to
    build a smaller or larger variant with the same tokenizer (heterogeneous swarms in simulations)."""
    settings = {**tiny_config_dict(), **(overrides or {})}
    model_type = settings.pop("model_type")
    config = AutoConfig.for_model(model_type, **settings)
    tokenizer = build_char_tokenizer(DEFAULT_ALPHABET)
    if config.vocab_size != len(tokenizer):
        raise ModelError(
            f"tiny config vocab_size {config.vocab_size} != tokenizer size {len(tokenizer)}; "
            "update swarmnode/policy/tiny/config.json together with DEFAULT_ALPHABET"
        )
    # fork_rng: building a policy must not move the caller's global RNG stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.eval()
    return Policy(model=model, tokenizer=tokenizer, model_id=TINY_MODEL_ID, version=0)
