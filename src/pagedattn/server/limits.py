"""How much a request may ask for: prompt bytes, context length and KV pool capacity.

- A text prompt longer in bytes than ``max_model_len`` tokens can hold is refused before it is
  tokenised (code ``context_length_exceeded``): no token spells more bytes than the
  vocabulary's longest one, so such a prompt has more tokens than the context. A tokenizer
  with a normaliser may shrink text before it splits it (Unicode composition merges at most
  four code points into one), so the bound is then four times as loose.
- ``max_tokens`` / ``max_completion_tokens`` must be >= 1, or >= 0 with ``echo``. Absent:
  completions generate 16 tokens (OpenAI's default), chat completions as many as fit (the
  model context left after the prompt, at most ``default_max_tokens``), both then shrunk to
  what the KV pool can hold.
- prompt + max_tokens must fit ``max_model_len`` (code ``context_length_exceeded``), and the
  request's K/V at its largest must fit the whole page pool (code ``cache_capacity_exceeded``).
- sequences: one prompt's ``n`` / ``best_of`` must fit ``max_num_seqs`` (they run side by side),
  and a request's prompts x sequences must not pass ``max_seqs_per_request`` (default four
  times ``max_num_seqs``): a 400 naming ``n`` (or ``best_of``), or ``prompt`` for a list of
  prompts, so that one request cannot queue thousands of sequences ahead of everyone else.
"""

from __future__ import annotations

from typing import Any

import pagedattn.server.protocol as p
from pagedattn.server.errors import APIError
from pagedattn.server.model_spec import ModelSpec

NORMALISER_SLACK = 4  # most code points Unicode composition merges into one


def longest_token_bytes(tokenizer: Any) -> int | None:
    """The most input bytes one token of ``tokenizer`` can stand for (its longest decoded
    text, in UTF-8; times :data:`NORMALISER_SLACK` when the tokenizer normalises text first),
    or None when the tokenizer exposes no ``tokenizers`` backend."""
    backend = getattr(tokenizer, "backend", None)
    if backend is None:
        return None
    num_ids = int(backend.get_vocab_size(with_added_tokens=True))
    texts = backend.decode_batch([[i] for i in range(num_ids)], skip_special_tokens=False)
    longest = max((len(t.encode("utf-8", "surrogatepass")) for t in texts), default=1)
    return max(longest, 1) * (1 if backend.normalizer is None else NORMALISER_SLACK)


def copies_of(req: p.SamplingFields) -> int:
    """Sequences a request runs at its largest (``n``, or ``best_of`` when larger)."""
    best_of = getattr(req, "best_of", None)
    return max(req.n, best_of or 0)


