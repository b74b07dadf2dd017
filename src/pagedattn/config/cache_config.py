"""CacheConfig: the page pool, sliding window and sink tokens, the KV dtype."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pagedattn.config.model_config import ModelConfig

POSITION_MODES = ("absolute", "shifted")
KV_CACHE_DTYPES = ("float32", "float16", "int8")


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
            kernels still compute in float32; llama.cpp's default KV type) or ``"int8"``
            (quantized pages: int8 codes plus a float32 scale per token and KV head, so
            ``(head_dim + 4) / (2 head_dim)`` of float16's bytes; symmetric absmax / 127, round
            to nearest-even; the kernels fold the scales in, in float32; head_dim a multiple of
            4). NumPy backend only.
        disable_hybrid_kv_cache_manager: False (the default): on a model whose layers mix
            full attention with sliding windows (Gemma 2 and 3), each kind of layer keeps its
            own page tables and a sliding layer only the pages its window still sees
            (:mod:`pagedattn.cache.layer_groups`); True: every layer keeps every page (vLLM's
            flag of the same name), the same text with more memory.
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
    disable_hybrid_kv_cache_manager: bool = False

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
        layers' K and V in ``kv_cache_dtype``, an int8 row's scale included)."""
        if self.num_pages is not None:
            return self.num_pages
        mib = 256.0 if self.kv_cache_mib is None else self.kv_cache_mib
        row = model.head_dim + (4 if self.kv_cache_dtype == "int8" else 0)  # int8: its scale
        elements = model.num_layers * 2 * model.num_kv_heads * self.page_size * row
        page_bytes = elements * np.dtype(self.kv_cache_dtype).itemsize
        num_pages = int(mib * 2**20) // page_bytes
        if num_pages < 1:
            raise ValueError(
                f"CacheConfig.kv_cache_mib: {mib} MiB holds no page of {page_bytes} bytes"
            )
        return num_pages
