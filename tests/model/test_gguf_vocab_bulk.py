"""The bulk vocabulary steps of model/gguf_vocab.py equal the per-token rules they replace, and the
tokenizer built from model/gguf_header.py metadata equals the one built the old way from
``gguf.GGUFReader`` (the HF-transformers oracle tests are in test_tokenizer.py)."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import models

from pagedattn.model.gguf_vocab import byte_level_spelling, bytes_to_unicode, split_merges
from pagedattn.model.loader import LoadedModel
from pagedattn.model.tokenizer import Tokenizer
from tests.model.test_tokenizer import CONVERSATIONS, HARD_STRINGS


def _per_token_spelling(tokens: list[str]) -> list[str]:
    """The rule byte_level_spelling replaces: re-spell a token with a character outside the
    byte alphabet as the alphabet characters of its UTF-8 bytes."""
    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    return [
        tok if set(tok) <= alphabet else "".join(spelling[b] for b in tok.encode("utf-8"))
        for tok in tokens
    ]


def test_byte_level_spelling_respells_only_tokens_outside_the_alphabet() -> None:
    tokens = ["Ġthe", "a b", "\n", "", "é", "Ã©", "日本", "<|im_end|>", "x\u0000", "ĊĊ", " "]
    ours = byte_level_spelling(tokens)
    assert ours == _per_token_spelling(tokens)
    assert ours[1] == "aĠb" and ours[2] == "Ċ" and ours[4] == "é" and ours[10] == "Ġ"
    assert ours[0] == "Ġthe" and ours[5] == "Ã©" and ours[3] == "" and ours[6] == "æĹ¥æľ¬"


@pytest.mark.parametrize(
    "merges",
    [
        ["Ġ t", "Ġt he", "a b"],
        ["a b c", "d e"],  # a merge with two spaces: split at the first, like str.split(" ", 1)
        ["a\nb c", "d e"],  # a newline inside a merge
        ["a ", "b c"],  # an empty right part
        ["ab", "c d"],  # no space at all
    ],
)
def test_split_merges_equals_splitting_each_at_the_first_space(merges: list[str]) -> None:
    assert split_merges(merges) == [tuple(m.split(" ", 1)) for m in merges]


@pytest.mark.model
def test_tokenizer_from_header_equals_the_gguf_reader_path(real_loaded: LoadedModel) -> None:
    """Old path: GGUFReader's per-field values (Python lists), vocabulary and merges built per
    token; new path: the loaded model's tokenizer. Same vocabulary, same ids on hard strings and
    rendered conversations, same text back."""
    from gguf import GGUFReader

    reader = GGUFReader(str(real_loaded.source), "r")
    meta = {k: f.contents() for k, f in reader.fields.items() if k.startswith("tokenizer.")}
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    vocab = {tok: i for i, tok in enumerate(_per_token_spelling(tokens))}
    pairs = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    old_bpe = BackendTokenizer(models.BPE(vocab=vocab, merges=pairs))  # type: ignore[arg-type]
    new = real_loaded.tokenizer
    assert new.backend.get_vocab(with_added_tokens=False) == old_bpe.get_vocab()
    new_model, old_model = (json.loads(b.to_str())["model"] for b in (new.backend, old_bpe))
    assert new_model["merges"] == old_model["merges"] and len(old_model["merges"]) == len(pairs)
    old = Tokenizer.from_gguf_metadata(meta)  # lists, as GGUFReader gives them
    texts = HARD_STRINGS + [new.apply_chat_template(m) for m in CONVERSATIONS]
    for text in texts:
        ids = new.encode(text)
        assert ids == old.encode(text), text
        assert new.decode(ids) == old.decode(ids)
    assert new.special_tokens == old.special_tokens and new.stop_token_ids == old.stop_token_ids
    assert new.chat_template == old.chat_template and new.vocab_size == old.vocab_size
