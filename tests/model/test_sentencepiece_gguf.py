"""SentencePiece GGUF vocabularies (Llama-2 / Mistral / TinyLlama style): token ids, text, BOS/EOS
flags equal HF transformers' tokenizer built from the same GGUF (the oracle)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pagedattn.model.loader import load_model
from tests.model.spm import spm_vocab, write_spm_gguf
from tests.model.test_tokenizer import HARD_STRINGS

SPM_STRINGS = [
    *HARD_STRINGS,
    'The quick brown fox; "Indeed," said Mr. Darcy, \'tis true!\t\tTabs',
    " leading space",
    "trailing space ",
    "\u00a0no-break space, zero\u200dwidth joiner",
    "2024-11-30 12:00",
    "<unk> and <s> and </s> inside",
    "a<|im_end|>b",
]


def hf_gguf_tokenizer(path: Path) -> Any:
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.fixture(scope="module")
def hf_spm(spm_gguf: Path) -> Any:
    return hf_gguf_tokenizer(spm_gguf)


def test_sentencepiece_vocabulary_loads_with_its_pieces(spm_gguf: Path) -> None:
    tok = load_model(spm_gguf).tokenizer
    assert tok.vocab_size == 1000 and tok.bos_token_id == 1 and tok.eos_token_id == 2
    # byte fallback: a newline has no piece of its own, so it is the byte token <0x0A>
    newline = tok.encode("\n", add_special_tokens=False)
    assert [tok.id_to_token(i) for i in newline][-1] == "<0x0A>"
    assert tok.decode(tok.encode("a\nb 😀")) == "<s> a\nb 😀"
    assert tok.decode(tok.encode("a\nb 😀"), skip_special_tokens=True) == "a\nb 😀"


@pytest.mark.hf
@pytest.mark.parametrize("text", SPM_STRINGS)
def test_token_ids_and_text_equal_hf(spm_gguf: Path, hf_spm: Any, text: str) -> None:
    tok = load_model(spm_gguf).tokenizer
    ours, theirs = tok.encode(text), hf_spm.encode(text)
    assert ours == theirs
    assert tok.encode(text, add_special_tokens=False) == hf_spm.encode(
        text, add_special_tokens=False
    )
    for skip in (False, True):
        assert tok.decode(ours, skip_special_tokens=skip) == hf_spm.decode(
            theirs, skip_special_tokens=skip
        )


@pytest.mark.hf
def test_prompt_starting_with_bos_gets_no_second_one(spm_gguf: Path, hf_spm: Any) -> None:
    tok = load_model(spm_gguf).tokenizer
    theirs = hf_spm.encode("<s>Once upon a time")
    assert theirs[:2] == [1, 1]  # transformers (and llama.cpp) double it
    assert tok.encode("<s>Once upon a time") == theirs[1:]
    assert tok.encode("<s>") == [1]
    assert tok.encode("<s><s>x")[:2] == [1, 1]  # two written by the user stay two


@pytest.mark.hf
@pytest.mark.parametrize(
    ("add_bos", "add_eos"), [(False, False), (True, True), (False, True), (None, None)]
)
def test_add_bos_and_add_eos_flags_are_honoured(
    spm_model_file: Path, tmp_path: Path, add_bos: bool | None, add_eos: bool | None
) -> None:
    path = write_spm_gguf(
        tmp_path / "flags.gguf", spm_model_file, add_bos_token=add_bos, add_eos_token=add_eos
    )
    tok, hf = load_model(path).tokenizer, hf_gguf_tokenizer(path)
    text = "It is a truth universally acknowledged"
    ids = tok.encode(text)
    plain = tok.encode(text, add_special_tokens=False)
    want_bos = add_bos is not False  # a SentencePiece GGUF without the flag adds BOS
    assert ids == [1] * want_bos + plain + [2] * bool(add_eos)
    assert ids == hf.encode(text)
    if add_eos:
        assert tok.encode(text + "</s>") == ids  # no second EOS


def test_add_space_prefix_false_marks_no_first_word(spm_model_file: Path, tmp_path: Path) -> None:
    path = write_spm_gguf(tmp_path / "nospace.gguf", spm_model_file, add_space_prefix=False)
    tok = load_model(path).tokenizer
    tokens, _, _ = spm_vocab(spm_model_file)
    ids = tok.encode("the man", add_special_tokens=False)
    # by hand: "the" is not word-initial, so no piece of it starts with the "▁" mark
    assert not tokens[ids[0]].startswith("\u2581")
    assert tok.decode(ids) == "the man"
    with_prefix = load_model(write_spm_gguf(tmp_path / "space.gguf", spm_model_file)).tokenizer
    assert with_prefix.id_to_token(with_prefix.encode("the man")[1]) == "\u2581the"


def write_vocab_only_gguf(path: Path, model_file: Path, architecture: str) -> Path:
    """A GGUF holding only the SentencePiece vocabulary, under ``architecture``."""
    from gguf import GGUFWriter

    tokens, scores, types = spm_vocab(model_file)
    writer = GGUFWriter(str(path), architecture)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.hf
def test_phi3_sentencepiece_marks_words_by_normalizer_like_hf(
    spm_model_file: Path, tmp_path: Path
) -> None:
    """Phi-3: the word-start mark comes from a normalizer, so a text starting with spaces keeps
    one more "▁" than Llama's Metaspace gives (transformers builds Phi-3 files so)."""
    from pagedattn.model.gguf_loader import gguf_tokenizer_metadata, open_gguf
    from pagedattn.model.tokenizer import Tokenizer

    path = write_vocab_only_gguf(tmp_path / "phi3.gguf", spm_model_file, "phi3")
    tok = Tokenizer.from_gguf_metadata(gguf_tokenizer_metadata(open_gguf(path)))
    hf = hf_gguf_tokenizer(path)
    llama = load_model(write_spm_gguf(tmp_path / "llama.gguf", spm_model_file)).tokenizer
    assert tok.encode("  two spaces") != llama.encode("  two spaces")  # the variants differ
    for text in SPM_STRINGS:
        assert tok.encode(text) == hf.encode(text), text
        assert tok.decode(tok.encode(text)) == hf.decode(hf.encode(text)), text
