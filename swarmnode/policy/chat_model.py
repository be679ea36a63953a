"""The built-in chat model: a small Qwen2 that goes through exactly what a Qwen2.5-Instruct would.

Owns
    The packaged model config and tokenizer (``swarmnode/policy/chatml/``: a byte-level BPE
    tokenizer trained with ``tokenizers`` on reasoning-gym text, ChatML template, ``<|im_end|>``
    as EOS), rebuilding that tokenizer from its corpus (``python -m swarmnode.policy.chat_model
    --write``; a test checks the rebuild is byte-identical), and building the model with random
    weights, deterministic in a seed (``build_chat_policy``). With it a node runs the real-model
    path with no download: an HF directory, ``AutoTokenizer``, the chat template, BPE
    re-tokenization of peers' text, answers inside ``<answer></answer>``.
Must not
    Train (``warmstart`` does, with ``builtin="chat"``) or know about peers.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import tempfile
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from swarmnode.config import DEFAULT_SYSTEM_PROMPT
from swarmnode.errors import ModelError
from swarmnode.policy.chat import build_chat_tokenizer
from swarmnode.policy.model import MODEL_ID_CONFIG_KEY, Policy

CHAT_MODEL_ID = "swarmnode-chat"
PACKAGE_DIR = "chatml"
#: The most tokens the trainer may make (256 bytes, 3 specials, merges). The corpus is templated
#: questions, so merges run out first: 406 tokens, the packaged config's vocab_size.
VOCAB_SIZE = 1024
#: reasoning-gym families (name, config) whose questions and answers the tokenizer is trained on:
#: the arithmetic the built-in models learn, in their question wording.
CORPUS_FAMILIES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("chain_sum", {"min_terms": 2, "max_terms": 4, "min_digits": 1, "max_digits": 3}),
    ("basic_arithmetic", {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}),
    ("products", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}),
    ("decimal_chain_sum", {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}),
)
CORPUS_PER_FAMILY = 400
CHAT_ROLES = ("system\n", "user\n", "assistant\n")
CORPUS_SEED = 0


def chat_tokenizer_corpus() -> Iterator[str]:
    """What the packaged tokenizer is trained on: each corpus family's questions and tagged
    answers (reasoning-gym, fixed seed), ChatML's role names, and the default system prompt."""
    import reasoning_gym

    for name, config in CORPUS_FAMILIES:
        for entry in reasoning_gym.create_dataset(name, size=CORPUS_PER_FAMILY, seed=CORPUS_SEED, **config):
            yield str(entry["question"])
            yield f"<answer>{entry['answer']}</answer>"
            yield from CHAT_ROLES  # the template's role names, so each is one token
    yield DEFAULT_SYSTEM_PROMPT


def train_chat_tokenizer() -> PreTrainedTokenizerBase:
    """The packaged tokenizer, trained again from ``chat_tokenizer_corpus``."""
    return build_chat_tokenizer(chat_tokenizer_corpus(), VOCAB_SIZE)


def _package_file(name: str) -> str:
    return resources.files("swarmnode.policy").joinpath(f"{PACKAGE_DIR}/{name}").read_text(encoding="utf-8")


def chat_config_dict() -> dict[str, Any]:
    """The packaged config (``swarmnode/policy/chatml/config.json``): Qwen2, about 1.2 M parameters."""
    value = json.loads(_package_file("config.json"))
    if not isinstance(value, dict):
        raise ModelError(f"swarmnode/policy/{PACKAGE_DIR}/config.json must hold a JSON object")
    return value


def chat_tokenizer_sha256() -> str:
    """SHA-256 of the packaged ``tokenizer.json`` (what a warm start's cache key names)."""
    return hashlib.sha256(_package_file("tokenizer.json").encode("utf-8")).hexdigest()


def load_chat_tokenizer() -> PreTrainedTokenizerBase:
    """The packaged tokenizer, loaded with ``AutoTokenizer`` as any HF checkpoint's is."""
    with resources.as_file(resources.files("swarmnode.policy").joinpath(PACKAGE_DIR)) as folder:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def build_chat_policy(seed: int) -> Policy:
    """The built-in chat model with random weights, deterministic in ``seed``."""
    tokenizer = load_chat_tokenizer()
    values = chat_config_dict()
    model_type = values.pop("model_type")
    config = AutoConfig.for_model(model_type, **values)
    if config.vocab_size != len(tokenizer):
        raise ModelError(f"chat model vocab_size {config.vocab_size} != tokenizer size {len(tokenizer)}")
    setattr(config, MODEL_ID_CONFIG_KEY, CHAT_MODEL_ID)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    model.eval()
    return Policy(model=model, tokenizer=tokenizer, model_id=CHAT_MODEL_ID, version=0)


def write_tokenizer(folder: Path) -> None:
    """Train the tokenizer and write its files (``tokenizer.json``, ``tokenizer_config.json``,
    ``chat_template.jinja``) into ``folder``, replacing those there."""
    tokenizer = train_chat_tokenizer()
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        for path in Path(tmp).iterdir():
            shutil.copyfile(path, folder / path.name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--write", type=Path, help="train the tokenizer and write its files into this folder")
    args = parser.parse_args(argv)
    if args.write is None:
        parser.error("nothing to do: give --write FOLDER (the package's is swarmnode/policy/chatml)")
    write_tokenizer(args.write)
    print(f"wrote the chat tokenizer to {args.write}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