class RequestLimits:
    """The limits of one served model (see the module docstring).

    Args:
        spec: the served model (its context length, page pool, ``max_num_seqs`` and
            tokenizer).
        max_seqs_per_request: most sequences (prompts x ``n``) one request may ask for; None =
            four times ``max_num_seqs``.
    """

    def __init__(self, spec: ModelSpec, max_seqs_per_request: int | None = None) -> None:
        self.spec = spec
        self.max_num_seqs = spec.max_num_seqs
        if max_seqs_per_request is not None and max_seqs_per_request < 1:
            raise ValueError(f"max_seqs_per_request: expected >= 1, got {max_seqs_per_request}")
        self.max_seqs_per_request = max_seqs_per_request or 4 * self.max_num_seqs
        self.max_model_len: int | None = spec.max_model_len
        token_bytes = longest_token_bytes(spec.tokenizer)
        self.max_prompt_bytes: int | None = (
            None
            if token_bytes is None or self.max_model_len is None
            else self.max_model_len * token_bytes
        )

    def check_prompt_bytes(self, text: str, field: str) -> None:
        """Raises APIError 400 (``context_length_exceeded``) when ``text`` has more UTF-8
        bytes than :attr:`max_prompt_bytes` (checked before tokenising)."""
        limit = self.max_prompt_bytes
        if limit is None or len(text) * 4 <= limit:  # at most 4 bytes per code point
            return
        size = len(text.encode("utf-8"))
        if size > limit:
            raise APIError(
                400,
                f"This model's maximum context length is {self.max_model_len} tokens; the "
                f"prompt has {size} bytes, more than that many tokens can spell ({limit} "
                "bytes). Please reduce the prompt.",
                param=field,
                code="context_length_exceeded",
            )

    def check_sequences(self, req: p.SamplingFields, num_prompts: int) -> None:
        """Raises APIError 400 when one prompt's sequences do not fit ``max_num_seqs`` or the
        request's prompts x sequences pass ``max_seqs_per_request`` (see the module doc)."""
        copies = copies_of(req)
        field = "best_of" if copies > req.n else "n"
        if copies > self.max_num_seqs:
            raise APIError(
                400,
                f"{field}: {copies} sequences of one prompt run side by side, and this server "
                f"runs at most {self.max_num_seqs} at once (max_num_seqs)",
                param=field,
            )
        total = num_prompts * copies
        if total > self.max_seqs_per_request:
            field = "prompt" if copies == 1 else field
            raise APIError(
                400,
                f"{field}: the request asks for {num_prompts} prompts x {copies} sequences = "
                f"{total} sequences; this server takes at most {self.max_seqs_per_request} "
                "per request (max_seqs_per_request)",
                param=field,
            )

    def _fits_pool(self, num_prompt: int, max_tokens: int, copies: int = 1) -> bool:
        spec = self.spec
        return spec.request_pages(num_prompt, max_tokens, copies) <= spec.num_pages

    def resolve_max_tokens(
        self, req: p.SamplingFields, num_prompt: int, default: int, least: int = 1
    ) -> int:
        """The request's max_tokens under the module's rules (``least``: the smallest allowed
        value, 0 under ``echo``). Raises APIError (400)."""
        asked = req.max_completion_tokens if req.max_completion_tokens is not None else None
        asked = asked if asked is not None else req.max_tokens
        field = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        copies = copies_of(req)
        if asked is not None and asked < least:
            raise APIError(400, f"{field} must be at least {least}, got {asked}", param=field)
        limit = self.max_model_len
        room = None if limit is None else limit - num_prompt
        if room is not None and room < 1:
            raise APIError(
                400,
                f"This model's maximum context length is {limit} tokens; the prompt has "
                f"{num_prompt} tokens, which leaves no room to generate.",
                param="messages" if isinstance(req, p.ChatCompletionRequest) else "prompt",
                code="context_length_exceeded",
            )
        if asked is None:
            want = default if room is None else min(default, room)
            if not self._fits_pool(num_prompt, 1, copies):
                raise self._capacity_error(num_prompt, 1, copies)
            lo, hi = 1, want  # largest max_tokens that fits the pool (monotone)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if self._fits_pool(num_prompt, mid, copies) else (lo, mid - 1)
            return lo
        if room is not None and asked > room:
            raise APIError(
                400,
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{num_prompt + asked} tokens ({num_prompt} in the prompt, {asked} for the "
                "completion). Please reduce the prompt or the completion length.",
                param=field,
                code="context_length_exceeded",
            )
        if not self._fits_pool(num_prompt, asked, copies):
            raise self._capacity_error(num_prompt, asked, copies)
        return asked

    def _capacity_error(self, num_prompt: int, max_tokens: int, copies: int) -> APIError:
        spec = self.spec
        need = spec.request_pages(num_prompt, max_tokens, copies)
        return APIError(
            400,
            f"The request needs {need} KV pages ({num_prompt} prompt tokens + {max_tokens} "
            f"completion tokens x {copies} sequences, {spec.page_size} tokens "
            "per page); the KV pool "
            f"holds {spec.num_pages} pages.",
            param="max_tokens",
            code="cache_capacity_exceeded",
        )
