"""Incremental (streaming) detokenization: token ids in, text deltas out.

Byte-level BPE splits one character (emoji, CJK, accents) across several tokens, so decoding one
token at a time yields U+FFFD halves. We follow the offset scheme of Hugging Face
text-generation-inference / vLLM (``detokenize_incrementally``): decode a short window
``ids[prefix_offset:]`` and the already-emitted part ``ids[prefix_offset:read_offset]``; emit the
difference only when the window's text does not end in U+FFFD (an unfinished character), then
slide the window forward. ``flush()`` releases whatever is held at the end of the stream, so the
joined deltas always equal ``decode(all ids)``.

SentencePiece / Metaspace decoders (Llama-2, Mistral, TinyLlama) drop the word-start space of the
*first* token they decode, so decoding the generated ids alone loses the space before the first
generated word. As vLLM does (``INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET``), the window starts
inside the prompt: its last few tokens are decoded with every delta and subtracted, so that
``decode(prompt_ids) + joined deltas == decode(prompt_ids + generated_ids)``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

_REPLACEMENT = "\ufffd"
PROMPT_CONTEXT_TOKENS = 5  # prompt tokens decoded with each delta (vLLM uses 5 as well)
_BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")  # SentencePiece byte-fallback token


class _Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str: ...

    def id_to_token(self, token_id: int) -> str | None: ...


class IncrementalDetokenizer:
    """Stream text for one sequence of generated token ids.

    Args:
        tokenizer: anything with ``decode(ids, skip_special_tokens)`` (e.g. our Tokenizer).
        skip_special_tokens: leave special tokens (``<|im_end|>``...) out of the text.
        prompt_token_ids: the request's prompt; its last :data:`PROMPT_CONTEXT_TOKENS` tokens
            (more when those decode to no text, e.g. skipped special tokens, or start inside a
            run of byte-fallback tokens) seed the window, so the first generated token keeps
            its leading space. Empty = no context (the
            first token decodes as the start of a text).

    Raises:
        ValueError: a prompt id outside the tokenizer's vocabulary (from ``decode``).
    """

    def __init__(
        self,
        tokenizer: _Decoder,
        *,
        skip_special_tokens: bool = False,
        prompt_token_ids: Sequence[int] = (),
    ) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        prompt = [int(t) for t in prompt_token_ids]
        start = max(len(prompt) - PROMPT_CONTEXT_TOKENS, 0)
        while start > 0 and not self._decode_ids(prompt[start:]):
            start -= 1  # context that decodes to "" would not carry the word-start space
        while start > 0 and self._is_byte_piece(prompt[start]):
            start -= 1  # a run of byte tokens decodes as a whole: never start inside one
        self._ids = prompt[start:]  # prompt context, then the generated ids
        self._num_context = len(self._ids)
        self._prefix_offset = 0  # window start: ids before it are emitted and never re-decoded
        self._read_offset = self._num_context  # ids before it have been emitted as text
        self.text = ""  # everything emitted so far

    @property
    def token_ids(self) -> list[int]:
        """The generated ids added so far (prompt context excluded)."""
        return self._ids[self._num_context :]

    def _is_byte_piece(self, token_id: int) -> bool:
        return _BYTE_PIECE.fullmatch(self._tokenizer.id_to_token(int(token_id)) or "") is not None

    def _decode_ids(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip)

    def _decode(self, start: int, stop: int) -> str:
        return self._decode_ids(self._ids[start:stop])

    def add_token(self, token_id: int) -> str:
        """Append one token id and return the newly completed text (maybe "").

        Never returns a partial UTF-8 character: text whose decode ends in U+FFFD is held back
        until a later token completes it (or :meth:`flush` is called). Text ending in a
        SentencePiece byte-fallback token (``<0x0A>``) is held too: the ``ByteFallback`` decoder
        turns a whole run of byte tokens into U+FFFDs when a later byte makes the run invalid
        UTF-8, so the run's text is only final once a non-byte token follows.

        Raises:
            ValueError: ``token_id`` outside the tokenizer's vocabulary (from ``decode``).
        """
        self._ids.append(int(token_id))
        prefix = self._decode(self._prefix_offset, self._read_offset)
        window = self._decode(self._prefix_offset, len(self._ids))
        if len(window) <= len(prefix) or window.endswith(_REPLACEMENT):
            return ""
        if self._is_byte_piece(token_id):
            return ""
        delta = window[len(prefix) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """Release text still held (an unfinished character decodes to U+FFFD) at stream end."""
        prefix = self._decode(self._prefix_offset, self._read_offset)
        window = self._decode(self._prefix_offset, len(self._ids))
        delta = window[len(prefix) :] if window.startswith(prefix) else ""
        self._prefix_offset = self._read_offset = len(self._ids)
        self.text += delta
        return delta
