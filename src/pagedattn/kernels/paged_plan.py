"""Validate a step's page metadata once, then run every layer's write_kv / decode attention on it.

:func:`~pagedattn.kernels.paged.write_kv` and
:func:`~pagedattn.kernels.paged.paged_attention_decode` check their integer arguments (slot
mapping, page tables, context lengths: range scans, int32 conversion, split counts) on every
call; a model calls them once per layer with the same metadata (30 times a step for
SmolLM2-135M), and those checks cost more than a decode step's attention. A plan does that work
once per step; the planned calls check only what changes per layer (the float arrays' dtype and
shape, attribute compares) and run the same Numba kernels with the same splits, so results are
bitwise those of the unplanned functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pagedattn.kernels import paged_decode_numba
from pagedattn.kernels.kv_dtype import POOL_DTYPES, kernel_cache, logical_shape
from pagedattn.kernels.paged import split_counts
from pagedattn.kernels.paged_checks import (
    CacheShape,
    IntArray,
    SlotPlan,
    check_pages,
    check_window,
    int_array,
    plan_slots,
)
from pagedattn.kernels.write_kv_numba import scatter_kv

F32Array = npt.NDArray[np.float32]

__all__ = ["SlotPlan", "decode_planned", "plan_decode", "plan_slots", "write_kv_planned"]


def _check_cache_pair(k_cache: F32Array, v_cache: F32Array, shape: CacheShape) -> None:
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if (
            c.dtype not in POOL_DTYPES
            or logical_shape(c.shape, c.dtype) != shape
            or c.dtype != k_cache.dtype
            or not c.flags.c_contiguous
        ):
            raise ValueError(
                f"{name}: expected C-contiguous float32, float16 or int8 (both alike) "
                f"(num_pages, num_kv_heads, page_size, head_dim) = {shape} (the planned pool; "
                f"int8 rows hold head_dim + 4), got {c.dtype} {c.shape}"
            )


def _check_rows(name: str, a: F32Array, shape: tuple[int, int, int], names: str) -> None:
    if not isinstance(a, np.ndarray) or a.shape != shape or a.dtype != np.float32:
        got = f"{a.dtype} {a.shape}" if isinstance(a, np.ndarray) else type(a).__name__
        raise ValueError(f"{name}: expected float32 {names} = {shape}, got {got}")


def write_kv_planned(
    plan: SlotPlan, k_cache: F32Array, v_cache: F32Array, k: F32Array, v: F32Array
) -> None:
    """:func:`~pagedattn.kernels.paged.write_kv` on a planned slot mapping (in place).

    Args:
        plan: from :func:`plan_slots` for this pool shape.
        k_cache, v_cache: float32, float16 or int8 (both alike) ``plan.cache_shape``
            (int8 rows hold head_dim + 4), C-contiguous.
        k, v: float32 (num_tokens, num_kv_heads, head_dim).

    Raises:
        ValueError: a cache or k / v of another shape or dtype.
    """
    _check_cache_pair(k_cache, v_cache, plan.cache_shape)
    shape = (plan.keep.shape[0], plan.cache_shape[1], plan.cache_shape[3])
    _check_rows("k", k, shape, "(num_tokens, num_kv_heads, head_dim)")
    _check_rows("v", v, shape, "(num_tokens, num_kv_heads, head_dim)")
    scatter_kv(
        plan.keep, plan.pages, plan.offsets, k, v, kernel_cache(k_cache), kernel_cache(v_cache)
    )


@dataclass(frozen=True)
class DecodePlan:
    """A decode step's validated metadata: int32 ``tables`` (num_seqs, max_pages_per_seq),
    ``ctx`` (num_seqs,), ``splits`` (num_seqs,) and their maximum ``num_splits``."""

    tables: npt.NDArray[np.int32]
    ctx: npt.NDArray[np.int32]
    splits: npt.NDArray[np.int32]
    num_splits: int
    window: int
    num_sink_tokens: int
    scale: np.float32
    cache_shape: CacheShape


def plan_decode(
    page_tables: IntArray,
    context_lens: IntArray,
    cache_shape: CacheShape,
    *,
    sliding_window: int | None = None,
    num_sink_tokens: int = 0,
    scale: float | None = None,
) -> DecodePlan:
    """Validate decode metadata once (the checks of ``paged_attention_decode``) and fix the
    flash-decoding splits (:func:`~pagedattn.kernels.paged.decode_splits`).

    Args:
        page_tables: integer (num_seqs, max_pages_per_seq); -1 = absent page.
        context_lens: integer (num_seqs,).
        cache_shape: one layer's (num_pages, num_kv_heads, page_size, head_dim), head_dim
            without an int8 pool's scale bytes.
        sliding_window, num_sink_tokens, scale: as in ``paged_attention_decode`` (a layer's own
            window and attention scale; scale None for ``1 / sqrt(head_dim)``).

    Raises:
        ValueError: as ``paged_attention_decode`` for these arguments.
    """
    num_pages, _, page_size, head_dim = cache_shape
    window = check_window(sliding_window, num_sink_tokens)
    tables = int_array("page_tables", page_tables, (-1, -1), "(num_seqs, max_pages_per_seq)")
    num_seqs = tables.shape[0]
    ctx = int_array("context_lens", context_lens, (num_seqs,), "(num_seqs,)")
    check_pages(tables, ctx, None, page_size, num_pages, sliding_window, num_sink_tokens)
    splits, num_splits = split_counts(ctx, sliding_window)
    scale32 = np.float32(1.0 / math.sqrt(head_dim) if scale is None else scale)
    return DecodePlan(
        tables,
        ctx,
        splits,
        num_splits,
        window,
        num_sink_tokens,
        scale32,
        tuple(cache_shape),  # type: ignore[arg-type]
    )


def decode_planned(
    plan: DecodePlan,
    q: F32Array,
    q_sink: F32Array | None,
    k_cache: F32Array,
    v_cache: F32Array,
) -> F32Array:
    """``paged_attention_decode`` (the plan's window and scale) on a planned step, bitwise the
    same.

    Args:
        plan: from :func:`plan_decode`.
        q: float32 (num_seqs, num_heads, head_dim); q_sink: None or like ``q``.
        k_cache, v_cache: float32, float16 or int8 (both alike) ``plan.cache_shape``
            (int8 rows hold head_dim + 4), C-contiguous.

    Returns:
        float32 (num_seqs, num_heads, head_dim).

    Raises:
        ValueError: a cache, q or q_sink of another shape or dtype.
    """
    _check_cache_pair(k_cache, v_cache, plan.cache_shape)
    num_kv_heads, head_dim = plan.cache_shape[1], plan.cache_shape[3]
    num_heads = q.shape[1] if isinstance(q, np.ndarray) and q.ndim == 3 else 0
    if num_heads == 0 or num_heads % num_kv_heads:
        raise ValueError(
            f"q: expected (num_seqs, num_heads, head_dim), num_heads a multiple of "
            f"{num_kv_heads}, got {getattr(q, 'shape', type(q).__name__)}"
        )
    shape = (plan.tables.shape[0], num_heads, head_dim)
    _check_rows("q", q, shape, "(num_seqs, num_heads, head_dim)")
    q = np.ascontiguousarray(q)
    if q_sink is None:
        q_sink = q
    else:
        _check_rows("q_sink", q_sink, shape, "(num_seqs, num_heads, head_dim)")
        q_sink = np.ascontiguousarray(q_sink)
    out, _ = paged_decode_numba.decode_attention(
        q, q_sink, kernel_cache(k_cache), kernel_cache(v_cache), plan.tables, plan.ctx,
        plan.splits, plan.scale, plan.window, plan.num_sink_tokens, plan.num_splits,
    )  # fmt: skip
    result: F32Array = out
    return result
