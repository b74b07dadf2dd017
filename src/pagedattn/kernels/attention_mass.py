"""Attention mass per page of a decode step: the opt-in output H2O-style eviction needs.

Heavy-Hitter Oracle (H2O, Zhang et al. 2023, arXiv 2306.14048) keeps the keys that have
received the most attention. Here the unit is a page: the mass of page ``i`` for sequence ``s``
is ``sum_h sum_{j in page i, j visible} exp(scale * q[s, h] . k_j - lse[s, h])``, the softmax
probability the decode step gave that page's keys, summed over query heads. The normaliser
``lse`` is the decode kernel's own log-sum-exp (``paged_attention_decode(..., return_lse=True)``),
so the masses are that kernel's softmax weights; this pass re-scores only the resident keys and
reads no values. It runs only when a caller asks for it: the default decode path is unchanged.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from pagedattn.kernels.kv_dtype import kernel_cache, load_f32
from pagedattn.kernels.kv_int8 import row_scale
from pagedattn.kernels.paged import F32Array, paged_attention_decode
from pagedattn.kernels.paged_checks import IntArray, check_array, check_caches, int_array


@numba.njit(parallel=True, cache=True, nogil=True)
def _mass_kernel(
    q: np.ndarray,
    q_sink: np.ndarray,
    k_cache: np.ndarray,
    tables: np.ndarray,
    ctx: np.ndarray,
    lse: np.ndarray,
    scale: np.float32,
    window: int,
    num_sink_tokens: int,
    out: np.ndarray,
) -> None:  # pragma: no cover - compiled
    num_seqs, num_heads, head_dim = q.shape
    page_size = k_cache.shape[2]
    group = num_heads // k_cache.shape[1]
    for s in numba.prange(num_seqs):
        n = ctx[s]
        p = n - 1
        for i in range(-(-n // page_size)):
            pid = tables[s, i]
            if pid < 0:
                continue
            total = 0.0
            for off in range(page_size):
                j = i * page_size + off
                if j >= n:
                    break
                if window > 0 and j <= p - window and j >= num_sink_tokens:
                    continue
                for h in range(num_heads):
                    if lse[s, h] == -np.inf:
                        continue
                    kvh = h // group
                    dot = 0.0
                    if j < num_sink_tokens:
                        for d in range(head_dim):
                            dot += q_sink[s, h, d] * load_f32(k_cache[pid, kvh, off, d])
                    else:
                        for d in range(head_dim):
                            dot += q[s, h, d] * load_f32(k_cache[pid, kvh, off, d])
                    dot *= row_scale(k_cache, pid, kvh, off)
                    total += math.exp(scale * dot - lse[s, h])
            out[s, i] = total


def page_attention_mass(
    q: F32Array,
    k_cache: F32Array,
    page_tables: IntArray,
    context_lens: IntArray,
    lse: F32Array,
    *,
    scale: float | None = None,
    sliding_window: int | None = None,
    num_sink_tokens: int = 0,
    q_sink: F32Array | None = None,
) -> F32Array:
    """Softmax mass each resident page received in one decode step, summed over query heads.

    Args:
        q: float32 ``(num_seqs, num_heads, head_dim)``, the queries given to
            :func:`pagedattn.kernels.paged_attention_decode`.
        k_cache: float32, float16 or int8 ``(num_pages, num_kv_heads, page_size, head_dim)``
            (int8: ``head_dim + 4`` wide, :mod:`pagedattn.kernels.kv_int8`).
        page_tables: integer ``(num_seqs, max_pages_per_seq)``; ``-1`` = absent (mass 0).
        context_lens: integer ``(num_seqs,)``.
        lse: float32 ``(num_seqs, num_heads)``, the decode kernel's log-sum-exp of the same step.
        scale, sliding_window, num_sink_tokens, q_sink: exactly as given to the decode kernel.

    Returns:
        float32 ``(num_seqs, max_pages_per_seq)``: per page, the attention probability its
        visible keys received, summed over the ``num_heads`` heads (a row sums to ``num_heads``
        when every head saw a key); 0 for absent pages and pages past the context.

    Raises:
        ValueError: a wrong dtype/shape, naming the expected shape.
    """
    num_pages, _, _, head_dim = check_caches(k_cache, k_cache)
    if q.ndim != 3 or q.shape[2] != head_dim:
        raise ValueError(f"q: expected (num_seqs, num_heads, head_dim={head_dim}), got {q.shape}")
    num_seqs, num_heads = q.shape[0], q.shape[1]
    check_array("q", q, (num_seqs, num_heads, head_dim), "(num_seqs, num_heads, head_dim)")
    q_sink = q if q_sink is None else q_sink
    check_array("q_sink", q_sink, q.shape, "(num_seqs, num_heads, head_dim)")
    check_array("lse", lse, (num_seqs, num_heads), "(num_seqs, num_heads)")
    tables = int_array("page_tables", page_tables, (num_seqs, -1), "(num_seqs, max_pages_per_seq)")
    ctx = int_array("context_lens", context_lens, (num_seqs,), "(num_seqs,)")
    if tables.size and (tables.max() >= num_pages or tables.min() < -1):
        raise ValueError(f"page_tables: expected page ids in [0, {num_pages}) or -1")
    scale32 = np.float32(1.0 / math.sqrt(head_dim) if scale is None else scale)
    window = 0 if sliding_window is None else int(sliding_window)
    out = np.zeros(tables.shape, np.float32)
    _mass_kernel(
        np.ascontiguousarray(q),
        np.ascontiguousarray(q_sink),
        kernel_cache(k_cache),
        tables,
        ctx,
        np.ascontiguousarray(lse),
        scale32,
        window,
        num_sink_tokens,
        out,
    )
    return out


def decode_adding_page_mass(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    page_tables: np.ndarray,
    context_lens: np.ndarray,
    *,
    sliding_window: int | None,
    num_sink_tokens: int,
    q_sink: np.ndarray | None,
    attention_mass: np.ndarray,
) -> np.ndarray:
    """Decode attention (:func:`pagedattn.kernels.paged.paged_attention_decode`, the default
    path's kernel and splits) that also adds to ``attention_mass`` (float32, the shape of
    ``page_tables``) the softmax mass each page's keys received, summed over heads
    (:func:`page_attention_mass`). Returns the attention output (num_seqs, num_heads,
    head_dim)."""
    attn, lse = paged_attention_decode(
        q,
        k_cache,
        v_cache,
        page_tables,
        context_lens,
        sliding_window=sliding_window,
        num_sink_tokens=num_sink_tokens,
        q_sink=q_sink,
        return_lse=True,
    )
    attention_mass += page_attention_mass(
        q,
        k_cache,
        page_tables,
        context_lens,
        lse,
        sliding_window=sliding_window,
        num_sink_tokens=num_sink_tokens,
        q_sink=q_sink,
    )
    out: np.ndarray = attn
    return out
