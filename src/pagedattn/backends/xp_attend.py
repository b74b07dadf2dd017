"""The array-namespace attention core: which pages a block of query rows reads (host), gathering
them by page id and exact softmax attention over them (device, any array library).

Written once against the array API standard (https://data-apis.org/array-api/) through
``array_api_compat``, so the same lines run on NumPy, torch (CPU or CUDA) and CuPy. Masks and
softmax follow :mod:`pagedattn.kernels.reference`: bottom-right aligned causal rows, a sliding
window of ``W`` keys with ``S`` sink keys kept visible (StreamingLLM, arXiv 2309.17453), GQA query
head ``h`` reading kv head ``h // group`` (arXiv 2305.13245), float32 softmax with max subtraction,
and zeros / ``-inf`` log-sum-exp for a row that sees no key.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt
from array_api_compat import device


def read_entries(
    tables: npt.NDArray[np.int32],
    p_first: npt.NDArray[np.int64],
    p_last: npt.NDArray[np.int64],
    page_size: int,
    sliding_window: int | None,
    num_sink_tokens: int,
) -> npt.NDArray[np.bool_]:
    """Which page-table entries hold a key some query row in ``[p_first, p_last]`` may see.

    A row at position ``p`` sees keys ``j <= p`` with ``j > p - W`` or ``j < S``; entries
    that are ``-1`` (absent pages) are never read. Rows ``p_last < p_first`` read nothing.

    Args:
        tables: int32 ``(num_seqs, max_pages_per_seq)``.
        p_first, p_last: int64 ``(num_seqs,)`` positions of the first and last query row.

    Returns:
        bool ``(num_seqs, max_pages_per_seq)``.
    """
    start = np.arange(tables.shape[1], dtype=np.int64)[None, :] * page_size
    first, last = p_first[:, None], p_last[:, None]
    lo = np.zeros_like(first) if sliding_window is None else first - sliding_window + 1
    sink_end = np.minimum(num_sink_tokens, last + 1)
    read = (start < sink_end) | ((start <= last) & (start + page_size > np.maximum(lo, sink_end)))
    return np.asarray(read & (last >= first) & (tables >= 0), dtype=bool)


def gather_plan(
    tables: npt.NDArray[np.int32],
    read: npt.NDArray[np.bool_],
    p_last: npt.NDArray[np.int64],
    page_size: int,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Page ids to gather per sequence (padded to the longest) and each gathered key's position.

    Returns:
        ``page_ids`` int64 ``(num_seqs, R)`` (padding reads page 0, masked out) and
        ``key_pos`` int64 ``(num_seqs, R * page_size)``: the key's position in its sequence,
        ``-1`` for padding and for slots after ``p_last`` (not yet visible to any row).
    """
    num_read = read.sum(axis=1)
    width = max(int(num_read.max(initial=0)), 1)
    cols = np.argsort(~read, axis=1, kind="stable")[:, :width]  # read entries first, in order
    valid = np.take_along_axis(read, cols, axis=1)
    page_ids = np.where(valid, np.take_along_axis(tables, cols, axis=1), 0).astype(np.int64)
    key_pos = cols[:, :, None].astype(np.int64) * page_size + np.arange(page_size)
    keep = valid[:, :, None] & (key_pos <= p_last[:, None, None])
    key_pos = np.where(keep, key_pos, -1).reshape(len(tables), width * page_size)
    return page_ids, key_pos


def gather_pages(xp: Any, cache: Any, page_ids: Any, num_seqs: int) -> Any:
    """``cache[page_ids]`` as ``(num_kv_heads, num_seqs, R * page_size, head_dim)``.

    Pages are taken along the cache's contiguous first axis (taking along a strided view
    makes torch copy the whole cache first), then reordered kv-head-major in one copy.

    Args:
        cache: float32 ``(num_pages, num_kv_heads, page_size, head_dim)``.
        page_ids: integer device array ``(num_seqs * R,)``.
    """
    _, num_kv_heads, page_size, head_dim = cache.shape
    tiles = xp.take(cache, page_ids, axis=0)  # (num_seqs * R, kv_heads, page_size, head_dim)
    tiles = xp.reshape(tiles, (num_seqs, -1, num_kv_heads, page_size, head_dim))
    tiles = xp.permute_dims(tiles, (2, 0, 1, 3, 4))
    return xp.reshape(tiles, (num_kv_heads, num_seqs, -1, head_dim))


