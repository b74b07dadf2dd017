"""Streaming detokenizer: joined deltas equal the full decode, no partial characters."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from pagedattn.model.detokenizer import IncrementalDetokenizer
from pagedattn.model.loader import LoadedModel, load_model
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


# ---- prompt context: the first generated word keeps its leading space (SentencePiece) --------
PROMPT = "It is a truth universally"
COMPLETION = " acknowledged, that a single man 😀 in possession\nof 日本"


def test_sentencepiece_first_token_keeps_its_space(spm_gguf: Path) -> None:
    tok = load_model(spm_gguf).tokenizer
    prompt = tok.encode(PROMPT)
    full = tok.encode(PROMPT + COMPLETION)
    assert full[: len(prompt)] == prompt
    out = full[len(prompt) :]
    assert tok.id_to_token(out[0]) == "\u2581acknowledged"[: len(tok.id_to_token(out[0]) or "")]
    for skip in (True, False):
        detok = IncrementalDetokenizer(tok, skip_special_tokens=skip, prompt_token_ids=prompt)
        deltas = [detok.add_token(i) for i in out] + [detok.flush()]
        assert "".join(deltas) == COMPLETION and deltas[0].startswith(" ")
        assert detok.token_ids == out
    # without the prompt as context the decoder strips the word-start space: what was wrong
    alone = IncrementalDetokenizer(tok, skip_special_tokens=True)
    assert "".join([alone.add_token(i) for i in out] + [alone.flush()]) == COMPLETION[1:]


def test_context_reaches_past_prompt_tokens_that_decode_to_nothing(spm_gguf: Path) -> None:
    tok = load_model(spm_gguf).tokenizer
    prompt = tok.encode("Anne said") + [2] * 8  # eight </s>: skipped special tokens
    out = tok.encode(" hello", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, skip_special_tokens=True, prompt_token_ids=prompt)
    text = "".join([detok.add_token(i) for i in out] + [detok.flush()])
    assert (
        text == " hello" == tok.decode(prompt + out, skip_special_tokens=True)[len("Anne said") :]
    )


@pytest.mark.parametrize("which", ["byte_level", "sentencepiece"])
@given(data=st.data())
def test_prompt_text_plus_stream_equals_decode_of_all(
    tiny_loaded: LoadedModel, spm_gguf: Path, which: str, data: st.DataObject
) -> None:
    tok = tiny_loaded.tokenizer if which == "byte_level" else _spm_tokenizer(spm_gguf)
    text = data.draw(st.sampled_from([*HARD_STRINGS, PROMPT, " x", "a\n"]))
    prompt = tok.encode(text, add_special_tokens=data.draw(st.booleans()))
    out = data.draw(st.lists(st.integers(0, tok.vocab_size - 1), max_size=24))
    skip = data.draw(st.booleans())
    detok = IncrementalDetokenizer(tok, skip_special_tokens=skip, prompt_token_ids=prompt)
    deltas = [detok.add_token(i) for i in out] + [detok.flush()]
    prompt_text = tok.decode(prompt, skip_special_tokens=skip)
    full = tok.decode(prompt + out, skip_special_tokens=skip)
    # A prompt ending in a byte token followed by bytes that make the run invalid UTF-8
    # decodes differently as a whole (U+FFFDs replace the prompt's own last bytes): no text
    # appended to the prompt's text can equal that.
    assume(full.startswith(prompt_text))
    assert prompt_text + "".join(deltas) == full


_SPM_CACHE: dict[Path, Tokenizer] = {}


def _spm_tokenizer(path: Path) -> Tokenizer:
    if path not in _SPM_CACHE:
        _SPM_CACHE[path] = load_model(path).tokenizer
    return _SPM_CACHE[path]
