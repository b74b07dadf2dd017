# ruff: noqa: RUF001  (lookalike characters are what these strings test)
"""The tokenizers of the packaged Qwen2.5 and Gemma 3 GGUFs equal HF transformers' tokenizer
built from the same file (``AutoTokenizer.from_pretrained(dir, gguf_file=...)``): ids on tricky
text, decoding, streaming detokenization over byte-fallback pieces, end-of-generation ids.

The files are pulled by name (``pagedattn pull``) when not installed yet.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pagedattn.model.catalogue import CATALOGUE, installed_path
from pagedattn.model.detokenizer import IncrementalDetokenizer
from pagedattn.model.gguf_loader import gguf_tokenizer_metadata, open_gguf
from pagedattn.model.pull import pull
from pagedattn.model.tokenizer import Tokenizer
from tests.model.test_tokenizer import HARD_STRINGS

pytestmark = [pytest.mark.model, pytest.mark.hf]

FAMILY_STRINGS = [
    *HARD_STRINGS,
    "12345678901 0.000001e-10 -42 +7 9999999999999",
    "        deeply\n            indented    code\t\t\n",
    "\u00a0nbsp and \u3000 ideographic space",
    "Ünïcödé façade — “quotes” … ‘single’",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝒮𝒸𝓇𝒾𝓅𝓉 and rare 𠀀𠀁 chars 𓀀",
    "مرحبا بالعالم Привет, мир! 你好，世界！",
    "a  b   c    d     e      f",
    "      \n       \n",
    "\r\n\r\n windows\r\nlines",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }\n",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "<bos>x<eos>y<pad>",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<tool_call>\n{}\n</tool_call>",
]
RARE = "𠀀𠀁 𓀀 ꙮ"  # characters a vocabulary rarely holds: byte-fallback / byte-level pieces


def model_file(name: str) -> Path:
    model = CATALOGUE[name]
    return installed_path(model) or pull(model)


@pytest.fixture(scope="module", params=["qwen2.5-coder-0.5b", "gemma-3-270m"])
def pair(request: pytest.FixtureRequest) -> tuple[str, Tokenizer, Any]:
    transformers = pytest.importorskip("transformers")
    path = model_file(request.param)
    ours = Tokenizer.from_gguf_metadata(gguf_tokenizer_metadata(open_gguf(path)))
    hf = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return request.param, ours, hf


def test_ids_and_text_equal_hf(pair: tuple[str, Tokenizer, Any]) -> None:
    _, ours, hf = pair
    for text in FAMILY_STRINGS:
        expected = hf.encode(text, add_special_tokens=True)
        if text.startswith("<bos>") and expected[:2] == [2, 2]:
            expected = expected[1:]  # we never add a second BOS to a text that has one
        assert ours.encode(text) == expected, text
        plain = hf.encode(text, add_special_tokens=False)
        assert ours.encode(text, add_special_tokens=False) == plain, text
        assert ours.decode(plain) == hf.decode(plain), text
        skipped = hf.decode(plain, skip_special_tokens=True)
        assert ours.decode(plain, skip_special_tokens=True) == skipped, text
    assert ours.vocab_size == len(hf)


def test_streamed_text_equals_decode_over_byte_pieces(pair: tuple[str, Tokenizer, Any]) -> None:
    name, ours, hf = pair
    ids = hf.encode(f"Rare: {RARE} end 😀\n", add_special_tokens=False)
    pieces = [ours.id_to_token(i) or "" for i in ids]
    if name.startswith("gemma"):  # SentencePiece byte fallback really is exercised
        assert any(p.startswith("<0x") for p in pieces)
    prompt = hf.encode("Say it:", add_special_tokens=False)
    stream = IncrementalDetokenizer(ours, prompt_token_ids=prompt)
    deltas = [stream.add_token(i) for i in ids]
    deltas.append(stream.flush())
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == hf.decode(prompt + ids)[len(hf.decode(prompt)) :]


def test_end_of_generation_ids(pair: tuple[str, Tokenizer, Any]) -> None:
    name, ours, hf = pair
    expected = {
        "qwen2.5-coder-0.5b": {"<|im_end|>", "<|endoftext|>"},  # generation_config eos ids
        "gemma-3-270m": {"<eos>", "<end_of_turn>"},
    }[name]
    assert {hf.convert_ids_to_tokens(i) for i in ours.stop_token_ids} == expected
    assert ours.eos_token_id == hf.eos_token_id


def test_chat_template_presence(pair: tuple[str, Tokenizer, Any]) -> None:
    name, ours, _ = pair
    assert (ours.chat_template is not None) == CATALOGUE[name].chat
