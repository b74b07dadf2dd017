"""SamplingParams: what one request may ask for (validated on construction).

The field names and meanings follow vLLM's ``SamplingParams`` and the OpenAI completions API.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

# vLLM's (legacy) logits processor: (generated token ids so far, (vocab,) float32 logits of the
# next token) -> the logits to sample from. It may modify and return the given array.
LogitsProcessor = Callable[[Sequence[int], np.ndarray], np.ndarray]


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each generated token and when to stop.

    Attributes:
        temperature: softmax temperature, ``>= 0``; ``0`` means greedy (exact argmax of the
            logits, no randomness).
        top_k: keep only the ``k`` most likely tokens; ``0`` or ``-1`` turns it off.
        top_p: nucleus sampling (Holtzman et al. 2019, arXiv 1904.09751): keep the smallest
            set of most likely tokens whose probability sums to at least ``top_p``, in (0, 1].
        seed: per-request random seed (``np.random.Generator(PCG64(seed))``); None draws
            from the engine's generator. On the default (NumPy) backend a request's logits
            are bitwise independent of what else shares its steps (see
            :class:`pagedattn.model.llama.LlamaModel`), so the same seed (or greedy sampling)
            gives the same tokens alone, in any batch and whenever others arrive, provided its
            prompt is cut into the same prefill chunks: chunks depend on the prompt's own
            length and the chunk budget, but a prefix-cache hit skips the cached pages and
            may change the result by float32 rounding (the cached KV was computed in another
            request's chunks).
        max_tokens: generate exactly this many tokens unless a stop comes first. ``0`` is
            allowed: the request finishes at once with reason ``"length"`` and no model work.
        stop: strings that end generation; the matched stop string and everything after it
            never appear in the output text, also when streamed (text that may be the start
            of a stop string is held back until it is known not to be one). A str is taken as
            one stop string.
        stop_token_ids: token ids that end generation (finish reason ``"stop"``); the id is
            reported in the token ids, its text is not added to the output text.
        ignore_eos: keep generating past the tokenizer's end-of-sequence token(s).
        logits_processors: callables applied in order to each next-token logits row before
            sampling (see ``LogitsProcessor``); structured output uses them to mask tokens.

    Raises:
        ValueError: a value outside the ranges above, naming the field.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int = 16
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logits_processors: tuple[LogitsProcessor, ...] = ()

    def __post_init__(self) -> None:
        stop: str | Iterable[str] = self.stop
        object.__setattr__(self, "stop", (stop,) if isinstance(stop, str) else tuple(stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        object.__setattr__(self, "logits_processors", tuple(self.logits_processors))
        if not isinstance(self.temperature, (int, float)) or not self.temperature >= 0.0:
            raise ValueError(f"temperature: expected a float >= 0, got {self.temperature!r}")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(f"top_k: expected an int >= -1 (0 or -1 = off), got {self.top_k!r}")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p: expected a float in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            raise ValueError(f"seed: expected None or an int >= 0, got {self.seed!r}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 0:
            raise ValueError(f"max_tokens: expected an int >= 0, got {self.max_tokens!r}")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop: expected non-empty strings, got {s!r}")
        for t in self.stop_token_ids:
            if not isinstance(t, int) or t < 0:
                raise ValueError(f"stop_token_ids: expected ints >= 0, got {t!r}")

        for proc in self.logits_processors:
            if not callable(proc):
                raise ValueError(f"logits_processors: expected callables, got {proc!r}")

    @property
    def greedy(self) -> bool:
        """True when tokens are picked by argmax (temperature 0)."""
        return self.temperature == 0.0
