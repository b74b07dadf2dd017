"""Numba inner loops of paged prefill attention (no validation here: see ``paged.py``).

One work item is (sequence, block of query rows, kv head). Its ``rows x group`` query
heads form ``lanes`` (lane ``r * group + h``), stored transposed (``qT[d, lane]``) so that
every product is a broadcast-scalar FMA over contiguous lanes, with no horizontal
reduction: scores ``st[j, :] += qT[d, :] * K[t, d]``, values ``accT[d, :] += st[j, :] *
V[t, d]``, computed in register tiles of 16 lanes (``lane_tiles.py``: 1.37-1.39x the
loops they replaced on a 512-token prompt's attention, the same results bit for bit). Pages
are read where they lie in the pool, each K/V tile once per item (PagedAttention, Kwon et
al. 2023, arXiv 2309.06180); a block of up to ``BLOCK_KEYS`` keys shares one online-softmax
update per lane (Milakov & Gimelshein 2018; FlashAttention-2, Dao 2023, arXiv 2307.08691).
Only tiles crossing a row's visible range (diagonal, window edge, sinks) are masked; the rest
take the unmasked path.

Fast-math flags deliberately exclude ``nnan`` / ``ninf``: masked scores are ``-inf``.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from pagedattn.kernels.fast_exp import exp_poly, exp_reduce
from pagedattn.kernels.lane_tiles import (
    DIM_TILE,
    KEY_TILE,
    TILE_LANES,
    score_tile_keys,
    score_tile_one,
    value_tile_dims,
    value_tile_one,
)
from pagedattn.kernels.numba_consts import BLOCK_KEYS, FASTMATH, NEG_INF

LANE_MULTIPLE = 32  # lanes padded so the vectorised loops need no scalar remainder


@njit(fastmath=FASTMATH, cache=True, nogil=True, boundscheck=False)
def _exp_row(x: np.ndarray, shift: np.ndarray, bits: np.ndarray, fbits: np.ndarray) -> None:
    """``x[l] = exp(x[l] - shift[l])``, exactly 0 below ``exp(-87)`` (so ``-inf`` -> 0).

    Vectorisable (no libm call: :mod:`pagedattn.kernels.fast_exp`).
    """
    for lane in range(x.shape[0]):
        v = x[lane] - shift[lane]
        r, two_k = exp_reduce(max(v, np.float32(-87.0)))
        x[lane] = r
        bits[lane] = two_k if v >= -87.0 else 0
    for lane in range(x.shape[0]):
        x[lane] = exp_poly(x[lane]) * fbits[lane]


@njit(fastmath=FASTMATH, cache=True, nogil=True, boundscheck=False)
def _score_page(
    qT: np.ndarray, k_cache: np.ndarray, page: int, g: int, t0: int, n: int, st: np.ndarray, j0: int
) -> None:
    """``st[j0 + i, :] = qT^T K[page, g, t0 + i]`` for ``i < n``: register tiles of KEY_TILE
    keys by TILE_LANES lanes (:mod:`pagedattn.kernels.lane_tiles`), then single keys."""
    lanes = qT.shape[1]
    i = 0
    while i + KEY_TILE <= n:
        for lane0 in range(0, lanes, TILE_LANES):
            score_tile_keys(qT, k_cache, page, g, t0 + i, lane0, st, j0 + i)
        i += KEY_TILE
    while i < n:
        for lane0 in range(0, lanes, TILE_LANES):
            score_tile_one(qT, k_cache, page, g, t0 + i, lane0, st, j0 + i)
        i += 1


@njit(fastmath=FASTMATH, cache=True, nogil=True, boundscheck=False)
def _value_page(
    st: np.ndarray,
    v_cache: np.ndarray,
    page: int,
    g: int,
    t0: int,
    n: int,
    j0: int,
    acc: np.ndarray,
) -> None:
    """``acc[d, :] += st[j0 + i, :] * V[page, g, t0 + i, d]`` for ``i < n``: register tiles of
    DIM_TILE dims by TILE_LANES lanes over the page's keys, then single dims."""
    head_dim, lanes = acc.shape
    d = 0
    while d + DIM_TILE <= head_dim:
        for lane0 in range(0, lanes, TILE_LANES):
            value_tile_dims(st, j0, v_cache, page, g, t0, n, acc, d, lane0)
        d += DIM_TILE
    while d < head_dim:
        for lane0 in range(0, lanes, TILE_LANES):
            value_tile_one(st, j0, v_cache, page, g, t0, n, acc, d, lane0)
        d += 1


