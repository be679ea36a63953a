"""Real checkpoints: a tiny Qwen2 in the Qwen2.5-0.5B-Instruct layout loads offline and samples.

The checkpoint is built here (no download): a byte-level BPE tokenizer trained on a
few strings, with Qwen's special tokens and a ChatML chat template stored in
tokenizer_config.json as Qwen ships it, and a two-layer Qwen2 saved with
``save_pretrained``. It is loaded through ``swarmnode.policy.load_policy`` with the
hub in offline mode and every socket connect refused, from a plain directory and
from a Hugging Face cache snapshot (models--org--name/snapshots/<commit>/).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from swarmnode.config import DEFAULT_SYSTEM_PROMPT
from swarmnode.errors import ModelError
from swarmnode.policy.model import PromptFormat, load_policy, resolve_model_path
from swarmnode.rollout.torch_engine import TorchEngine
from swarmnode.rollout.types import SamplingParams, sequence_logprobs

# Qwen2.5-Instruct's ChatML template, without its tool-calling branches.
CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are Qwen, a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
}
REPO_ID = "swarmnode-test/tiny-qwen2-instruct"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
QUESTION = [{"role": "user", "content": "What is 58+26?"}]
RENDERED = (
    "<|im_start|>system\nYou are Qwen, a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nWhat is 58+26?<|im_end|>\n<|im_start|>assistant\n"
)


def build_qwen_layout(directory: Path) -> None:
    """Write a tiny Qwen2 checkpoint with the files (and tokenizer settings) Qwen2.5-Instruct has."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    corpus = ["You are Qwen, a helpful assistant.", "system user assistant", "What is 58+26? 84", RENDERED]
    bpe.train_from_iterator(corpus * 4, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>", model_max_length=256
    )
    tokenizer.save_pretrained(directory)
    # As Qwen ships it: the template inside tokenizer_config.json, the Qwen2 tokenizer class, no BOS.
    settings = json.loads((directory / "tokenizer_config.json").read_text())
    settings.update(
        tokenizer_class="Qwen2Tokenizer", chat_template=CHAT_TEMPLATE, bos_token=None, errors="replace"
    )
    (directory / "tokenizer_config.json").write_text(json.dumps(settings, indent=2))
    (directory / "chat_template.jinja").unlink(missing_ok=True)

    pad, eos = bpe.token_to_id("<|endoftext|>"), bpe.token_to_id("<|im_end|>")
    config = Qwen2Config(
        vocab_size=bpe.get_vocab_size(),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        bos_token_id=pad,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=pad,
        eos_token_id=[eos, pad],
        pad_token_id=pad,
        do_sample=True,
        temperature=0.7,
        top_p=0.8,
        top_k=20,
        repetition_penalty=1.05,
    )
    model.save_pretrained(directory)


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    directory = tmp_path_factory.mktemp("Qwen2.5-tiny-Instruct")
    build_qwen_layout(directory)
    return directory


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Hub offline (env and the already-imported constant), an empty HF home, and no sockets."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf-home"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise OSError("network access during an offline load")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    yield


def hf_cache_copy(source: Path, cache: Path) -> Path:
    """Lay ``source`` out as the hub cache does: blobs by hash, a snapshot of symlinks, refs/main."""
    repo = cache / ("models--" + REPO_ID.replace("/", "--"))
    snapshot = repo / "snapshots" / COMMIT
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    for file in sorted(source.iterdir()):
        digest = hashlib.sha256(file.read_bytes()).hexdigest()
        shutil.copyfile(file, repo / "blobs" / digest)
        (snapshot / file.name).symlink_to(Path("..", "..", "blobs", digest))
    return snapshot


def test_the_checkpoint_has_the_qwen2_5_instruct_files_with_the_template_in_tokenizer_config(
    qwen_dir: Path,
) -> None:
    assert QWEN_FILES <= {p.name for p in qwen_dir.iterdir()}
    settings = json.loads((qwen_dir / "tokenizer_config.json").read_text())
    assert settings["chat_template"] == CHAT_TEMPLATE
    assert json.loads((qwen_dir / "config.json").read_text())["model_type"] == "qwen2"


