"""SamplingParams: what one request may ask for (validated on construction).

The field names and meanings follow vLLM's ``SamplingParams`` and the OpenAI completions API.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

# vLLM's (legacy) logits processor: (generated token ids so far, (vocab,) float32 logits of the
# next token) -> the logits to sample from. It may modify and return the given array.
LogitsProcessor = Callable[[Sequence[int], np.ndarray], np.ndarray]

# Per-request speculative decoding: "auto" drafts when the engine has speculation on and it
# pays; "off" never drafts for this request (its output is the same either way).
SPECULATIVE_DECODING = ("auto", "off")

MAX_LOGPROBS = 20  # most top-N alternatives per position (vLLM's default max_logprobs)


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each generated token, what to report and when to stop.

    The order a logits row goes through (vLLM v1's sampler): padded ids past the tokenizer's
    vocabulary masked; logprobs taken here (log-softmax of these raw logits); then
    ``logits_processors``, ``min_tokens``, ``logit_bias``, the repetition / frequency / presence
    penalties, temperature, ``min_p``, top-k, top-p.

    Attributes:
        n: completions returned per request (>= 1), each a child request of it (sharing the
            prompt's full pages through the prefix cache).
        best_of: completions generated (>= n, default n); the ``n`` with the highest
            ``cumulative_logprob`` are returned (only once all are finished).
        temperature: softmax temperature, ``>= 0``; ``0`` means greedy (exact argmax of the
            processed logits, no randomness).
        top_k: keep only the ``k`` most likely tokens; ``0`` or ``-1`` turns it off.
        top_p: nucleus sampling (Holtzman et al. 2019, arXiv 1904.09751): keep the smallest
            set of most likely tokens whose probability sums to at least ``top_p``, in (0, 1].
        min_p: drop tokens whose probability (after temperature) is below ``min_p`` times the
            most likely token's (Nguyen et al. 2024, arXiv 2407.01082), in [0, 1]; 0 = off.
        presence_penalty: in [-2, 2]; subtracted once from the logit of every token that
            already appears in the generated tokens (OpenAI's definition).
        frequency_penalty: in [-2, 2]; subtracted from a token's logit once per occurrence in
            the generated tokens (OpenAI's definition).
        repetition_penalty: > 0, 1 = off; a token seen in the prompt or the generated tokens
            has its logit divided by it when positive, multiplied when negative (Keskar et al.
            2019, CTRL, arXiv 1909.05858; HF's ``RepetitionPenaltyLogitsProcessor``).
        logit_bias: token id -> bias in [-100, 100] added to the logit; -100 bans the token
            (its logit becomes -inf). Ids must be inside the tokenizer's vocabulary (checked by
            the engine).
        seed: per-request random seed (``np.random.Generator(PCG64(seed))``); completion
            ``i`` of a request with ``n``/``best_of`` > 1 uses ``seed + i`` (vLLM's rule); None
            draws the seed from the engine's generator. On the default (NumPy) backend a
            request's logits are bitwise independent of what else shares its steps (see
            :class:`pagedattn.model.llama.LlamaModel`), so the same seed (or greedy sampling)
            gives the same tokens alone, in any batch and whenever others arrive, provided its
            prompt is cut into the same prefill chunks: chunks depend on the prompt's own
            length and the chunk budget, but a prefix-cache hit skips the cached pages and
            may change the result by float32 rounding (the cached KV was computed in another
            request's chunks).
        max_tokens: generate exactly this many tokens unless a stop comes first. ``0`` is
            allowed: the request finishes with reason ``"length"`` and no generated token
            (after computing the prompt when ``prompt_logprobs`` is asked, else at once).
        min_tokens: end-of-sequence and ``stop_token_ids`` are masked, and stop strings not
            checked, until this many tokens were generated (<= max_tokens).
        stop: strings that end generation; the matched stop string and everything after it
            never appear in the output text (unless ``include_stop_str_in_output``), also when
            streamed (text that may be the start of a stop string is held back until it is
            known not to be one). A str is taken as one stop string. A stop string that is a
            special token's text (e.g. ``<|im_start|>``) also stops when that token is sampled.
        stop_token_ids: token ids that end generation (finish reason ``"stop"``); the id is
            reported in the token ids, its text is not added to the output text.
        include_stop_str_in_output: keep the matched stop string at the end of the text.
        ignore_eos: keep generating past the tokenizer's end-of-sequence token(s).
        skip_special_tokens: leave special tokens (``<|im_end|>``...) out of the output text.
        logprobs: None, or N >= 0: report for every generated token its logprob, rank and the
            N most likely alternatives (at most ``max_logprobs``).
        prompt_logprobs: None, or N >= 0: the same for every prompt token (the first is None).
            The prompt is then computed in full (no prefix cache: a cached page has no logits).
        logits_processors: callables applied in order to each next-token logits row before
            sampling (see ``LogitsProcessor``); structured output uses them to mask tokens.
        allowed_token_ids: None, or the only ids that may be sampled (every other logit -inf;
            vLLM's ``allowed_token_ids``).
        bad_words_token_ids: token sequences never generated (vLLM's ``bad_words``): a
            sequence's last token is banned wherever the generated tokens end with the rest of
            it (a one-token sequence: everywhere).
        max_logprobs: the most alternatives ``logprobs`` / ``prompt_logprobs`` may ask for
            (vLLM's ``--max-logprobs``; default ``MAX_LOGPROBS``; a server that allows the whole
            vocabulary raises it to the vocabulary size).
        speculative_decoding: ``"auto"`` (default: the engine drafts tokens for this request
            when its speculation is on and pays) or ``"off"`` (never). Speculation never
            changes a request's tokens or logprobs; requests with ``logits_processors`` are
            never drafted for.

    Raises:
        ValueError: a value outside the ranges above, naming the field.
    """

    n: int = 1
    best_of: int | None = None
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: Mapping[int, float] | None = None
    seed: int | None = None
    max_tokens: int = 16
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    logits_processors: tuple[LogitsProcessor, ...] = field(default=())
    speculative_decoding: str = "auto"
    allowed_token_ids: tuple[int, ...] | None = None
    bad_words_token_ids: tuple[tuple[int, ...], ...] = ()
    max_logprobs: int = MAX_LOGPROBS

    def __post_init__(self) -> None:
        stop: str | Iterable[str] = self.stop
        object.__setattr__(self, "stop", (stop,) if isinstance(stop, str) else tuple(stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        object.__setattr__(self, "logits_processors", tuple(self.logits_processors))
        if self.allowed_token_ids is not None:
            object.__setattr__(self, "allowed_token_ids", tuple(self.allowed_token_ids))
        object.__setattr__(
            self, "bad_words_token_ids", tuple(tuple(s) for s in self.bad_words_token_ids)
        )
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, Mapping):
                raise ValueError(
                    f"logit_bias: expected a mapping id -> bias, got {self.logit_bias!r}"
                )
            bias = {}
            for k, v in self.logit_bias.items():
                try:
                    key = int(k)
                except (TypeError, ValueError):
                    raise ValueError(f"logit_bias: keys must be token ids, got {k!r}") from None
                if key < 0 or not _is_number(v) or not -100.0 <= v <= 100.0:
                    raise ValueError(
                        "logit_bias: expected token id >= 0 -> bias in [-100, 100], "
                        f"got {k!r}: {v!r}"
                    )
                bias[key] = float(v)
            object.__setattr__(self, "logit_bias", bias)
        self._check_ranges()

    def _check_ranges(self) -> None:
        def bad(name: str, expected: str) -> ValueError:
            return ValueError(f"{name}: expected {expected}, got {getattr(self, name)!r}")

        def is_int(x: object) -> bool:
            return isinstance(x, int) and not isinstance(x, bool)

        if not is_int(self.n) or self.n < 1:
            raise bad("n", "an int >= 1")
        if self.best_of is not None and (not is_int(self.best_of) or self.best_of < self.n):
            raise bad("best_of", f"None or an int >= n ({self.n})")
        if not isinstance(self.temperature, (int, float)) or not self.temperature >= 0.0:
            raise bad("temperature", "a float >= 0")
        if not is_int(self.top_k) or self.top_k < -1:
            raise bad("top_k", "an int >= -1 (0 or -1 = off)")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", "a float in (0, 1]")
        if not _is_number(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", "a float in [0, 1]")
        for name in ("presence_penalty", "frequency_penalty"):
            if not _is_number(getattr(self, name)) or not -2.0 <= getattr(self, name) <= 2.0:
                raise bad(name, "a float in [-2, 2]")
        if not _is_number(self.repetition_penalty) or not self.repetition_penalty > 0.0:
            raise bad("repetition_penalty", "a float > 0")
        if self.seed is not None and (not is_int(self.seed) or self.seed < 0):
            raise bad("seed", "None or an int >= 0")
        if not is_int(self.max_tokens) or self.max_tokens < 0:
            raise bad("max_tokens", "an int >= 0")
        if not is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_tokens:
            raise bad("min_tokens", f"an int in [0, max_tokens={self.max_tokens}]")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop: expected non-empty strings, got {s!r}")
        for t in self.stop_token_ids:
            if not is_int(t) or t < 0:
                raise ValueError(f"stop_token_ids: expected ints >= 0, got {t!r}")
        if not is_int(self.max_logprobs) or self.max_logprobs < 0:
            raise bad("max_logprobs", "an int >= 0")
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is not None and (not is_int(v) or not 0 <= v <= self.max_logprobs):
                raise bad(name, f"None or an int in [0, {self.max_logprobs}]")
        if self.allowed_token_ids is not None and (
            not self.allowed_token_ids
            or not all(is_int(t) and t >= 0 for t in self.allowed_token_ids)
        ):
            raise bad("allowed_token_ids", "None or a non-empty list of ids >= 0")
        for seq in self.bad_words_token_ids:
            if not seq or not all(is_int(t) and t >= 0 for t in seq):
                raise bad("bad_words_token_ids", "non-empty sequences of ids >= 0")
        if self.speculative_decoding not in SPECULATIVE_DECODING:
            raise bad("speculative_decoding", f"one of {SPECULATIVE_DECODING}")
        for proc in self.logits_processors:
            if not callable(proc):
                raise ValueError(f"logits_processors: expected callables, got {proc!r}")

    def check_vocab(self, vocab_size: int) -> None:
        """Raises ValueError naming the field when a ``logit_bias`` or ``stop_token_ids`` id is
        outside ``[0, vocab_size)`` (the tokenizer's vocabulary)."""
        checks = (
            ("logit_bias", list(self.logit_bias or {})),
            ("stop_token_ids", self.stop_token_ids),
            ("allowed_token_ids", self.allowed_token_ids or ()),
            ("bad_words_token_ids", [t for s in self.bad_words_token_ids for t in s]),
        )
        for name, ids in checks:
            bad = [t for t in ids if not 0 <= t < vocab_size]
            if bad:
                raise ValueError(f"{name}: token ids must be in [0, {vocab_size}), got {bad[:5]}")

    @property
    def greedy(self) -> bool:
        """True when tokens are picked by argmax (temperature 0)."""
        return self.temperature == 0.0

    @property
    def num_completions(self) -> int:
        """Sequences generated: ``best_of`` when set, else ``n``."""
        return self.n if self.best_of is None else self.best_of

    @property
    def needs_logprob(self) -> bool:
        """Sampled tokens' logprobs are computed (asked, or best_of ranks by them)."""
        return self.logprobs is not None or self.num_completions > self.n

    @property
    def has_penalties(self) -> bool:
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
        )
