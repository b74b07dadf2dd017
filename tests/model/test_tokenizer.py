"""Tokenizer and chat template: exact ids and text; equality with HF transformers (real model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pagedattn.model.loader import LoadedModel, load_model
from pagedattn.model.tokenizer import Tokenizer
from tests.model.tiny import random_weights, tiny_config, write_tiny_gguf

HARD_STRINGS = [
    "Hello world",
    "def f(x):\n\treturn x**2  # square\n\n\n",
    "    indented\n        more\r\n\r\nwindows",
    "12345 678.9 1,000,000 and 3.14159",
    "a1b2c3 0x1F",
    "héllo café naïve Ærøskøbing",
    "😀👍🏽 family 👨\u200d👩\u200d👧 🇫🇷",
    "日本語のテキスト 中文 한국어",
    "   multiple    spaces   ",
    "don't I'll we're THEY'VE",
    "<|im_start|>user\nhi<|im_end|>\n",
    "<|endoftext|>x<repo_name>y",
    "",
    " ",
    "\n",
]

CONVERSATIONS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
    [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3? 😀 日本"},
    ],
    [{"role": "user", "content": "code:\n```py\nprint('x')\n```\n<|im_end|> inside"}],
]


def test_tiny_tokenizer_bpe_and_special_tokens(tiny_loaded: LoadedModel) -> None:
    tok = tiny_loaded.tokenizer
    # tiny vocab: 3 specials, 256 byte characters (id 3 + rank in GPT-2's byte table), then
    # one token per merge from id 259: "he" = merge 1, "at" = merge 9; "Ġ" (space) is 223.
    ids = tok.encode("the cat<|im_end|>")
    assert ids == [3 + ord("t") - ord("!"), 260, 223, 3 + ord("c") - ord("!"), 268, 2]
    assert tok.decode(ids) == "the cat<|im_end|>"
    assert tok.decode(ids, skip_special_tokens=True) == "the cat"
    # <|endoftext|> (0) and <|im_end|> (2, the eos) end generation, as in llama.cpp
    assert tok.eos_token_id == 2 and tok.bos_token_id == 1 and tok.stop_token_ids == {0, 2}
    assert tok.vocab_size == tiny_loaded.config.vocab_size


def test_tiny_chat_template_renders_like_hf(tiny_loaded: LoadedModel) -> None:
    text = tiny_loaded.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = tiny_loaded.tokenizer.encode_chat([{"role": "user", "content": "hi"}])
    assert ids[0] == 1 and ids.count(2) == 1


def test_chat_template_errors_are_value_errors(tiny_loaded: LoadedModel) -> None:
    tok = tiny_loaded.tokenizer
    raising = Tokenizer(
        tok.backend,
        chat_template="{% if messages|length > 1 %}{{ raise_exception('one message only') }}"
        "{% endif %}{{ messages[0]['content'] }}",
        special_tokens={},
        eos_token_id=2,
    )
    with pytest.raises(ValueError, match="one message only"):
        raising.apply_chat_template([{"role": "user", "content": "x"}] * 2)
    with pytest.raises(ValueError, match=r"tokenizer.chat_template\) fails to render .*always"):
        Tokenizer(
            tok.backend,
            chat_template="{{ raise_exception('always') }}",
            special_tokens={},
            eos_token_id=2,
        )
    with pytest.raises(ValueError, match=r"messages\[0\] must be a dict with a string 'role'"):
        tok.apply_chat_template([{"content": "no role"}])
    with pytest.raises(ValueError, match="token ids must be in"):
        tok.decode([tok.vocab_size])


def test_unsupported_gguf_tokenizers_are_refused() -> None:
    with pytest.raises(ValueError, match=r"tokenizer model 't5' is not supported"):
        Tokenizer.from_gguf_metadata({"tokenizer.ggml.model": "t5"})
    with pytest.raises(ValueError, match=r"tokenizer.ggml.scores has 0 entries for 2 tokens"):
        Tokenizer.from_gguf_metadata(
            {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["a", "b"]}
        )
    with pytest.raises(ValueError, match=r"unsupported GGUF pre-tokenizer 'jais'"):
        Tokenizer.from_gguf_metadata(
            {
                "tokenizer.ggml.model": "gpt2",
                "tokenizer.ggml.pre": "jais",
                "tokenizer.ggml.tokens": ["a", "b", "ab"],
                "tokenizer.ggml.merges": ["a b"],
            }
        )


@pytest.mark.hf
@pytest.mark.parametrize("add_bos", [True, False])
def test_byte_level_gguf_add_bos_token_is_honoured(tmp_path: Path, add_bos: bool) -> None:
    transformers = pytest.importorskip("transformers")
    config = tiny_config()
    path = write_tiny_gguf(
        tmp_path / "bos.gguf",
        config,
        random_weights(config),
        extra={"tokenizer.ggml.add_bos_token": add_bos},
    )
    tok = load_model(path).tokenizer
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    for text in ("the cat", "<|im_end|>the", ""):
        ids = tok.encode(text)
        assert ids == [1] * add_bos + tok.encode(text, add_special_tokens=False)
        assert ids == hf.encode(text)
    assert tok.adds_bos is add_bos
    # the tiny vocabulary's BOS is <|im_start|>: a text starting with it gets no second one
    assert tok.encode("<|im_start|>the") == [1, 86, 260]
    assert hf.encode("<|im_start|>the") == [1] * add_bos + [1, 86, 260]


@pytest.mark.model
def test_real_tokenizer_metadata(real_loaded: LoadedModel) -> None:
    tok = real_loaded.tokenizer
    assert tok.vocab_size == 49152
    assert tok.eos_token_id == 2 and tok.decode([2]) == "<|im_end|>"
    assert tok.encode("Hello world") == [19556, 905]


@pytest.mark.model
@pytest.mark.hf
@pytest.mark.parametrize("text", HARD_STRINGS)
def test_token_ids_equal_hf(
    real_loaded: LoadedModel, hf_reference: tuple[Any, Any], text: str
) -> None:
    hf_tok = hf_reference[1]
    ours = real_loaded.tokenizer.encode(text)
    assert ours == hf_tok.encode(text)
    assert real_loaded.tokenizer.decode(ours) == hf_tok.decode(ours)
    assert real_loaded.tokenizer.decode(ours, skip_special_tokens=True) == hf_tok.decode(
        ours, skip_special_tokens=True
    )


@pytest.mark.model
@pytest.mark.hf
@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_equals_hf(
    real_loaded: LoadedModel,
    hf_reference: tuple[Any, Any],
    messages: list[dict[str, str]],
    add_generation_prompt: bool,
) -> None:
    hf_tok = hf_reference[1]
    ours = real_loaded.tokenizer.apply_chat_template(messages, add_generation_prompt)
    theirs = hf_tok.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=False
    )
    assert ours == theirs
    hf_ids = hf_tok.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=True
    )["input_ids"]
    assert real_loaded.tokenizer.encode_chat(messages, add_generation_prompt) == list(hf_ids)


def write_byte_level_vocab(path: Path, architecture: str, pre: str) -> Path:
    """A GGUF holding only the tiny byte-level vocabulary, with pre-tokenizer ``pre``."""
    from gguf import GGUFWriter

    from tests.model.tiny import add_tiny_vocab

    writer = GGUFWriter(str(path), architecture)
    add_tiny_vocab(writer, pre=pre)
    writer.add_add_bos_token(False)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.hf
def test_byte_level_pre_tokenizers_equal_hf(tmp_path: Path) -> None:
    """llama-bpe (Llama 3: digits in threes) and qwen2 (single digits) split text as
    transformers does for the same file; the two differ on digit runs."""
    transformers = pytest.importorskip("transformers")
    from pagedattn.model.gguf_loader import gguf_tokenizer_metadata, open_gguf

    texts = [*HARD_STRINGS, "1234567 89", "x=12345;y=6", "  \n\n  12 ab"]
    ours: dict[str, Tokenizer] = {}
    for arch, pre in (("llama", "llama-bpe"), ("qwen2", "qwen2")):
        folder = tmp_path / pre
        folder.mkdir()
        path = write_byte_level_vocab(folder / "vocab.gguf", arch, pre)
        tok = Tokenizer.from_gguf_metadata(gguf_tokenizer_metadata(open_gguf(path)))
        hf = transformers.AutoTokenizer.from_pretrained(str(folder), gguf_file=path.name)
        for text in texts:
            assert tok.encode(text) == hf.encode(text), (pre, text)
            assert tok.decode(tok.encode(text)) == hf.decode(hf.encode(text)), (pre, text)
        ours[pre] = tok
    splits = {
        pre: [piece for piece, _ in tok.backend.pre_tokenizer.pre_tokenize_str("1234567 ab")]
        for pre, tok in ours.items()
    }
    assert splits["llama-bpe"] == ["123", "456", "7", "Ġab"]
    assert splits["qwen2"] == ["1", "2", "3", "4", "5", "6", "7", "Ġab"]
