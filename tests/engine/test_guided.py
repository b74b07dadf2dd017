"""The guided-decoding logits processor on the tiny tokenizer: its masks against a mask
derived by hand from the vocabulary, and its state under diverging (n > 1 children) and
rolled-back histories."""

from __future__ import annotations

import numpy as np
import pytest
from tests.server.tiny_folder import write_tiny_folder

from pagedattn.engine.guided import GrammarCompiler, GuidedSpec
from pagedattn.model.tokenizer import Tokenizer

pytest.importorskip("llguidance")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    folder = write_tiny_folder(tmp_path_factory.mktemp("guided") / "tiny-llama")
    return Tokenizer.from_folder(folder)


@pytest.fixture(scope="module")
def compiler(tokenizer: Tokenizer) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, vocab_size=tokenizer.vocab_size + 8)  # padded rows


def token_bytes(tokenizer: Tokenizer, token_id: int) -> bytes:
    """A token's bytes, from the byte-level spelling (GPT-2's byte <-> char table)."""
    from pagedattn.model.tokenizer import bytes_to_unicode

    back = {c: b for b, c in bytes_to_unicode().items()}
    spelling = tokenizer.id_to_token(token_id) or ""
    if not all(c in back for c in spelling):
        return b""  # a special token: never text
    return bytes(back[c] for c in spelling)


def expected_choice_mask(tokenizer: Tokenizer, done: bytes, choices: list[str]) -> set[int]:
    """Tokens t such that done + bytes(t) is a prefix of some choice (by hand)."""
    allowed = set()
    for t in range(tokenizer.vocab_size):
        b = token_bytes(tokenizer, t)
        if b and any(c.encode().startswith(done + b) for c in choices):
            allowed.add(t)
    return allowed


def test_choice_masks_equal_the_vocabulary_prefix_rule(
    tokenizer: Tokenizer, compiler: GrammarCompiler
) -> None:
    choices = ["cat", "car", "dog"]
    proc = compiler.processor(GuidedSpec("choice", choices))
    generated: list[int] = []
    for step_text in ["ca", "t"]:
        done = tokenizer.decode(generated).encode()
        allowed = set(np.flatnonzero(proc.allowed(generated)).tolist())
        assert allowed == expected_choice_mask(tokenizer, done, choices)
        generated += tokenizer.encode(step_text, add_special_tokens=False)
    # "cat" is complete: only the end-of-sequence token remains
    assert set(np.flatnonzero(proc.allowed(generated)).tolist()) == {tokenizer.eos_token_id}


def test_logits_outside_the_mask_are_minus_inf(compiler: GrammarCompiler) -> None:
    proc = compiler.processor(GuidedSpec("regex", "[0-9]+"))
    logits = np.zeros(compiler.vocab_size or 0, dtype=np.float32)
    out = proc([], logits.copy())
    allowed = proc.allowed([])
    assert np.all(out[~allowed] == -np.inf) and np.all(out[allowed] == 0.0)
    assert not allowed[-8:].any()  # padded embedding rows are never allowed


def test_diverging_histories_mask_like_fresh_processors(
    tokenizer: Tokenizer, compiler: GrammarCompiler
) -> None:
    spec = GuidedSpec("json", {"type": "array", "items": {"type": "integer"}, "maxItems": 4})
    shared = compiler.processor(spec)
    a = tokenizer.encode("[12, 3", add_special_tokens=False)
    b = tokenizer.encode("[7", add_special_tokens=False)
    for history in [a, b, a[:2], a, [*b, *tokenizer.encode(", 45", add_special_tokens=False)]]:
        fresh = compiler.processor(spec)
        assert np.array_equal(shared.allowed(history), fresh.allowed(history))


def test_bad_specs_name_their_field(compiler: GrammarCompiler) -> None:
    with pytest.raises(ValueError, match=r"^guided_regex: "):
        compiler.processor(GuidedSpec("regex", "(", "guided_regex"))
    with pytest.raises(ValueError, match=r"^guided_choice: "):
        compiler.processor(GuidedSpec("choice", ["a", 3], "guided_choice"))
    with pytest.raises(ValueError, match=r"^response_format: "):
        compiler.processor(GuidedSpec("json", {"type": "banana"}, "response_format"))