def test_load_policy_reads_the_local_qwen2_checkpoint_offline(qwen_dir: Path, offline: None) -> None:
    from safetensors.torch import load_file
    from transformers import Qwen2ForCausalLM

    policy = load_policy(qwen_dir)

    assert isinstance(policy.model, Qwen2ForCausalLM)
    assert policy.model.config.model_type == "qwen2"
    assert type(policy.tokenizer).__name__ == "Qwen2Tokenizer"
    assert policy.tokenizer.convert_ids_to_tokens(policy.eos_token_id) == "<|im_end|>"
    assert policy.bos_token_id is None  # Qwen has no BOS: prompts are not prefixed
    assert policy.model_id == qwen_dir.name
    saved = load_file(str(qwen_dir / "model.safetensors"))
    assert torch.equal(
        policy.model.state_dict()["model.layers.1.mlp.down_proj.weight"],
        saved["model.layers.1.mlp.down_proj.weight"],
    )


def test_the_chat_template_from_tokenizer_config_renders_chatml(qwen_dir: Path, offline: None) -> None:
    policy = load_policy(qwen_dir)
    text = str(policy.tokenizer.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True))
    assert text == RENDERED
    # The node asks the question through that template. With no system turn of ours, the prompt is
    # exactly Qwen's rendering (its template then adds its own default system turn).
    policy.prompt_format = PromptFormat(system_prompt="")
    ids = policy.encode_prompt(QUESTION[0]["content"])
    # Special tokens in the rendered text are single tokens, not spelled out byte by byte.
    start = policy.tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert isinstance(start, int)
    assert ids.count(start) == 3
    assert policy.tokenizer.decode(ids) == RENDERED
    # With the default system prompt, ours replaces Qwen's.
    policy.prompt_format = PromptFormat()
    asked = policy.tokenizer.decode(policy.encode_prompt(QUESTION[0]["content"]))
    assert asked == RENDERED.replace("You are Qwen, a helpful assistant.", DEFAULT_SYSTEM_PROMPT)


def test_the_torch_engine_samples_from_the_qwen2_checkpoint_with_exact_logprobs(
    qwen_dir: Path, offline: None
) -> None:
    policy = load_policy(qwen_dir)
    prompt = str(policy.tokenizer.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True))
    params = SamplingParams(temperature=0.7, max_new_tokens=6)

    result = TorchEngine(policy).generate([prompt], 3, params, torch.Generator().manual_seed(0))

    assert len(result.completions[0]) == 3
    prompt_ids = result.prompt_ids[0]
    for completion in result.completions[0]:
        assert 1 <= len(completion.token_ids) <= 6
        with torch.inference_mode():
            logits = policy.model(input_ids=torch.tensor([prompt_ids + completion.token_ids])).logits[0]
        scores = logits[len(prompt_ids) - 1 : len(prompt_ids) - 1 + len(completion.token_ids)]
        expected = sequence_logprobs(scores, torch.tensor(completion.token_ids), params)
        assert torch.allclose(torch.tensor(completion.logprobs), expected, atol=1e-4)


def test_a_hub_cache_snapshot_loads_offline_by_path_by_repo_folder_and_by_repo_id(
    qwen_dir: Path, tmp_path: Path, offline: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import snapshot_download

    cache = tmp_path / "hub"
    snapshot = hf_cache_copy(qwen_dir, cache)

    by_path = load_policy(snapshot)
    by_repo_folder = load_policy(cache / ("models--" + REPO_ID.replace("/", "--")))  # refs/main -> snapshot
    resolved = Path(snapshot_download(REPO_ID, cache_dir=cache, local_files_only=True))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    by_repo_id = load_policy(REPO_ID)

    assert resolved == snapshot
    assert resolve_model_path(REPO_ID) == snapshot
    assert os.path.islink(snapshot / "model.safetensors")
    for name, tensor in by_path.model.state_dict().items():
        assert torch.equal(tensor, by_repo_id.model.state_dict()[name])
        assert torch.equal(tensor, by_repo_folder.model.state_dict()[name])
    assert (
        by_path.tokenizer.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
        == RENDERED
    )


def test_a_repo_id_missing_from_the_cache_is_a_clear_error_never_a_download(
    offline: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(ModelError, match="download it first"):
        load_policy(REPO_ID)
