"""A prompt as the engine takes it: token ids checked against the vocabulary."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def encode_prompt(tokenizer: Any, vocab_size: int, prompt: str | Sequence[int]) -> list[int]:
    """Prompt token ids (text goes through ``tokenizer``), each in ``[0, vocab_size)``.

    Raises:
        ValueError: text without a tokenizer, an empty prompt, or an id outside the vocab.
    """
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("prompt: text needs a tokenizer; pass token ids instead")
        ids = [int(t) for t in tokenizer.encode(prompt)]
    else:
        ids = [int(t) for t in prompt]
    if not ids:
        raise ValueError("prompt: expected at least one token, got none")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt: token ids must be in [0, {vocab_size}), got {bad[:5]}")
    return ids
