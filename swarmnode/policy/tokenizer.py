"""Character-level tokenizer for the built-in tiny model, in real Hugging Face format.

Owns: building a ``PreTrainedTokenizerFast`` whose ``tokenizer.json`` round-trips
through ``save_pretrained`` / ``AutoTokenizer.from_pretrained``. One token per
character of a fixed alphabet, plus four special tokens with fixed ids.
Must not: know about models or tasks; it never adds BOS/EOS by itself (the
``Policy`` decides where they go, the same way for every HF tokenizer).
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from swarmnode.errors import ModelError

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
#: Special tokens and their fixed ids (the tiny model's config repeats these ids).
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK)

#: What the tiny model reads and writes: compact arithmetic prompts such as ``58+26=``
#: and signed integer answers. Ids: specials 0-3, then these characters in order.
DEFAULT_ALPHABET = "0123456789+-*/=(). "


def build_char_tokenizer(alphabet: str = DEFAULT_ALPHABET) -> PreTrainedTokenizerFast:
    """A char-level tokenizer: ``<pad>``=0 ``<bos>``=1 ``<eos>``=2 ``<unk>``=3, then ``alphabet``.

    Characters outside the alphabet encode to ``<unk>`` (one per character).
    """
    if not alphabet:
        raise ModelError("a character tokenizer needs a non-empty alphabet")
    if len(set(alphabet)) != len(alphabet):
        raise ModelError(f"tokenizer alphabet {alphabet!r} repeats a character")
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS)}
    for char in alphabet:
        if char in vocab:
            raise ModelError(f"tokenizer alphabet character {char!r} collides with a special token")
        vocab[char] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # Every character (newline included) is its own pre-token, so WordLevel maps
    # each one to its id or to <unk>; Fuse joins decoded characters with no separator.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        clean_up_tokenization_spaces=False,
        model_max_length=1_000_000,
    )
