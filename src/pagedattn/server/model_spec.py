"""ModelSpec: what the HTTP layer knows of the model it serves, without the model.

The handlers validate and shape requests against it: the tokenizer and its chat template, the
vocabulary, the end-of-sequence ids, the context length, and the KV pool's size and layout (a
request that could never fit is refused before it is queued). An in-process server builds it
from its engine (:meth:`ModelSpec.of_engine`); the cluster's ingress receives it from an engine
replica as plain data (:mod:`pagedattn.server.model_spec_wire`), so it loads no weights and
imports no model code beyond the tokenizer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pagedattn.config import CacheConfig, SchedulerConfig
from pagedattn.engine.capacity import request_pages
from pagedattn.engine.prompt_ids import encode_prompt

if TYPE_CHECKING:
    from pagedattn.engine.llm_engine import LLMEngine


@dataclass(frozen=True)
class ModelSpec:
    """The served model as the request handlers see it.

    Attributes:
        tokenizer: the model's tokenizer (``pagedattn.model.tokenizer.Tokenizer``: text, chat
            template, special tokens), or None (token-id prompts only).
        vocab_size: the ids a prompt, ``logit_bias`` or ``stop_token_ids`` may hold (the
            tokenizer's vocabulary, else the model's).
        logits_size: rows of the model's logits (its embedding table; may pass
            ``vocab_size`` by padding).
        eos_token_ids: the ids that end generation unless ``ignore_eos``.
        max_model_len: the most tokens per request (prompt + completion); None = unbounded.
        num_pages: pages in the KV pool.
        cache: the KV cache configuration (page size, sliding window, sink tokens).
        scheduler: the scheduler configuration (``max_num_seqs``, chunked prefill).
    """

    tokenizer: Any
    vocab_size: int
    logits_size: int
    eos_token_ids: frozenset[int]
    max_model_len: int | None
    num_pages: int
    cache: CacheConfig
    scheduler: SchedulerConfig

    def __post_init__(self) -> None:
        for name in ("vocab_size", "logits_size", "num_pages"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
        if self.max_model_len is not None and (
            isinstance(self.max_model_len, bool)
            or not isinstance(self.max_model_len, int)
            or self.max_model_len < 1
        ):
            raise ValueError(
                f"max_model_len: expected None or an int >= 1, got {self.max_model_len!r}"
            )
        bad = sorted(t for t in self.eos_token_ids if not 0 <= t < self.logits_size)
        if bad:
            raise ValueError(
                f"eos_token_ids: expected ids in [0, {self.logits_size}), got {bad[:5]}"
            )

    @classmethod
    def of_engine(cls, engine: LLMEngine) -> ModelSpec:
        """The spec of an engine (read once, before its thread starts stepping it)."""
        sched = engine.scheduler
        return cls(
            tokenizer=engine.tokenizer,
            vocab_size=int(engine.vocab_size),
            logits_size=int(engine.model_config.vocab_size),
            eos_token_ids=frozenset(int(t) for t in sched.eos_token_ids),
            max_model_len=sched.max_model_len,
            num_pages=int(sched.cache.num_pages),
            cache=engine.config.cache,
            scheduler=engine.config.scheduler,
        )

    @property
    def page_size(self) -> int:
        """Tokens per KV page."""
        return self.cache.page_size

    @property
    def max_num_seqs(self) -> int:
        """The most sequences the engine runs side by side."""
        return int(self.scheduler.max_num_seqs)

    def request_pages(self, num_prompt_tokens: int, max_tokens: int, copies: int = 1) -> int:
        """Most KV pages a request holds at once (what the scheduler admits it by:
        :func:`pagedattn.engine.capacity.request_pages`)."""
        return request_pages(
            self.cache, self.scheduler, self.max_model_len, num_prompt_tokens, max_tokens, copies
        )

    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        """Prompt token ids (text goes through the tokenizer), as the engine checks them
        (:func:`pagedattn.engine.prompt_ids.encode_prompt`).

        Raises:
            ValueError: text without a tokenizer, an empty prompt, or an id outside the vocab.
        """
        return encode_prompt(self.tokenizer, self.vocab_size, prompt)
