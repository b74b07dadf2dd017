"""Streaming detokenizer: joined deltas equal the full decode, no partial characters."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pagedattn.model.detokenizer import IncrementalDetokenizer
from pagedattn.model.loader import LoadedModel
from pagedattn.model.tokenizer import Tokenizer
from tests.model.test_tokenizer import HARD_STRINGS

REPLACEMENT = "\ufffd"


def stream(tok: Tokenizer, ids: list[int], skip: bool = False) -> list[str]:
    detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    deltas = [detok.add_token(i) for i in ids]
    deltas.append(detok.flush())
    assert "".join(deltas) == detok.text
    return deltas


def check(tok: Tokenizer, ids: list[int], skip: bool = False) -> None:
    deltas = stream(tok, ids, skip)
    full = tok.decode(ids, skip_special_tokens=skip)
    assert "".join(deltas) == full
    if REPLACEMENT not in full:
        assert not any(REPLACEMENT in d for d in deltas)


def test_multibyte_characters_are_held_until_complete(tiny_loaded: LoadedModel) -> None:
    tok = tiny_loaded.tokenizer
    ids = tok.encode("é😀")  # tiny vocab: one token per byte -> 2 + 4 tokens
    assert len(ids) == 6
    detok = IncrementalDetokenizer(tok)
    assert [detok.add_token(i) for i in ids] == ["", "é", "", "", "", "😀"]
    assert detok.flush() == ""


def test_unfinished_character_is_released_by_flush(tiny_loaded: LoadedModel) -> None:
    tok = tiny_loaded.tokenizer
    ids = tok.encode("ab😀")[:-1]  # drop the emoji's last byte
    detok = IncrementalDetokenizer(tok)
    assert "".join(detok.add_token(i) for i in ids) == "ab"
    assert detok.flush() == tok.decode(ids)[2:] and detok.text == tok.decode(ids)


@pytest.mark.parametrize("text", HARD_STRINGS)
def test_hard_strings_tiny(tiny_loaded: LoadedModel, text: str) -> None:
    check(tiny_loaded.tokenizer, tiny_loaded.tokenizer.encode(text))
    check(tiny_loaded.tokenizer, tiny_loaded.tokenizer.encode(text), skip=True)


@given(data=st.data())
def test_random_ids_tiny(tiny_loaded: LoadedModel, data: st.DataObject) -> None:
    n = tiny_loaded.tokenizer.vocab_size
    ids = data.draw(st.lists(st.integers(0, n - 1), max_size=40))
    check(tiny_loaded.tokenizer, ids, skip=data.draw(st.booleans()))


@pytest.mark.model
@pytest.mark.parametrize("text", HARD_STRINGS)
def test_hard_strings_real(real_loaded: LoadedModel, text: str) -> None:
    check(real_loaded.tokenizer, real_loaded.tokenizer.encode(text))


@pytest.mark.model
@given(data=st.data())
def test_random_ids_real(real_loaded: LoadedModel, data: st.DataObject) -> None:
    # ids drawn around byte tokens (multi-byte pieces) and across the whole vocabulary
    ids = data.draw(st.lists(st.one_of(st.integers(0, 300), st.integers(0, 49151)), max_size=40))
    check(real_loaded.tokenizer, ids, skip=data.draw(st.booleans()))
