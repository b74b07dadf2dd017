"""Paged attention written once against the array API: ``write_kv``, decode and prefill on
NumPy, torch (CPU or CUDA) and CuPy arrays alike.

Same signatures, semantics and checks as :mod:`pagedattn.kernels.paged` (PagedAttention, Kwon
et al. 2023, arXiv 2309.06180; masks and softmax of :mod:`pagedattn.kernels.reference`), with
the arrays' own library found by ``array_api_compat.array_namespace``. Where the Numba kernels
stream page tiles through an online softmax, these gather the pages a block of query rows may
see (``take`` by page id: the pool layout ``(num_pages, num_kv_heads, page_size, head_dim)``
makes each (page, kv head) one tile) and run one exact softmax over them
(:mod:`pagedattn.backends.xp_attend`); the result equals the dense reference within 1e-5.

Float arrays (``q``, ``q_sink``, ``k``, ``v``, the caches) must share one library and device,
and outputs are arrays of that library on that device. Integer tables (``page_tables``,
``context_lens``, ``query_start_loc``, ``slot_mapping``) may be host NumPy or arrays of the
backend: they are checked on the host and moved to the device once per call, as small int64
index arrays. ``write_kv`` stores with integer-array assignment ``cache[pages, :, offsets]``,
which NumPy, torch and CuPy implement alike (the standard has no scatter).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pagedattn.backends.arrays import host_ints
from pagedattn.backends.xp_attend import attend, gather_pages, gather_plan, read_entries
from pagedattn.backends.xp_checks import check_attention, check_caches, check_float, namespace
from pagedattn.kernels.paged_checks import check_pages, int_array

PREFILL_BLOCK_ROWS = 128  # query rows attended together: bounds the score block in memory


def write_kv(k_cache: Any, v_cache: Any, k: Any, v: Any, slot_mapping: Any) -> None:
    """Store the new tokens' keys and values at their slots, in place.

    Args:
        k_cache, v_cache: float32 ``(num_pages, num_kv_heads, page_size, head_dim)``.
        k, v: float32 ``(num_tokens, num_kv_heads, head_dim)``, same library and device.
        slot_mapping: integer ``(num_tokens,)`` (host or device); slot = page_id * page_size
            + offset, in ``[0, num_pages * page_size)``; ``-1`` skips the token.

    Raises:
        ValueError: a wrong dtype/shape (naming the expected shape), mixed libraries or
            devices, or a slot out of range.
    """
    xp, dev = namespace("k_cache, v_cache, k, v", k_cache, v_cache, k, v)
    num_pages, num_kv_heads, page_size, head_dim = check_caches(k_cache, v_cache, xp)
    names = "(num_tokens, num_kv_heads, head_dim)"
    if len(k.shape) != 3:
        raise ValueError(f"k: expected {names}, got {tuple(k.shape)}")
    expected = (k.shape[0], num_kv_heads, head_dim)
    check_float("k", k, xp, expected, names)
    check_float("v", v, xp, expected, names)
    slots = int_array("slot_mapping", host_ints(slot_mapping), (k.shape[0],), "(num_tokens,)")
    num_slots = num_pages * page_size
    bad = (slots < -1) | (slots >= num_slots)
    if bad.any():
        raise ValueError(
            f"slot_mapping: expected slots in [0, {num_slots}) or -1, got {int(slots[bad][0])}"
        )
    keep = np.flatnonzero(slots >= 0)
    if keep.size == 0:
        return
    kept = slots[keep].astype(np.int64)
    pages = xp.asarray(kept // page_size, device=dev)
    offsets = xp.asarray(kept % page_size, device=dev)
    rows = xp.asarray(keep.astype(np.int64), device=dev)
    k_cache[pages, :, offsets, :] = xp.take(k, rows, axis=0)
    v_cache[pages, :, offsets, :] = xp.take(v, rows, axis=0)


def _empty(xp: Any, dev: Any, rows: int, num_heads: int, head_dim: int) -> tuple[Any, Any]:
    out = xp.zeros((rows, num_heads, head_dim), dtype=xp.float32, device=dev)
    lse = xp.full((rows, num_heads), -math.inf, dtype=xp.float32, device=dev)
    return out, lse


def paged_attention_decode(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    page_tables: Any,
    context_lens: Any,
    *,
    scale: float | None = None,
    sliding_window: int | None = None,
    num_sink_tokens: int = 0,
    q_sink: Any | None = None,
    return_lse: bool = False,
) -> Any:
    """Attention of one new token per sequence over its paged KV (all sequences at once).

    Args:
        q: float32 ``(num_seqs, num_heads, head_dim)``; ``num_heads % num_kv_heads == 0``.
        k_cache, v_cache: float32 ``(num_pages, num_kv_heads, page_size, head_dim)``.
        page_tables: integer ``(num_seqs, max_pages_per_seq)``; ``-1`` = absent page, never read.
        context_lens: integer ``(num_seqs,)``, KV tokens including the new one; 0 yields zeros.
        scale, sliding_window, num_sink_tokens, q_sink, return_lse: as
            :func:`pagedattn.kernels.paged_attention_decode`.

    Returns:
        ``out`` float32 ``(num_seqs, num_heads, head_dim)`` [, ``lse`` float32
        ``(num_seqs, num_heads)``], arrays of ``q``'s library on its device.

    Raises:
        ValueError: as :func:`pagedattn.kernels.paged_attention_decode`, or mixed libraries
            or devices.
    """
    q_shape = "(num_seqs, num_heads, head_dim)"
    xp, dev, dims, num_heads, scale32 = check_attention(
        q, q_sink, k_cache, v_cache, q_shape, scale, sliding_window, num_sink_tokens
    )
    num_pages, num_kv_heads, page_size, head_dim = dims
    num_seqs = q.shape[0]
    tables = int_array(
        "page_tables", host_ints(page_tables), (num_seqs, -1), "(num_seqs, max_pages_per_seq)"
    )
    ctx = int_array("context_lens", host_ints(context_lens), (num_seqs,), "(num_seqs,)")
    ones = np.ones(num_seqs, np.int64)
    check_pages(tables, ctx, ones, page_size, num_pages, sliding_window, num_sink_tokens)
    p_last = ctx.astype(np.int64) - 1
    read = read_entries(tables, p_last, p_last, page_size, sliding_window, num_sink_tokens)
    if not read.any():
        out, lse = _empty(xp, dev, num_seqs, num_heads, head_dim)
        return (out, lse) if return_lse else out
    page_ids, key_pos = gather_plan(tables, read, p_last, page_size)
    ids = xp.asarray(page_ids.reshape(-1), device=dev)
    k = gather_pages(xp, k_cache, ids, num_seqs)
    v = gather_pages(xp, v_cache, ids, num_seqs)
    group = num_heads // num_kv_heads

    def grouped(x: Any) -> Any:  # (seqs, heads, D) -> (kv_heads, seqs, group, 1, D)
        x = xp.reshape(x, (num_seqs, num_kv_heads, group, 1, head_dim))
        return xp.permute_dims(x, (1, 0, 2, 3, 4))

    out, lse = attend(
        xp,
        grouped(q),
        None if q_sink is None else grouped(q_sink),
        k,
        v,
        xp.asarray(p_last[:, None], device=dev),
        xp.asarray(key_pos, device=dev),
        scale32,
        sliding_window,
        num_sink_tokens,
    )
    out = xp.reshape(xp.permute_dims(out, (1, 0, 2, 3, 4)), (num_seqs, num_heads, head_dim))
    lse = xp.reshape(xp.permute_dims(lse, (1, 0, 2, 3)), (num_seqs, num_heads))
    return (out, lse) if return_lse else out


def paged_attention_prefill(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    page_tables: Any,
    query_start_loc: Any,
    context_lens: Any,
    *,
    scale: float | None = None,
    sliding_window: int | None = None,
    num_sink_tokens: int = 0,
    q_sink: Any | None = None,
    return_lse: bool = False,
) -> Any:
    """Causal attention of each sequence's new tokens (flat batch) over its paged KV.

    Rows are taken ``PREFILL_BLOCK_ROWS`` at a time per sequence; each block gathers only the
    pages its rows may see (sinks plus the window), so a windowed prefill reads O(W) keys per row.

    Args:
        q: float32 ``(num_tokens, num_heads, head_dim)``, the new tokens of all sequences, flat.
        k_cache, v_cache: float32 ``(num_pages, num_kv_heads, page_size, head_dim)``.
        page_tables: integer ``(num_seqs, max_pages_per_seq)``; ``-1`` = absent page.
        query_start_loc: integer ``(num_seqs + 1,)``, non-decreasing, from 0 to ``num_tokens``.
        context_lens: integer ``(num_seqs,)``, all KV tokens including the new ones.
        scale, sliding_window, num_sink_tokens, q_sink, return_lse: as
            :func:`pagedattn.kernels.paged_attention_prefill`.

    Returns:
        ``out`` float32 ``(num_tokens, num_heads, head_dim)`` [, ``lse`` float32
        ``(num_tokens, num_heads)``], arrays of ``q``'s library on its device.

    Raises:
        ValueError: as :func:`pagedattn.kernels.paged_attention_prefill`, or mixed libraries
            or devices.
    """
    q_shape = "(num_tokens, num_heads, head_dim)"
    xp, dev, dims, num_heads, scale32 = check_attention(
        q, q_sink, k_cache, v_cache, q_shape, scale, sliding_window, num_sink_tokens
    )
    num_pages, num_kv_heads, page_size, head_dim = dims
    tables = int_array(
        "page_tables", host_ints(page_tables), (-1, -1), "(num_seqs, max_pages_per_seq)"
    )
    num_seqs, num_tokens = tables.shape[0], q.shape[0]
    qsl = int_array(
        "query_start_loc", host_ints(query_start_loc), (num_seqs + 1,), "(num_seqs + 1,)"
    )
    ctx = int_array("context_lens", host_ints(context_lens), (num_seqs,), "(num_seqs,)")
    q_lens = np.diff(qsl)
    if qsl[0] != 0 or qsl[-1] != num_tokens or (q_lens < 0).any():
        raise ValueError(
            f"query_start_loc: expected non-decreasing (num_seqs + 1,) = ({num_seqs + 1},) "
            f"from 0 to num_tokens = {num_tokens}, got {qsl.tolist()}"
        )
    if (q_lens > ctx).any():
        s = int(np.argmax(q_lens > ctx))
        raise ValueError(
            f"context_lens: expected >= q_len (new tokens are already written), "
            f"sequence {s} has q_len {int(q_lens[s])} > context_len {int(ctx[s])}"
        )
    check_pages(tables, ctx, q_lens, page_size, num_pages, sliding_window, num_sink_tokens)
    group = num_heads // num_kv_heads
    blocks = []
    for s in range(num_seqs):
        for a in range(int(qsl[s]), int(qsl[s + 1]), PREFILL_BLOCK_ROWS):
            b = min(a + PREFILL_BLOCK_ROWS, int(qsl[s + 1]))
            first = int(ctx[s] - q_lens[s]) + a - int(qsl[s])  # position of row a
            blocks.append(
                _prefill_block(
                    xp, dev, q, q_sink, k_cache, v_cache, tables[s : s + 1], a, b, first,
                    group, page_size, scale32, sliding_window, num_sink_tokens,
                )
            )  # fmt: skip
    if not blocks:
        out, lse = _empty(xp, dev, 0, num_heads, head_dim)
    else:
        out = xp.concat([o for o, _ in blocks], axis=0)
        lse = xp.concat([m for _, m in blocks], axis=0)
    return (out, lse) if return_lse else out


def _prefill_block(
    xp: Any,
    dev: Any,
    q: Any,
    q_sink: Any,
    k_cache: Any,
    v_cache: Any,
    table: np.ndarray,
    a: int,
    b: int,
    first: int,
    group: int,
    page_size: int,
    scale: float,
    sliding_window: int | None,
    num_sink_tokens: int,
) -> tuple[Any, Any]:
    """Rows ``a:b`` of ``q`` (one sequence, positions ``first ..``): ``(rows, heads, D)`` out
    and ``(rows, heads)`` lse."""
    rows, num_heads, head_dim = b - a, q.shape[1], q.shape[2]
    p_first = np.array([first], np.int64)
    p_last = p_first + rows - 1
    read = read_entries(table, p_first, p_last, page_size, sliding_window, num_sink_tokens)
    if not read.any():
        return _empty(xp, dev, rows, num_heads, head_dim)
    page_ids, key_pos = gather_plan(table, read, p_last, page_size)
    ids = xp.asarray(page_ids.reshape(-1), device=dev)
    k, v = gather_pages(xp, k_cache, ids, 1), gather_pages(xp, v_cache, ids, 1)

    def grouped(x: Any) -> Any:  # (rows, heads, D) -> (kv_heads, 1, group, rows, D)
        x = xp.reshape(x[a:b, ...], (rows, num_heads // group, group, head_dim))
        return xp.expand_dims(xp.permute_dims(x, (1, 2, 0, 3)), axis=1)

    row_pos = xp.asarray(np.arange(first, first + rows, dtype=np.int64)[None, :], device=dev)
    out, lse = attend(
        xp,
        grouped(q),
        None if q_sink is None else grouped(q_sink),
        k,
        v,
        row_pos,
        xp.asarray(key_pos, device=dev),
        scale,
        sliding_window,
        num_sink_tokens,
    )
    out = xp.reshape(xp.permute_dims(out[:, 0, ...], (2, 0, 1, 3)), (rows, num_heads, head_dim))
    lse = xp.reshape(xp.permute_dims(lse[:, 0, ...], (2, 0, 1)), (rows, num_heads))
    return out, lse