@njit(fastmath=FASTMATH, cache=True, nogil=True, boundscheck=False)
def _sweep(
    qT: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    table_row: np.ndarray,
    g: int,
    start: int,
    end: int,
    full_lo: int,
    full_hi: int,
    scratch: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    acc: np.ndarray,
    m: np.ndarray,
    lsum: np.ndarray,
) -> None:
    """Fold keys ``[start, end)`` into every lane's state; lane ``l`` sees keys ``[lo, hi)``.

    Keys in ``[full_lo, full_hi)`` are visible to every lane (no mask). Absent pages (table
    entry -1) are skipped unread. ``scratch``: st (block keys, lanes), shift, alpha (lanes),
    bits (int32, lanes) and its float32 view.
    """
    st, shift, alpha, bits, fbits = scratch
    lanes = qT.shape[1]
    head_dim = acc.shape[0]
    page_size = k_cache.shape[2]
    block_pages = st.shape[0] // page_size
    last_page = (end - 1) // page_size
    for first in range(start // page_size, last_page + 1, block_pages):
        stop = min(first + block_pages, last_page + 1)
        nj = 0
        for pi in range(first, stop):
            page = table_row[pi]
            if page < 0:  # absent page (evicted by the cache): its keys are not visible
                continue
            base = pi * page_size
            t0 = max(start - base, 0)
            n = min(end - base, page_size) - t0
            _score_page(qT, k_cache, page, g, t0, n, st, nj)
            if base + t0 < full_lo or base + t0 + n > full_hi:
                for i in range(n):
                    key = base + t0 + i
                    for lane in range(lanes):
                        if key < lo[lane] or key >= hi[lane]:
                            st[nj + i, lane] = NEG_INF
            nj += n
        if nj == 0:
            continue
        # Online softmax: new max, rescale by exp(m_old - m_new), p = exp(s - m_new).
        for lane in range(lanes):
            shift[lane] = m[lane]
        for j in range(nj):
            for lane in range(lanes):
                shift[lane] = max(shift[lane], st[j, lane])
        for lane in range(lanes):
            alpha[lane] = m[lane]
            m[lane] = shift[lane]
            if shift[lane] == NEG_INF:  # nothing seen yet: keep every weight exactly 0
                shift[lane] = 0.0
        _exp_row(alpha, shift, bits, fbits)
        for lane in range(lanes):
            lsum[lane] *= alpha[lane]
        for d in range(head_dim):
            for lane in range(lanes):
                acc[d, lane] *= alpha[lane]
        for j in range(nj):
            _exp_row(st[j], shift, bits, fbits)
            for lane in range(lanes):
                lsum[lane] += st[j, lane]
        nj = 0
        for pi in range(first, stop):
            page = table_row[pi]
            if page < 0:
                continue
            base = pi * page_size
            t0 = max(start - base, 0)
            n = min(end - base, page_size) - t0
            _value_page(st, v_cache, page, g, t0, n, nj, acc)
            nj += n


@njit(fastmath=FASTMATH, cache=True, nogil=True, boundscheck=False)
def _load_queries(
    q: np.ndarray, row0: int, n_rows: int, g: int, group: int, scale: np.float32, qT: np.ndarray
) -> None:
    """``qT[d, r * group + h] = q[row0 + r, g * group + h, d] * scale``; padded lanes 0."""
    head_dim = qT.shape[0]
    qT[:, :] = 0.0
    for r in range(n_rows):
        for h in range(group):
            for d in range(head_dim):
                qT[d, r * group + h] = q[row0 + r, g * group + h, d] * scale


@njit(parallel=True, fastmath=FASTMATH, cache=True, nogil=True, boundscheck=False)
def prefill_kernel(
    q: np.ndarray,
    q_sink: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    page_tables: np.ndarray,
    query_start_loc: np.ndarray,
    context_lens: np.ndarray,
    item_seq: np.ndarray,
    item_q1st: np.ndarray,
    block_rows: int,
    scale: np.float32,
    window: int,
    num_sink: int,
    out: np.ndarray,
    lse: np.ndarray,
) -> None:
    """Parallel over (query block, kv head); block w covers rows item_q1st[w].. of item_seq[w].

    window <= 0: none. out: (num_tokens, num_heads, head_dim), lse: (num_tokens, num_heads).
    """
    num_kv_heads, page_size = k_cache.shape[1], k_cache.shape[2]
    head_dim = q.shape[2]
    group = q.shape[1] // num_kv_heads
    lanes = -(-block_rows * group // LANE_MULTIPLE) * LANE_MULTIPLE
    block_keys = max(1, BLOCK_KEYS // page_size) * page_size
    for item in prange(item_seq.shape[0] * num_kv_heads):
        w = item // num_kv_heads
        g = item % num_kv_heads
        s = item_seq[w]
        q1st = item_q1st[w]
        q_len = query_start_loc[s + 1] - query_start_loc[s]
        n_rows = min(block_rows, q_len - q1st)
        row0 = query_start_loc[s] + q1st
        ctx = context_lens[s]
        table_row = page_tables[s]
        qT = np.empty((head_dim, lanes), np.float32)
        acc = np.zeros((head_dim, lanes), np.float32)
        m = np.full(lanes, NEG_INF, np.float32)
        lsum = np.zeros(lanes, np.float32)
        lo = np.zeros(lanes, np.int64)
        hi = np.zeros(lanes, np.int64)
        bits = np.empty(lanes, np.int32)
        scratch = (
            np.empty((block_keys, lanes), np.float32),
            np.empty(lanes, np.float32),
            np.empty(lanes, np.float32),
            bits,
            bits.view(np.float32),
        )
        p0 = ctx - q_len + q1st  # position of the block's first row
        p_last = p0 + n_rows - 1
        sink_end = min(num_sink, p_last + 1)
        if sink_end > 0:  # keys [0, sink_end): the attention sinks, scored with q_sink
            _load_queries(q_sink, row0, n_rows, g, group, scale, qT)
            for r in range(n_rows):
                for h in range(group):
                    hi[r * group + h] = min(sink_end, p0 + r + 1)
            full = min(sink_end, p0 + 1)  # sinks every row of the block sees
            _sweep(qT, lo, hi, k_cache, v_cache, table_row, g, 0, sink_end, 0, full,
                   scratch, acc, m, lsum)  # fmt: skip
        # Keys [lo, p] of each row: the causal window, scored with q.
        _load_queries(q, row0, n_rows, g, group, scale, qT)
        for r in range(n_rows):
            p = p0 + r
            first_key = sink_end if window <= 0 else max(sink_end, p - window + 1)
            for h in range(group):
                lo[r * group + h] = first_key
                hi[r * group + h] = p + 1
        start = lo[0]
        full_lo = lo[(n_rows - 1) * group]
        if start <= p_last:
            _sweep(qT, lo, hi, k_cache, v_cache, table_row, g, start, p_last + 1, full_lo, p0 + 1,
                   scratch, acc, m, lsum)  # fmt: skip
        for r in range(n_rows):
            for h in range(group):
                lane = r * group + h
                head = g * group + h
                total = lsum[lane]
                if total > 0:
                    inv = np.float32(1.0) / total
                    for d in range(head_dim):
                        out[row0 + r, head, d] = acc[d, lane] * inv
                    lse[row0 + r, head] = m[lane] + np.log(total)
                else:
                    for d in range(head_dim):
                        out[row0 + r, head, d] = 0.0
                    lse[row0 + r, head] = NEG_INF
