"""Paged attention over the page pool: write_kv, decode and prefill (validated public API).

The KV cache of one layer is a pair of float32 or float16 arrays (:mod:`~.kv_dtype`)
``(num_pages, num_kv_heads, page_size, head_dim)`` (views ``kv[layer, 0]`` and
``kv[layer, 1]`` of the pool); token ``j`` of a sequence lives at slot
``page_tables[s, j // page_size] * page_size + j % page_size`` (PagedAttention,
Kwon et al. 2023, arXiv 2309.06180). Kernels read pages where they lie with an
online softmax (FlashAttention-2, Dao 2023, arXiv 2307.08691); the inner loops are
in :mod:`pagedattn.kernels.paged_decode_numba` (decode) and
:mod:`pagedattn.kernels.paged_prefill_numba` (prefill). Masks and softmax follow
:mod:`pagedattn.kernels.reference` exactly.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
from numba import njit

from pagedattn.kernels import paged_decode_numba, paged_prefill_numba
from pagedattn.kernels.aligned import empty_aligned
from pagedattn.kernels.kv_dtype import kernel_cache
from pagedattn.kernels.paged_checks import (
    IntArray,
    check_array,
    check_caches,
    check_pages,
    check_window,
    int_array,
    plan_slots,
)
from pagedattn.kernels.write_kv_numba import scatter_kv

F32Array = npt.NDArray[np.float32]
PREFILL_BLOCK_ROWS = 32  # query rows sharing each page tile (x group = vector lanes)
SPLIT_MIN_KEYS = 256  # a decode split (flash-decoding) covers at least this many keys
MAX_SPLITS = 8  # splits of one sequence's keys in decode


@njit(cache=True, nogil=True)
def _split_counts(
    context_lens: IntArray, window: int, min_keys: int, max_splits: int
) -> tuple[npt.NDArray[np.int32], int]:  # pragma: no cover - compiled
    """(splits, their maximum, 1 when empty) of :func:`split_counts` in one compiled pass."""
    splits = np.empty(context_lens.shape[0], np.int32)
    most = 1
    for s in range(context_lens.shape[0]):
        keys = int(context_lens[s])
        if window > 0:
            keys = min(keys, window)
        count = min(max(keys // min_keys, 1), max_splits)
        splits[s] = count
        most = max(most, count)
    return splits, most


def split_counts(
    context_lens: IntArray, sliding_window: int | None
) -> tuple[npt.NDArray[np.int32], int]:
    """:func:`decode_splits` and their maximum, in one compiled pass (a decode call's metadata
    costs microseconds, as the kernel does at batch 1).

    Args:
        context_lens: (num_seqs,) integer KV tokens of each sequence (validated: >= 0).
        sliding_window: W >= 1, or None.

    Returns:
        ``(splits, num_splits)``: (num_seqs,) int32 in [1, MAX_SPLITS], and their maximum
        (1 for no sequence), the number of partial states the kernel keeps per row.
    """
    window = 0 if sliding_window is None else int(sliding_window)
    return _split_counts(np.asarray(context_lens), window, SPLIT_MIN_KEYS, MAX_SPLITS)  # type: ignore[no-any-return]


def decode_splits(context_lens: IntArray, sliding_window: int | None) -> npt.NDArray[np.int32]:
    """How many key slices each sequence's decode attention is cut into (flash-decoding,
    Dao et al. 2023): one per SPLIT_MIN_KEYS keys it attends over, at most MAX_SPLITS.

    Chosen from each sequence's own length only (never the batch size or thread count), so a
    sequence's attention output is bitwise the same alone or inside any batch; the partial
    states are merged by log-sum-exp in split order (as :func:`merge_states` does).

    Args:
        context_lens: (num_seqs,) KV tokens of each sequence.
        sliding_window: W, or None.

    Returns:
        (num_seqs,) int32, each in [1, MAX_SPLITS].
    """
    return split_counts(context_lens, sliding_window)[0]


def _balanced_order(work: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """Order work items heaviest, lightest, 2nd heaviest, 2nd lightest, ...: under static
    scheduling every contiguous range of items (one thread's share) gets a similar load."""
    order = np.argsort(-work, kind="stable")
    half = (order.size + 1) // 2
    zigzag = np.empty_like(order)
    zigzag[0::2] = order[:half]
    zigzag[1::2] = order[half:][::-1]
    return zigzag


def write_kv(
    k_cache: F32Array, v_cache: F32Array, k: F32Array, v: F32Array, slot_mapping: IntArray
) -> None:
    """Store the new tokens' keys and values at their slots, in place.

    Args:
        k_cache, v_cache: float32, float16 or int8 (both alike) ``(num_pages, num_kv_heads,
            page_size, head_dim)`` (int8: ``head_dim + 4``, :mod:`~.kv_int8`), C-contiguous;
            float16 is rounded to nearest-even on write, int8 quantized per row.
        k, v: float32 ``(num_tokens, num_kv_heads, head_dim)``.
        slot_mapping: integer ``(num_tokens,)``; slot = page_id * page_size + offset, in
            ``[0, num_pages * page_size)``; ``-1`` skips the token (padding).

    Raises:
        ValueError: a wrong dtype/shape (naming the expected shape) or a slot out of range.
    """
    num_pages, num_kv_heads, page_size, head_dim = check_caches(k_cache, v_cache)
    if k.ndim != 3:
        raise ValueError(f"k: expected (num_tokens, num_kv_heads, head_dim), got {k.shape}")
    num_tokens = k.shape[0]
    expected = (num_tokens, num_kv_heads, head_dim)
    check_array("k", k, expected, "(num_tokens, num_kv_heads, head_dim)")
    check_array("v", v, expected, "(num_tokens, num_kv_heads, head_dim)")
    plan = plan_slots(slot_mapping, num_tokens, (num_pages, num_kv_heads, page_size, head_dim))
    scatter_kv(
        plan.keep, plan.pages, plan.offsets, k, v, kernel_cache(k_cache), kernel_cache(v_cache)
    )


def _common(
    q: F32Array,
    q_shape: str,
    k_cache: F32Array,
    v_cache: F32Array,
    scale: float | None,
    sliding_window: int | None,
    num_sink_tokens: int,
    q_sink: F32Array | None,
) -> tuple[F32Array, F32Array, np.float32, int, int]:
    _, num_kv_heads, page_size, head_dim = check_caches(k_cache, v_cache)
    if q.ndim != 3:
        raise ValueError(f"q: expected {q_shape}, got {q.shape}")
    num_heads = q.shape[1]
    if num_heads == 0 or num_heads % num_kv_heads != 0:
        raise ValueError(
            f"q: expected num_heads a multiple of num_kv_heads = {num_kv_heads}, got {q.shape}"
        )
    expected = (q.shape[0], num_heads, head_dim)
    check_array("q", q, expected, q_shape)
    q = np.ascontiguousarray(q)
    if q_sink is None:
        q_sink = q
    else:
        check_array("q_sink", q_sink, expected, q_shape)
        q_sink = np.ascontiguousarray(q_sink)
    window = check_window(sliding_window, num_sink_tokens)
    scale32 = np.float32(1.0 / math.sqrt(head_dim) if scale is None else scale)
    return q, q_sink, scale32, window, page_size


def paged_attention_decode(
    q: F32Array,
    k_cache: F32Array,
    v_cache: F32Array,
    page_tables: IntArray,
    context_lens: IntArray,
    *,
    scale: float | None = None,
    sliding_window: int | None = None,
    num_sink_tokens: int = 0,
    q_sink: F32Array | None = None,
    return_lse: bool = False,
) -> F32Array | tuple[F32Array, F32Array]:
    """Attention of one new token per sequence over its paged KV (the decode hot path).

    Args:
        q: float32 ``(num_seqs, num_heads, head_dim)``; ``num_heads % num_kv_heads == 0``.
        k_cache, v_cache: float32, float16 or int8 (both alike) ``(num_pages, num_kv_heads,
            page_size, head_dim)`` (int8: ``head_dim + 4``, :mod:`~.kv_int8`), C-contiguous;
            float16 is widened to float32 exactly, int8 rows' scales folded in.
        page_tables: integer ``(num_seqs, max_pages_per_seq)``; ``-1`` marks an absent page
            (evicted by the cache): its keys are not visible and it is never read.
        context_lens: integer ``(num_seqs,)``, KV tokens of each sequence including the new one
            (already written with :func:`write_kv`); 0 yields zeros.
        scale: multiplier of ``q . k``; defaults to ``1 / sqrt(head_dim)``.
        sliding_window: ``W >= 1`` keys ending at the query (itself included); None = all.
        num_sink_tokens: the first ``S`` keys stay visible whatever the window.
        q_sink: optional float32 like ``q``: used instead of ``q`` to score keys ``j < S``
            (StreamingLLM shifted positions, arXiv 2309.17453).
        return_lse: also return the natural-log log-sum-exp per (sequence, head).

    Returns:
        ``out`` float32 ``(num_seqs, num_heads, head_dim)`` [, ``lse`` float32 ``(num_seqs,
        num_heads)``, ``-inf`` where a row saw no key].

    Raises:
        ValueError: wrong dtype/shape (message names the expected shape), a context longer than
            the page table holds, or an out-of-range page id among the pages to be read.
    """
    q_shape = "(num_seqs, num_heads, head_dim)"
    q, q_sink, scale32, window, page_size = _common(
        q, q_shape, k_cache, v_cache, scale, sliding_window, num_sink_tokens, q_sink
    )
    num_seqs = q.shape[0]
    tables = int_array("page_tables", page_tables, (num_seqs, -1), "(num_seqs, max_pages_per_seq)")
    ctx = int_array("context_lens", context_lens, (num_seqs,), "(num_seqs,)")
    check_pages(tables, ctx, None, page_size, k_cache.shape[0], sliding_window, num_sink_tokens)
    splits, num_splits = split_counts(ctx, sliding_window)
    out, lse = paged_decode_numba.decode_attention(
        q, q_sink, kernel_cache(k_cache), kernel_cache(v_cache), tables, ctx, splits, scale32,
        window, num_sink_tokens, num_splits,
    )  # fmt: skip
    return (out, lse) if return_lse else out


def paged_attention_prefill(
    q: F32Array,
    k_cache: F32Array,
    v_cache: F32Array,
    page_tables: IntArray,
    query_start_loc: IntArray,
    context_lens: IntArray,
    *,
    scale: float | None = None,
    sliding_window: int | None = None,
    num_sink_tokens: int = 0,
    q_sink: F32Array | None = None,
    return_lse: bool = False,
) -> F32Array | tuple[F32Array, F32Array]:
    """Causal attention of each sequence's new tokens (flat batch) over its paged KV.

    Also serves chunked prefill: a sequence's earlier tokens may already be cached; its
    ``q_len`` new rows sit at positions ``context_len - q_len + i`` (bottom-right aligned).

    Args:
        q: float32 ``(num_tokens, num_heads, head_dim)``, the new tokens of all sequences, flat.
        k_cache, v_cache: float32, float16 or int8 (both alike) ``(num_pages, num_kv_heads,
            page_size, head_dim)`` (int8: ``head_dim + 4``, :mod:`~.kv_int8`), C-contiguous;
            float16 is widened to float32 exactly, int8 rows' scales folded in.
        page_tables: integer ``(num_seqs, max_pages_per_seq)``; ``-1`` = absent page, as in
            :func:`paged_attention_decode`.
        query_start_loc: integer ``(num_seqs + 1,)``, non-decreasing, from 0 to ``num_tokens``.
        context_lens: integer ``(num_seqs,)``, all KV tokens of each sequence including its new
            ones (already written with :func:`write_kv`); ``q_len <= context_len``.
        scale, sliding_window, num_sink_tokens, q_sink, return_lse: as in
            :func:`paged_attention_decode`.

    Returns:
        ``out`` float32 ``(num_tokens, num_heads, head_dim)`` [, ``lse`` float32
        ``(num_tokens, num_heads)``].

    Raises:
        ValueError: wrong dtype/shape (message names the expected shape), ``query_start_loc``
            not monotone or not ending at ``num_tokens``, ``q_len > context_len``, a context
            longer than the page table holds, or an out-of-range page id among the pages read.
    """
    q_shape = "(num_tokens, num_heads, head_dim)"
    q, q_sink, scale32, window, page_size = _common(
        q, q_shape, k_cache, v_cache, scale, sliding_window, num_sink_tokens, q_sink
    )
    tables = int_array("page_tables", page_tables, (-1, -1), "(num_seqs, max_pages_per_seq)")
    num_seqs = tables.shape[0]
    qsl = int_array("query_start_loc", query_start_loc, (num_seqs + 1,), "(num_seqs + 1,)")
    ctx = int_array("context_lens", context_lens, (num_seqs,), "(num_seqs,)")
    q_lens = np.diff(qsl)
    if qsl[0] != 0 or qsl[-1] != q.shape[0] or (q_lens < 0).any():
        raise ValueError(
            f"query_start_loc: expected non-decreasing (num_seqs + 1,) = ({num_seqs + 1},) "
            f"from 0 to num_tokens = {q.shape[0]}, got {qsl.tolist()}"
        )
    if (q_lens > ctx).any():
        s = int(np.argmax(q_lens > ctx))
        raise ValueError(
            f"context_lens: expected >= q_len (new tokens are already written), "
            f"sequence {s} has q_len {int(q_lens[s])} > context_len {int(ctx[s])}"
        )
    check_pages(tables, ctx, q_lens, page_size, k_cache.shape[0], sliding_window, num_sink_tokens)
    blocks = -(-q_lens // PREFILL_BLOCK_ROWS)
    item_seq = np.repeat(np.arange(num_seqs, dtype=np.int32), blocks)
    first = np.cumsum(blocks) - blocks
    item_q1st = (np.arange(item_seq.size) - np.repeat(first, blocks)) * PREFILL_BLOCK_ROWS
    # Keys each block reads (causal: later blocks read more), to balance the threads.
    last_pos = (
        ctx[item_seq]
        - q_lens[item_seq]
        + np.minimum(item_q1st + PREFILL_BLOCK_ROWS, q_lens[item_seq])
    )
    span = (
        last_pos
        if sliding_window is None
        else np.minimum(last_pos, sliding_window + PREFILL_BLOCK_ROWS)
    )
    order = _balanced_order(span.astype(np.float64))
    item_seq, item_q1st = item_seq[order], item_q1st[order]
    out = empty_aligned(q.shape)  # attn_output's input
    lse = np.empty(q.shape[:2], np.float32)
    paged_prefill_numba.prefill_kernel(
        q,
        q_sink,
        kernel_cache(k_cache),
        kernel_cache(v_cache),
        tables,
        qsl,
        ctx,
        item_seq,
        item_q1st.astype(np.int32),
        PREFILL_BLOCK_ROWS,
        scale32,
        window,
        num_sink_tokens,
        out,
        lse,
    )
    return (out, lse) if return_lse else out
