"""Numba inner loops of paged decode attention (no validation here: see ``paged.py``).

Prefill has its own lane-vectorised kernel in :mod:`pagedattn.kernels.paged_prefill_numba`.

Each (sequence, kv head, split) work item
(:func:`pagedattn.kernels.paged_decode_tiles.decode_block`) walks its share of the page table
and reads every visible ``page_size x head_dim`` tile where it lies in the pool (PagedAttention,
Kwon et al. 2023, arXiv 2309.06180), keeping a running max / sum / accumulator per query row
(online softmax: Milakov & Gimelshein 2018; FlashAttention-2, Dao 2023, arXiv 2307.08691);
here the work items run in parallel and the splits of a long context are merged by their
log-sum-exp. All query heads of a GQA group consume a tile while it sits in L1, so the pool is
streamed once.

Fast-math flags deliberately exclude ``nnan`` / ``ninf``: the running max starts
at ``-inf`` and masked rows must stay ``-inf`` / zero, never NaN.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from pagedattn.kernels.numba_consts import FASTMATH, NEG_INF
from pagedattn.kernels.paged_decode_tiles import decode_block


@njit(fastmath=FASTMATH, cache=True, nogil=True)
def _merge_splits(
    parts: np.ndarray,
    part_lse: np.ndarray,
    own: int,
    s: int,
    head: int,
    out: np.ndarray,
    lse: np.ndarray,
) -> None:
    """Fold the partial states of splits ``0 .. own-1`` of row ``(s, head)`` into ``out[s, head]``
    and ``lse[s, head]``: weights ``exp(lse_i - max)`` (FlashAttention's online-softmax identity;
    FlashInfer's ``merge_state``), in split order; a split that saw no key (``-inf``) weighs 0."""
    head_dim = out.shape[2]
    m = NEG_INF
    for i in range(own):
        m = max(m, part_lse[i, s, head])
    for d in range(head_dim):
        out[s, head, d] = 0.0
    if m == NEG_INF:
        lse[s, head] = NEG_INF
        return
    total = np.float32(0.0)
    for i in range(own):
        li = part_lse[i, s, head]
        if li == NEG_INF:  # its partial output is garbage-free only by convention: skip it
            continue
        w = np.exp(li - m)
        total += w
        for d in range(head_dim):
            out[s, head, d] += w * parts[i, s, head, d]
    inv = np.float32(1.0) / total
    for d in range(head_dim):
        out[s, head, d] *= inv
    lse[s, head] = m + np.log(total)


@njit(parallel=True, fastmath=FASTMATH, cache=True, nogil=True)
def decode_kernel(
    q: np.ndarray,
    q_sink: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    page_tables: np.ndarray,
    context_lens: np.ndarray,
    splits: np.ndarray,
    scale: np.float32,
    window: int,
    num_sink: int,
    parts: np.ndarray,
    part_lse: np.ndarray,
    out: np.ndarray,
    lse: np.ndarray,
) -> None:
    """One query row per sequence; parallel over (sequence, kv head, split). window <= 0: none.

    out: (num_seqs, num_heads, head_dim), lse: (num_seqs, num_heads). Sequence ``s`` is cut
    into ``splits[s]`` slices of the window's keys (split 0 also holds the sinks), each a
    partial state in ``parts`` (max_splits, num_seqs, num_heads, head_dim) and ``part_lse``
    (max_splits, num_seqs, num_heads), then merged by log-sum-exp in split order
    (flash-decoding, Dao et al. 2023); a sequence with one split writes ``out`` directly, and
    ``parts`` may have 0 splits when no sequence has two.
    """
    num_splits = max(parts.shape[0], 1)  # parts is empty when no sequence has a second split
    num_seqs = q.shape[0]
    num_kv_heads = k_cache.shape[1]
    for item in prange(num_splits * num_seqs * num_kv_heads):
        split = item // (num_seqs * num_kv_heads)
        s = (item // num_kv_heads) % num_seqs
        g = item % num_kv_heads
        own = splits[s]
        if split >= own:
            continue
        ctx = context_lens[s]
        sink_end = min(num_sink, ctx)
        rest_start = sink_end if window <= 0 else max(sink_end, ctx - window)
        chunk = (ctx - rest_start + own - 1) // own
        key_lo = 0 if split == 0 else rest_start + split * chunk
        key_hi = min(ctx, rest_start + (split + 1) * chunk)
        if own == 1:
            decode_block(q, q_sink, k_cache, v_cache, page_tables[s], g, s, 0, 1, ctx, 1, scale,
                   window, num_sink, key_lo, key_hi, out, lse)  # fmt: skip
        else:
            decode_block(q, q_sink, k_cache, v_cache, page_tables[s], g, s, 0, 1, ctx, 1, scale,
                   window, num_sink, key_lo, key_hi, parts[split], part_lse[split])  # fmt: skip
    if parts.shape[0] > 1:
        num_heads = q.shape[1]
        for row in prange(num_seqs * num_heads):
            s = row // num_heads
            if splits[s] > 1:
                _merge_splits(parts, part_lse, splits[s], s, row % num_heads, out, lse)


@njit(cache=True, nogil=True)
def decode_attention(
    q: np.ndarray,
    q_sink: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    page_tables: np.ndarray,
    context_lens: np.ndarray,
    splits: np.ndarray,
    scale: np.float32,
    window: int,
    num_sink: int,
    num_splits: int,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`decode_kernel` with its outputs and split scratch allocated here: ``(out, lse)``,
    float32 (num_seqs, num_heads, head_dim) and (num_seqs, num_heads). ``num_splits`` is the
    largest of ``splits``; the scratch is empty unless some sequence has two or more."""
    num_seqs, num_heads, head_dim = q.shape
    scratch = num_splits if num_splits > 1 else 0
    parts = np.empty((scratch, num_seqs, num_heads, head_dim), np.float32)
    part_lse = np.empty((scratch, num_seqs, num_heads), np.float32)
    out = np.empty((num_seqs, num_heads, head_dim), np.float32)
    lse = np.empty((num_seqs, num_heads), np.float32)
    decode_kernel(q, q_sink, k_cache, v_cache, page_tables, context_lens, splits, scale, window,
                  num_sink, parts, part_lse, out, lse)  # fmt: skip
    return out, lse
