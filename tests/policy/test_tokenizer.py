"""The tiny model's char tokenizer: fixed special ids, lossless round trip, real HF format."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from swarmnode.errors import ModelError
from swarmnode.policy.tokenizer import DEFAULT_ALPHABET, build_char_tokenizer


def test_special_tokens_have_the_contract_ids() -> None:
    tokenizer = build_char_tokenizer()
    assert (
        tokenizer.pad_token_id,
        tokenizer.bos_token_id,
        tokenizer.eos_token_id,
        tokenizer.unk_token_id,
    ) == (
        0,
        1,
        2,
        3,
    )
    assert len(tokenizer) == 4 + len(DEFAULT_ALPHABET)


def test_each_character_is_one_token_and_no_special_tokens_are_added() -> None:
    tokenizer = build_char_tokenizer()
    ids = tokenizer("58+26=", add_special_tokens=True)["input_ids"]
    assert len(ids) == 6
    assert ids == [4 + DEFAULT_ALPHABET.index(c) for c in "58+26="]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=DEFAULT_ALPHABET, max_size=40))
def test_text_over_the_alphabet_round_trips(text: str) -> None:
    tokenizer = build_char_tokenizer()
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)
    assert tokenizer.decode(ids) == text


def test_characters_outside_the_alphabet_become_one_unk_each() -> None:
    tokenizer = build_char_tokenizer()
    ids = tokenizer("1x\n2", add_special_tokens=False)["input_ids"]
    assert ids == [5, 3, 3, 6]


def test_decoding_skips_special_tokens_on_request() -> None:
    tokenizer = build_char_tokenizer()
    assert tokenizer.decode([1, 5, 6, 2, 0], skip_special_tokens=True) == "12"


def test_saved_tokenizer_loads_with_autotokenizer_and_encodes_the_same(tmp_path: Path) -> None:
    tokenizer = build_char_tokenizer()
    tokenizer.save_pretrained(tmp_path)
    assert (tmp_path / "tokenizer.json").is_file()
    loaded = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    text = "(12 - 3) * 4 = 36."
    assert (
        loaded(text, add_special_tokens=False)["input_ids"]
        == tokenizer(text, add_special_tokens=False)["input_ids"]
    )
    assert loaded.decode(loaded(text, add_special_tokens=False)["input_ids"]) == text
    assert (loaded.pad_token_id, loaded.bos_token_id, loaded.eos_token_id, loaded.unk_token_id) == (
        0,
        1,
        2,
        3,
    )


@pytest.mark.parametrize("alphabet", ["", "112", "<"])
def test_bad_alphabets_are_rejected(alphabet: str) -> None:
    if alphabet == "<":  # a single '<' is fine: only whole special tokens collide
        assert len(build_char_tokenizer(alphabet)) == 5
        return
    with pytest.raises(ModelError):
        build_char_tokenizer(alphabet)
