"""Frozen, validated configuration dataclasses shared by every layer."""

from __future__ import annotations

import math
from dataclasses import dataclass
from dataclasses import field as dataclass_field

import numpy as np

from pagedattn.backend_spec import validate_backend

# How 4-bit projections meet their inputs (pagedattn.model.quantized.qmatmul): float32 is exact,
# int8 (opt-in, not exact) quantizes them per 32-input block as llama.cpp does.
ACTIVATIONS = ("float32", "int8")
# Draft-free speculative decoding methods (None = off): "ngram" proposes the tokens that followed
# the latest earlier occurrence of the sequence's last n tokens (prompt lookup).
SPECULATIVE_METHODS = ("ngram",)


@dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a Llama-architecture decoder.

    ``rope_freq_factors``: None (plain RoPE), or one positive divisor per rotary pair
    (head_dim // 2 floats) applied to the frequencies ``rope_theta^(-2i/head_dim)``: Llama-3.1
    scaling (GGUF ``rope_freqs.weight``, HF ``rope_scaling: {rope_type: llama3}``).
    ``rope_scaling`` names where they came from ("" for none, "llama3").

    Raises:
        ValueError: a non-positive size, num_heads not a multiple of num_kv_heads, or
            rope_freq_factors of the wrong length or not all positive.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    architecture: str = "llama"
    name: str = ""
    rope_scaling: str = ""
    rope_freq_factors: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        for field in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
        ):
            value = getattr(self, field)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelConfig.{field} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.rope_theta <= 0 or self.rms_norm_eps <= 0:
            raise ValueError("rope_theta and rms_norm_eps must be positive")
        factors = self.rope_freq_factors
        if factors is not None and (
            len(factors) != self.head_dim // 2 or not all(f > 0 for f in factors)
        ):
            raise ValueError(
                f"ModelConfig.rope_freq_factors: expected {self.head_dim // 2} positive values, "
                f"got {len(factors)}"
            )

    @property
    def rope_scaling_key(self) -> str:
        """Canonical text of the RoPE scaling ("" for none): part of the prefix-cache namespace,
        so KV rotated with other frequencies is never reused."""
        if self.rope_freq_factors is None:
            return ""
        values = ",".join(float(f).hex() for f in self.rope_freq_factors)
        return f"{self.rope_scaling or 'freq_factors'}:{values}"

    @property
    def num_queries_per_kv(self) -> int:
        """GQA group size: query head h reads kv head h // num_queries_per_kv."""
        return self.num_heads // self.num_kv_heads


POSITION_MODES = ("absolute", "shifted")
KV_CACHE_DTYPES = ("float32", "float16")