def attend(
    xp: Any,
    q: Any,
    q_sink: Any | None,
    k: Any,
    v: Any,
    row_pos: Any,
    key_pos: Any,
    scale: float,
    sliding_window: int | None,
    num_sink_tokens: int,
) -> tuple[Any, Any]:
    """Exact softmax attention of query rows over gathered keys.

    Args:
        q: float32 ``(num_kv_heads, B, group, M, head_dim)``: M rows per batch entry, the
            query heads of each kv head together; ``q_sink`` the same or None.
        k, v: float32 ``(num_kv_heads, B, K, head_dim)`` from :func:`gather_pages`.
        row_pos: int64 ``(B, M)`` position of every query row.
        key_pos: int64 ``(B, K)`` position of every key, ``-1`` = no key.
        scale: multiplier of ``q . k``.

    Returns:
        ``out`` float32 ``(num_kv_heads, B, group, M, head_dim)`` and ``lse`` float32
        ``(num_kv_heads, B, group, M)`` (natural log; ``-inf`` and zeros where a row sees no
        key, never NaN, whatever the unseen keys hold).
    """
    key_col = xp.expand_dims(key_pos, axis=1)  # (B, 1, K)
    row_col = xp.expand_dims(row_pos, axis=2)  # (B, M, 1)
    visible = (key_col >= 0) & (key_col <= row_col)  # (B, M, K)
    if sliding_window is not None:
        visible = visible & ((key_col > row_col - sliding_window) | (key_col < num_sink_tokens))
    num_kv_heads, batch, group, rows, head_dim = q.shape
    num_keys = k.shape[2]
    kt = xp.matrix_transpose(k)  # (kv_heads, B, head_dim, K)

    def scores_of(x: Any) -> Any:  # (kv_heads, B, group, M, K): (group * M) x K per head
        flat = xp.reshape(x, (num_kv_heads, batch, group * rows, head_dim))
        scores = xp.reshape(xp.matmul(flat, kt), (num_kv_heads, batch, group, rows, num_keys))
        return scores * scale

    scores = scores_of(q)
    if q_sink is not None and num_sink_tokens > 0:
        is_sink = (key_pos >= 0) & (key_pos < num_sink_tokens)  # (B, K)
        sink = xp.reshape(is_sink, (1, batch, 1, 1, num_keys))
        scores = xp.where(sink, scores_of(q_sink), scores)
    dev = device(q)
    neg_inf = xp.asarray(-math.inf, dtype=xp.float32, device=dev)
    zero = xp.asarray(0.0, dtype=xp.float32, device=dev)
    one = xp.asarray(1.0, dtype=xp.float32, device=dev)
    scores = xp.where(xp.expand_dims(visible, axis=(0, 2)), scores, neg_inf)
    # Keys no row sees may hold anything (NaN in a freed page): keep them out of p @ v.
    seen_key = xp.any(visible, axis=1)  # (B, K)
    v = xp.where(xp.expand_dims(seen_key, axis=(0, 3)), v, zero)
    row_max = xp.max(scores, axis=-1, keepdims=True)
    safe_max = xp.where(row_max > neg_inf, row_max, zero)
    p = xp.exp(scores - safe_max)  # exp(-inf) = 0 on unseen keys
    denom = xp.sum(p, axis=-1, keepdims=True)
    seen = denom > zero
    p_flat = xp.reshape(p, (num_kv_heads, batch, group * rows, num_keys))
    out = xp.reshape(xp.matmul(p_flat, v), q.shape) / xp.where(seen, denom, one)
    lse = xp.where(seen, safe_max + xp.log(xp.where(seen, denom, one)), neg_inf)
    return out, lse[..., 0]
