"""SchedulerConfig: continuous-batching limits and speculative decoding."""

from __future__ import annotations

from dataclasses import dataclass

# Draft-free speculative decoding methods (None = off): "ngram" proposes the tokens that followed
# the latest earlier occurrence of the sequence's last n tokens (prompt lookup).
SPECULATIVE_METHODS = ("ngram",)
# What an engine option may say: a method, "none" (off), or "auto" (the default: ngram where the
# engine can verify drafts bitwise, i.e. the numpy backend without a sliding window, else off).
SPECULATIVE_CHOICES = ("auto", "none", *SPECULATIVE_METHODS)


def resolve_speculative(value: str | None, backend: str, sliding_window: int | None) -> str | None:
    """The SchedulerConfig.speculative an engine option stands for (see SPECULATIVE_CHOICES)."""
    if value is None or value == "none":
        return None
    if value == "auto":
        return "ngram" if backend == "numpy" and sliding_window is None else None
    return value  # a method (SchedulerConfig rejects an unknown one, naming the field)


@dataclass(frozen=True)
class SchedulerConfig:
    """Continuous batching limits (vLLM's ``SchedulerConfig``).

    Attributes:
        max_num_seqs: most sequences in one step, >= 1.
        max_num_batched_tokens: most new tokens in one step (the token budget), >= 1.
        enable_chunked_prefill: split a prompt longer than the remaining budget into chunks;
            when off a prompt is prefilled in one step, so it must fit the budget whole.
        long_prefill_token_threshold: the chunk size of chunked prefill: a prompt is computed
            in chunks ending at multiples of this many tokens (or at its end), at most one chunk
            per step, so a long prompt never takes more than this many tokens of a step from
            the running streams (vLLM's ``long_prefill_token_threshold``), and its chunk
            boundaries depend only on its own length and this number, never on what else is
            scheduled (one exception: under page pressure the newest sequence may cut a chunk
            short instead of being preempted). None = ``max(1, max_num_batched_tokens // 8)``
            (256 tokens by default: on a CPU a chunk's step is what the streams wait for);
            must not exceed ``max_num_batched_tokens``.
        prefill_attention_tokens: the context length at which a prompt token's attention costs
            about as much as the rest of its work (its matmuls; about 3k tokens for the
            embedded SmolLM2 on a CPU, measured). A chunk starting at position ``s`` counts
            ``1 + s / this`` per token against ``long_prefill_token_threshold``, so the late
            chunks of a long prompt (which attend to everything before them) are shorter and a
            step that mixes them with decodes stays as cheap as one with an early chunk; the
            step planner bounds all of a step's prompt pieces by the same cost while streams
            decode. Boundaries still depend only on the prompt's positions and these numbers.
            None = every token counts 1.
        max_model_len: most tokens (prompt + generated) in one request. None = the model's
            ``max_position_embeddings`` in absolute mode without a sliding window, unbounded
            otherwise (a window bounds memory; positions past the context extrapolate RoPE in
            absolute mode and stay inside the cache in shifted mode).
        speculative: None (off) or ``"ngram"``: each decoding sequence may propose up to
            ``num_speculative_tokens`` tokens by n-gram lookup in its own prompt and output,
            verified in the same step as extra decode rows (:mod:`pagedattn.engine.spec`);
            tokens and logprobs are bitwise those of plain decoding.
        num_speculative_tokens: most tokens one sequence drafts per step, in [1, 64] (the
            per-request number adapts to its acceptance, up to this).
        ngram_min, ngram_max: the n-gram lengths looked up, longest first, 1 <= min <= max <= 16.
        speculative_token_share: drafts are added only while the step's tokens, drafts
            included, stay within this share of ``max_num_batched_tokens`` (in (0, 1]): a large
            batch already reads each weight once for many rows, so drafts would only add work.
        speculative_row_cost: a verify row's cost relative to a one-row decode step, which
            sets how many drafts pay (:mod:`pagedattn.engine.spec.policy`), in [0, 1]; 0
            treats rows as free: every sequence drafts ``num_speculative_tokens`` whenever an
            n-gram matches.

    Raises:
        ValueError: a value outside the ranges above, naming the field.
    """

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    enable_chunked_prefill: bool = True
    max_model_len: int | None = None
    long_prefill_token_threshold: int | None = None
    prefill_attention_tokens: int | None = 3072
    speculative: str | None = None
    num_speculative_tokens: int = 8
    ngram_min: int = 2
    ngram_max: int = 4
    speculative_token_share: float = 1 / 32
    speculative_row_cost: float = 0.15

    def __post_init__(self) -> None:
        self._check_speculative()
        for field in ("max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"SchedulerConfig.{field}: expected an int >= 1, got {value!r}")
        if self.max_model_len is not None and (
            not isinstance(self.max_model_len, int) or self.max_model_len < 1
        ):
            raise ValueError(
                f"SchedulerConfig.max_model_len: expected None or >= 1, got {self.max_model_len!r}"
            )
        a = self.prefill_attention_tokens
        if a is not None and (not isinstance(a, int) or isinstance(a, bool) or a < 1):
            raise ValueError(
                f"SchedulerConfig.prefill_attention_tokens: expected None or an int >= 1, got {a!r}"
            )
        t = self.long_prefill_token_threshold
        if t is not None and (not isinstance(t, int) or not 1 <= t <= self.max_num_batched_tokens):
            raise ValueError(
                "SchedulerConfig.long_prefill_token_threshold: expected None or an int in "
                f"[1, max_num_batched_tokens={self.max_num_batched_tokens}], got {t!r}"
            )

    def prefill_cost(self, start: int, num_tokens: int) -> float:
        """The work of computing ``num_tokens`` prompt tokens from position ``start``, in
        tokens of an empty context: each counts ``1 + start / prefill_attention_tokens`` (its
        attention over the ``start`` tokens before the chunk; see the attributes)."""
        ref = self.prefill_attention_tokens
        return float(num_tokens) if ref is None else num_tokens * (1 + start / ref)

    def prefill_chunk_end(self, start: int) -> int:
        """Where the prefill chunk holding position ``start`` ends: chunks run from 0, the one
        starting at ``s`` holding ``prefill_chunk_size / (1 + s / prefill_attention_tokens)``
        tokens (at least 1; see the attributes)."""
        size = self.prefill_chunk_size
        ref = self.prefill_attention_tokens
        if ref is None:
            return (start // size + 1) * size
        end = 0
        while end <= start:
            end += max(1, int(size / (1 + end / ref) + 0.5))
        return end

    def _check_speculative(self) -> None:
        if self.speculative is not None and self.speculative not in SPECULATIVE_METHODS:
            raise ValueError(
                f"SchedulerConfig.speculative: expected None or one of {SPECULATIVE_METHODS}, "
                f"got {self.speculative!r}"
            )
        ints = {"num_speculative_tokens": 64, "ngram_min": 16, "ngram_max": 16}
        for field, most in ints.items():
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= most:
                raise ValueError(
                    f"SchedulerConfig.{field}: expected an int in [1, {most}], got {value!r}"
                )
        cost = self.speculative_row_cost
        if isinstance(cost, bool) or not isinstance(cost, int | float) or not 0 <= cost <= 1:
            raise ValueError(
                f"SchedulerConfig.speculative_row_cost: expected a float in [0, 1], got {cost!r}"
            )
        if self.ngram_min > self.ngram_max:
            raise ValueError(
                f"SchedulerConfig.ngram_min: expected <= ngram_max ({self.ngram_max}), "
                f"got {self.ngram_min}"
            )
        share = self.speculative_token_share
        if not isinstance(share, (int, float)) or not 0.0 < share <= 1.0:
            raise ValueError(
                f"SchedulerConfig.speculative_token_share: expected a float in (0, 1], "
                f"got {share!r}"
            )

    @property
    def prefill_chunk_size(self) -> int:
        """The resolved ``long_prefill_token_threshold`` (tokens)."""
        t = self.long_prefill_token_threshold
        return max(1, self.max_num_batched_tokens // 8) if t is None else t