@dataclass(frozen=True)
class CacheConfig:
    """The paged KV cache: how many pages, their size, prefix caching and eviction.

    Attributes:
        page_size: tokens per page, >= 1.
        num_pages: pages in the pool, >= 1; None sizes the pool from ``kv_cache_mib``.
        kv_cache_mib: KV memory budget in MiB (K and V of every layer, in ``kv_cache_dtype``),
            used when ``num_pages`` is None; None with ``num_pages`` None means 256 MiB.
        kv_cache_dtype: storage dtype of the KV pool: ``"float32"`` (exact, the default) or
            ``"float16"`` (half the bytes, so twice the pages per MiB and half the memory a
            decode step streams; keys and values rounded to nearest-even when written, the
            kernels still compute in float32; llama.cpp's default KV type). NumPy backend only.
        enable_prefix_caching: reuse full pages whose prefix hash matches (vLLM APC).
        sliding_window: W >= 1: a query at position p sees keys p - W < j <= p, and pages
            that leave the window are freed; None = full attention.
        num_sink_tokens: S >= 0, the first S tokens stay visible and resident (StreamingLLM,
            arXiv 2309.17453); needs ``sliding_window``.
        position_mode: ``"absolute"`` (keys keep their RoPE positions; without a window a
            request is bounded by the model context) or ``"shifted"`` (positions counted inside
            the cache, so a request may run past the model context; needs ``sliding_window``).

    Raises:
        ValueError: a value outside the ranges above, naming the field.
    """

    page_size: int = 16
    num_pages: int | None = None
    kv_cache_mib: float | None = None
    enable_prefix_caching: bool = True
    sliding_window: int | None = None
    num_sink_tokens: int = 0
    position_mode: str = "absolute"
    kv_cache_dtype: str = "float32"

    def __post_init__(self) -> None:
        if not isinstance(self.page_size, int) or self.page_size < 1:
            raise ValueError(f"CacheConfig.page_size: expected an int >= 1, got {self.page_size!r}")
        if self.num_pages is not None and (
            not isinstance(self.num_pages, int) or self.num_pages < 1
        ):
            raise ValueError(
                f"CacheConfig.num_pages: expected None or >= 1, got {self.num_pages!r}"
            )
        if self.kv_cache_mib is not None and not self.kv_cache_mib > 0:
            raise ValueError(
                f"CacheConfig.kv_cache_mib: expected None or > 0, got {self.kv_cache_mib!r}"
            )
        if self.sliding_window is not None and (
            not isinstance(self.sliding_window, int) or self.sliding_window < 1
        ):
            raise ValueError(
                f"CacheConfig.sliding_window: expected None or an int >= 1, "
                f"got {self.sliding_window!r}"
            )
        if not isinstance(self.num_sink_tokens, int) or self.num_sink_tokens < 0:
            raise ValueError(
                f"CacheConfig.num_sink_tokens: expected an int >= 0, got {self.num_sink_tokens!r}"
            )
        if self.num_sink_tokens and self.sliding_window is None:
            raise ValueError("CacheConfig.num_sink_tokens: needs sliding_window (got None)")
        if self.position_mode not in POSITION_MODES:
            raise ValueError(
                f"CacheConfig.position_mode: expected one of {POSITION_MODES}, "
                f"got {self.position_mode!r}"
            )
        if self.position_mode == "shifted" and self.sliding_window is None:
            raise ValueError("CacheConfig.position_mode 'shifted': needs sliding_window (got None)")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"CacheConfig.kv_cache_dtype: expected one of {KV_CACHE_DTYPES}, "
                f"got {self.kv_cache_dtype!r}"
            )

    def resolve_num_pages(self, model: ModelConfig) -> int:
        """Pages in the pool: ``num_pages``, else the KV budget over one page's bytes (all
        layers' K and V in ``kv_cache_dtype``)."""
        if self.num_pages is not None:
            return self.num_pages
        mib = 256.0 if self.kv_cache_mib is None else self.kv_cache_mib
        elements = model.num_layers * 2 * model.num_kv_heads * self.page_size * model.head_dim
        page_bytes = elements * np.dtype(self.kv_cache_dtype).itemsize
        num_pages = int(mib * 2**20) // page_bytes
        if num_pages < 1:
            raise ValueError(
                f"CacheConfig.kv_cache_mib: {mib} MiB holds no page of {page_bytes} bytes"
            )
        return num_pages


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
            short instead of being preempted). None = ``max(1, max_num_batched_tokens // 4)``;
            must not exceed ``max_num_batched_tokens``.
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

    Raises:
        ValueError: a value outside the ranges above, naming the field.
    """

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    enable_chunked_prefill: bool = True
    max_model_len: int | None = None
    long_prefill_token_threshold: int | None = None
    speculative: str | None = None
    num_speculative_tokens: int = 8
    ngram_min: int = 2
    ngram_max: int = 4
    speculative_token_share: float = 1 / 32

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
        t = self.long_prefill_token_threshold
        if t is not None and (not isinstance(t, int) or not 1 <= t <= self.max_num_batched_tokens):
            raise ValueError(
                "SchedulerConfig.long_prefill_token_threshold: expected None or an int in "
                f"[1, max_num_batched_tokens={self.max_num_batched_tokens}], got {t!r}"
            )

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
        return max(1, self.max_num_batched_tokens // 4) if t is None else t


@dataclass(frozen=True)
class EngineConfig:
    """Everything ``LLMEngine`` needs besides the model itself.

    Attributes:
        model: path of a GGUF file or safetensors folder; None = the embedded default model.
        cache: the KV cache configuration.
        scheduler: the batching configuration.
        seed: seed of the engine generator that unseeded requests draw their own seeds from.
        kv_store: the persistent KV tier: a directory, or ``redis://HOST:PORT/DB``; None = none.
        backend: array backend of the model and page pool: ``numpy`` (default), ``torch``
            (``cupy`` is refused by the engine: it serves KVStream and the kernels).
        device: ``cpu`` or ``cuda``; None = the backend's default (see
            :mod:`pagedattn.backends`).
        activations: ``float32`` (exact, the default) or ``int8`` (numpy backend: 4-bit
            projections on int8-quantized inputs, as llama.cpp; see
            :class:`pagedattn.model.llama.LlamaModel`).
        kv_store_key: shared secret (>= 16 bytes) that signs every record of the tier
            (HMAC-SHA256); records it did not sign are refused. None = unsigned records
            (kept out of ``repr``).
        kv_store_deadline_s: the most seconds one step waits on the tier for lookups
            (> 0): pages not fetched by then are recomputed, and counted.

    Raises:
        ValueError: a negative seed, a cache/scheduler of the wrong type, an empty kv_store, a
            float16 KV cache on another backend than numpy;
            pagedattn.backends.BackendError (a ValueError): an unknown or invalid pair.
    """

    model: str | None = None
    cache: CacheConfig = CacheConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    seed: int = 0
    kv_store: str | None = None
    backend: str = "numpy"
    device: str | None = None
    activations: str = "float32"
    kv_store_key: str | None = dataclass_field(default=None, repr=False)
    kv_store_deadline_s: float = 0.5

    def __post_init__(self) -> None:
        validate_backend(self.backend, self.device)
        if self.activations not in ACTIVATIONS:
            raise ValueError(
                f"EngineConfig.activations: expected one of {ACTIVATIONS}, got {self.activations!r}"
            )
        if not isinstance(self.cache, CacheConfig):
            raise ValueError(f"EngineConfig.cache: expected a CacheConfig, got {self.cache!r}")
        if not isinstance(self.scheduler, SchedulerConfig):
            raise ValueError(
                f"EngineConfig.scheduler: expected a SchedulerConfig, got {self.scheduler!r}"
            )
        if self.cache.kv_cache_dtype != "float32" and self.backend != "numpy":
            raise ValueError(
                f"CacheConfig.kv_cache_dtype {self.cache.kv_cache_dtype!r}: the numpy backend "
                f"only (got backend {self.backend!r})"
            )
        if self.scheduler.speculative is not None and (
            self.backend != "numpy" or self.cache.sliding_window is not None
        ):
            raise ValueError(
                "SchedulerConfig.speculative: needs the numpy backend (bitwise batch-invariant "
                f"decode rows) and no sliding_window; got backend {self.backend!r}, "
                f"sliding_window {self.cache.sliding_window!r}"
            )
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"EngineConfig.seed: expected an int >= 0, got {self.seed!r}")
        if self.kv_store is not None and (not isinstance(self.kv_store, str) or not self.kv_store):
            raise ValueError(
                "EngineConfig.kv_store: expected None, a directory or redis://HOST:PORT/DB, "
                f"got {self.kv_store!r}"
            )
        if self.kv_store_key is not None and not isinstance(self.kv_store_key, str):
            raise ValueError("EngineConfig.kv_store_key: expected None or a str")
        deadline = self.kv_store_deadline_s
        if isinstance(deadline, bool) or not isinstance(deadline, int | float):
            raise ValueError(
                f"EngineConfig.kv_store_deadline_s: expected seconds, got {deadline!r}"
            )
        if not (math.isfinite(deadline) and deadline > 0):
            raise ValueError(f"EngineConfig.kv_store_deadline_s: expected > 0, got {deadline!r}")
