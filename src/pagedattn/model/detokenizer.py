"""Incremental (streaming) detokenization: token ids in, text deltas out.

Byte-level BPE splits one character (emoji, CJK, accents) across several tokens, so decoding one
token at a time yields U+FFFD halves. We follow the offset scheme of Hugging Face
text-generation-inference / vLLM (``detokenize_incrementally``): decode a short window
``ids[prefix_offset:]`` and the already-emitted part ``ids[prefix_offset:read_offset]``; emit the
difference only when the window's text does not end in U+FFFD (an unfinished character), then
slide the window forward. ``flush()`` releases whatever is held at the end of the stream, so the
joined deltas always equal ``decode(all ids)``.
"""

from __future__ import annotations

from typing import Protocol

_REPLACEMENT = "\ufffd"


class _Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str: ...


class IncrementalDetokenizer:
    """Stream text for one sequence of generated token ids.

    Args:
        tokenizer: anything with ``decode(ids, skip_special_tokens)`` (e.g. our Tokenizer).
        skip_special_tokens: leave special tokens (``<|im_end|>``...) out of the text.
    """

    def __init__(self, tokenizer: _Decoder, *, skip_special_tokens: bool = False) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self.token_ids: list[int] = []
        self._prefix_offset = 0  # window start: ids before it are emitted and never re-decoded
        self._read_offset = 0  # ids before it have been emitted as text
        self.text = ""  # everything emitted so far

    def _decode(self, start: int, stop: int) -> str:
        return self._tokenizer.decode(self.token_ids[start:stop], skip_special_tokens=self._skip)

    def add_token(self, token_id: int) -> str:
        """Append one token id and return the newly completed text (maybe "").

        Never returns a partial UTF-8 character: text whose decode ends in U+FFFD is held back
        until a later token completes it (or :meth:`flush` is called).

        Raises:
            ValueError: ``token_id`` outside the tokenizer's vocabulary (from ``decode``).
        """
        self.token_ids.append(int(token_id))
        prefix = self._decode(self._prefix_offset, self._read_offset)
        window = self._decode(self._prefix_offset, len(self.token_ids))
        if len(window) <= len(prefix) or window.endswith(_REPLACEMENT):
            return ""
        delta = window[len(prefix) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self.token_ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """Release text still held (an unfinished character decodes to U+FFFD) at stream end."""
        prefix = self._decode(self._prefix_offset, self._read_offset)
        window = self._decode(self._prefix_offset, len(self.token_ids))
        delta = window[len(prefix) :] if window.startswith(prefix) else ""
        self._prefix_offset = self._read_offset = len(self.token_ids)
        self.text += delta
        return delta
