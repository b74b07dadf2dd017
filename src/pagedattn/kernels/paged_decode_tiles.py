"""The per-split work of paged decode attention: one (sequence, kv head, split) work item
walks its share of the page table, reading each visible ``page_size x head_dim`` tile where it
lies in the pool, with a running max / sum / accumulator per query row of the GQA group (online
softmax). :mod:`pagedattn.kernels.paged_decode_numba` runs the work items in parallel and merges
the splits.

Fast-math flags deliberately exclude ``nnan`` / ``ninf``: the running max starts at ``-inf``
and masked rows must stay ``-inf`` / zero, never NaN.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pagedattn.kernels.fast_exp import exp_poly, exp_reduce
from pagedattn.kernels.kv_dtype import load_f32
from pagedattn.kernels.kv_int8 import row_scale
from pagedattn.kernels.numba_consts import BLOCK_KEYS, FASTMATH, FASTMATH_ORDERED, NEG_INF
from pagedattn.kernels.prefetch import PREFETCH_PAGES, prefetch_tile


@njit(fastmath=FASTMATH_ORDERED, cache=True, nogil=True)
def _exp_shifted(
    x: np.ndarray, bits: np.ndarray, fbits: np.ndarray, h: int, j0: int, j1: int, shift: np.float32
) -> np.float32:
    """``x[h, j] = exp(x[h, j] - shift)`` for ``j0 <= j < j1`` (``x <= shift``); return their sum.

    Vectorisable (no libm call: :mod:`pagedattn.kernels.fast_exp`). ``v`` is clamped at -87,
    so a key far below the max weighs ~1e-38 instead of exactly 0.

    The sum has one fixed order (no reassociation is allowed here): eight lane sums, lane ``l``
    adding ``e[l], e[l + 8], ...`` of the whole groups of eight in increasing ``j``, the tail
    added to lane 0 in increasing ``j``, then ``((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 +
    l7))``. Left to fast-math, the vectorizer chose the order, and a process that compiled this
    kernel summed differently (by ~1e-9) from one that loaded it from Numba's cache.
    """
    # Row views indexed from 0: a loop from a runtime start would keep Numba's negative-index
    # wraparound in the address and block vectorisation.
    n = j1 - j0
    xr, br, fr = x[h, j0:j1], bits[h, j0:j1], fbits[h, j0:j1]
    for j in range(n):
        xr[j], br[j] = exp_reduce(max(xr[j] - shift, np.float32(-87.0)))
    for j in range(n):
        xr[j] = exp_poly(xr[j]) * fr[j]
    l0 = l1 = l2 = l3 = l4 = l5 = l6 = l7 = np.float32(0.0)
    j = 0
    while j + 8 <= n:
        l0 += xr[j]
        l1 += xr[j + 1]
        l2 += xr[j + 2]
        l3 += xr[j + 3]
        l4 += xr[j + 4]
        l5 += xr[j + 5]
        l6 += xr[j + 6]
        l7 += xr[j + 7]
        j += 8
    for t in range(j, n):
        l0 += xr[t]
    return ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))


@njit(fastmath=FASTMATH, cache=True, nogil=True)
def _attend(
    qv: np.ndarray,
    row_lo: np.ndarray,
    row_hi: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    table_row: np.ndarray,
    g: int,
    start: int,
    end: int,
    acc: np.ndarray,
    m: np.ndarray,
    lsum: np.ndarray,
    scores: np.ndarray,
    bits: np.ndarray,
    fbits: np.ndarray,
) -> None:
    """Fold keys ``[start, end)`` into the running state of rows ``r`` (keys ``[row_lo, row_hi)``).

    qv: (R, G, D) pre-scaled queries; acc: (R, G, D); m, lsum: (R, G); scores: (G, n * P)
    scratch: n pages form one block, whose max / rescale / exp pass is shared; bits (int32)
    and fbits (its float32 view) are scratch of the same shape for :func:`_exp_shifted`.
    The pool is indexed directly (no per-row views: a view would touch the pool's shared
    reference count from every thread).
    """
    num_rows, group, head_dim = qv.shape
    page_size = k_cache.shape[2]
    block_pages = scores.shape[1] // page_size
    last_page = (end - 1) // page_size
    hinted = start // page_size - 1  # the last page whose tiles were prefetched
    for first in range(start // page_size, last_page + 1, block_pages):
        key0 = first * page_size  # keys [key0, key0 + block_pages * page_size) share one update
        key_end = min(first + block_pages, last_page + 1) * page_size
        for r in range(num_rows):
            k0 = max(max(row_lo[r], start), key0)
            k1 = min(min(row_hi[r], end), key_end)
            if k0 >= k1:
                continue
            for pi in range(k0 // page_size, (k1 - 1) // page_size + 1):
                page = table_row[pi]
                base = pi * page_size
                t_lo, t_hi = max(k0 - base, 0), min(k1 - base, page_size)
                # the tiles PREFETCH_PAGES pages on (each page starts cold for the hardware
                # prefetcher), one page per page read rather than a block's at once
                while hinted < min(pi + PREFETCH_PAGES, last_page):
                    hinted += 1
                    if table_row[hinted] >= 0:
                        prefetch_tile(k_cache, table_row[hinted], g)  # type: ignore[call-arg]
                        prefetch_tile(v_cache, table_row[hinted], g)  # type: ignore[call-arg]
                if page < 0:  # absent page (evicted by the cache): its keys are not visible
                    for h in range(group):
                        for t in range(t_lo, t_hi):
                            scores[h, base + t - key0] = NEG_INF
                    continue
                t4 = t_lo
                while t4 + 4 <= t_hi:  # four K rows per pass: each q element loaded once for them
                    t, j = t4, base + t4 - key0
                    # An int8 row's scale multiplies its code product (1 for float pools).
                    c0, c1 = row_scale(k_cache, page, g, t), row_scale(k_cache, page, g, t + 1)
                    c2, c3 = row_scale(k_cache, page, g, t + 2), row_scale(k_cache, page, g, t + 3)
                    for h in range(group):  # the rows stay in L1 for every head of the group
                        s0 = s1 = s2 = s3 = np.float32(0.0)
                        for d in range(head_dim):
                            qd = qv[r, h, d]
                            s0 += qd * load_f32(k_cache[page, g, t, d])
                            s1 += qd * load_f32(k_cache[page, g, t + 1, d])
                            s2 += qd * load_f32(k_cache[page, g, t + 2, d])
                            s3 += qd * load_f32(k_cache[page, g, t + 3, d])
                        scores[h, j] = s0 * c0
                        scores[h, j + 1] = s1 * c1
                        scores[h, j + 2] = s2 * c2
                        scores[h, j + 3] = s3 * c3
                    t4 += 4
                for t in range(t4, t_hi):
                    j = base + t - key0
                    c = row_scale(k_cache, page, g, t)
                    for h in range(group):
                        s = np.float32(0.0)
                        for d in range(head_dim):
                            s += qv[r, h, d] * load_f32(k_cache[page, g, t, d])
                        scores[h, j] = s * c
            for h in range(group):
                block_max = NEG_INF
                for j in range(k0 - key0, k1 - key0):
                    block_max = max(block_max, scores[h, j])
                if block_max == NEG_INF:  # every key of this block sits on an absent page
                    for j in range(k0 - key0, k1 - key0):
                        scores[h, j] = 0.0
                    continue
                m_old = m[r, h]
                total = lsum[r, h]
                if block_max > m_old:  # rescale only when the running max grows
                    alpha = np.float32(0.0) if m_old == NEG_INF else np.exp(m_old - block_max)
                    total *= alpha
                    for d in range(head_dim):
                        acc[r, h, d] *= alpha
                    m[r, h] = block_max
                total += _exp_shifted(scores, bits, fbits, h, k0 - key0, k1 - key0, m[r, h])
                lsum[r, h] = total
            for pi in range(k0 // page_size, (k1 - 1) // page_size + 1):
                page = table_row[pi]
                if page < 0:
                    continue
                base = pi * page_size
                t4, t_hi = max(k0 - base, 0), min(k1 - base, page_size)
                # Four V rows per pass: 1.01-1.11x eight rows (same results bit for bit), and
                # sixteen rows were slower still (interleaved A/B over 30 distinct pools).
                while t4 + 4 <= t_hi:
                    t, j = t4, base + t4 - key0
                    c0, c1 = row_scale(v_cache, page, g, t), row_scale(v_cache, page, g, t + 1)
                    c2, c3 = row_scale(v_cache, page, g, t + 2), row_scale(v_cache, page, g, t + 3)
                    for h in range(group):  # an int8 row's scale folds into its weight
                        e0, e1 = scores[h, j] * c0, scores[h, j + 1] * c1
                        e2, e3 = scores[h, j + 2] * c2, scores[h, j + 3] * c3
                        for d in range(head_dim):
                            v0 = load_f32(v_cache[page, g, t, d])
                            v1 = load_f32(v_cache[page, g, t + 1, d])
                            v2 = load_f32(v_cache[page, g, t + 2, d])
                            v3 = load_f32(v_cache[page, g, t + 3, d])
                            acc[r, h, d] += (e0 * v0 + e1 * v1) + (e2 * v2 + e3 * v3)
                    t4 += 4
                for t in range(t4, t_hi):
                    j = base + t - key0
                    c = row_scale(v_cache, page, g, t)
                    for h in range(group):
                        e = scores[h, j] * c
                        for d in range(head_dim):
                            acc[r, h, d] += e * load_f32(v_cache[page, g, t, d])


@njit(fastmath=FASTMATH, cache=True, nogil=True)
def _finish(
    acc: np.ndarray,
    m: np.ndarray,
    lsum: np.ndarray,
    out: np.ndarray,
    lse: np.ndarray,
    row0: int,
    g: int,
) -> None:
    """Write ``acc / lsum`` and ``m + log(lsum)`` from flat row ``row0`` on (0, -inf if unseen)."""
    num_rows, group, head_dim = acc.shape
    for r in range(num_rows):
        for h in range(group):
            head = g * group + h
            total = lsum[r, h]
            if total > 0:
                inv = np.float32(1.0) / total
                for d in range(head_dim):
                    out[row0 + r, head, d] = acc[r, h, d] * inv
                lse[row0 + r, head] = m[r, h] + np.log(total)
            else:
                for d in range(head_dim):
                    out[row0 + r, head, d] = 0.0
                lse[row0 + r, head] = NEG_INF


@njit(fastmath=FASTMATH, cache=True, nogil=True)
def decode_block(
    q: np.ndarray,
    q_sink: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    table_row: np.ndarray,
    g: int,
    row0: int,
    q1st: int,
    n_rows: int,
    ctx: int,
    q_len: int,
    scale: np.float32,
    window: int,
    num_sink: int,
    key_lo: int,
    key_hi: int,
    out: np.ndarray,
    lse: np.ndarray,
) -> None:
    """Rows ``q1st ..+ n_rows`` of ``q_len`` new tokens (flat row ``row0``) over kv head ``g``,
    restricted to keys ``[key_lo, key_hi)``."""
    head_dim = q.shape[2]
    group = q.shape[1] // k_cache.shape[1]
    acc = np.zeros((n_rows, group, head_dim), np.float32)
    m = np.full((n_rows, group), NEG_INF, np.float32)
    lsum = np.zeros((n_rows, group), np.float32)
    page_size = k_cache.shape[2]
    scores = np.empty((group, max(1, BLOCK_KEYS // page_size) * page_size), np.float32)
    bits = np.empty(scores.shape, np.int32)
    fbits = bits.view(np.float32)
    qv = np.empty((n_rows, group, head_dim), np.float32)
    lo = np.empty(n_rows, np.int64)
    hi = np.empty(n_rows, np.int64)
    p_last = ctx - q_len + q1st + n_rows - 1
    sink_end = min(num_sink, p_last + 1)
    # Keys [0, sink_end): the attention sinks, scored with q_sink.
    if min(sink_end, key_hi) > key_lo:
        for r in range(n_rows):
            hi[r] = min(sink_end, ctx - q_len + q1st + r + 1)
            lo[r] = 0
            for h in range(group):
                for d in range(head_dim):
                    qv[r, h, d] = q_sink[row0 + r, g * group + h, d] * scale
        a, b = key_lo, min(sink_end, key_hi)
        _attend(qv, lo, hi, k_cache, v_cache, table_row, g, a, b, acc, m, lsum, scores, bits, fbits)
    # Keys [rest_start, p_last]: the causal window, scored with q.
    rest_start = sink_end
    for r in range(n_rows):
        p = ctx - q_len + q1st + r
        lo[r] = sink_end if window <= 0 else max(sink_end, p - window + 1)
        hi[r] = p + 1
        if r == 0:
            rest_start = lo[0]
        for h in range(group):
            for d in range(head_dim):
                qv[r, h, d] = q[row0 + r, g * group + h, d] * scale
    a, b = max(rest_start, key_lo), min(p_last + 1, key_hi)
    if a < b:
        _attend(qv, lo, hi, k_cache, v_cache, table_row, g, a, b, acc, m, lsum, scores, bits, fbits)
    _finish(acc, m, lsum, out, lse, row0, g)
