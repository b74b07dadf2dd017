"""Argument validation shared by the paged kernels: every failure is a ValueError naming
the argument and the expected shape, raised before any kernel runs (one compiled range scan
serves the page-table check's fast path)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from numba import njit

from pagedattn.kernels.kv_dtype import POOL_DTYPES, pool_head_dim
from pagedattn.kernels.kv_int8 import INT8, SCALE_BYTES

IntArray = npt.NDArray[np.integer[Any]]
CacheShape = tuple[int, int, int, int]  # (num_pages, num_kv_heads, page_size, head_dim)
CACHE_SHAPE = "(num_pages, num_kv_heads, page_size, head_dim)"


def _shape_str(shape: tuple[int, ...]) -> str:
    return (
        "("
        + ", ".join("?" if s < 0 else str(s) for s in shape)
        + ("," if len(shape) == 1 else "")
        + ")"
    )


def _shape_ok(shape: tuple[int, ...], expected: tuple[int, ...]) -> bool:
    if len(shape) != len(expected):
        return False
    for e, s in zip(expected, shape, strict=True):  # noqa: SIM110  (all(genexpr) is 2x slower)
        if e >= 0 and e != s:
            return False
    return True


_F32 = np.dtype(np.float32)
_I32 = np.dtype(np.int32)


def check_array(name: str, a: Any, expected: tuple[int, ...], names: str) -> None:
    """Raise unless ``a`` is a float32 ndarray of shape ``expected`` (-1 = any size)."""
    if not isinstance(a, np.ndarray):
        raise ValueError(f"{name}: expected a float32 ndarray {names}, got {type(a).__name__}")
    if a.dtype != _F32:
        raise ValueError(f"{name}: expected float32 {names}, got dtype {a.dtype}")
    if not _shape_ok(a.shape, expected):
        raise ValueError(f"{name}: expected {names} = {_shape_str(expected)}, got {a.shape}")


_INT32_MIN, _INT32_MAX = int(np.iinfo(np.int32).min), int(np.iinfo(np.int32).max)


def int_array(name: str, a: Any, expected: tuple[int, ...], names: str) -> npt.NDArray[np.int32]:
    """Validate an integer array of shape ``expected`` (-1 = any) and return it as C int32."""
    if not isinstance(a, np.ndarray) or a.dtype.kind not in "iu":
        dtype = getattr(a, "dtype", type(a).__name__)
        raise ValueError(f"{name}: expected an integer ndarray {names}, got {dtype}")
    if not _shape_ok(a.shape, expected):
        raise ValueError(f"{name}: expected {names} = {_shape_str(expected)}, got {a.shape}")
    if a.dtype == _I32:
        return a if a.flags.c_contiguous else np.ascontiguousarray(a)
    if a.size and (a.max() > _INT32_MAX or a.min() < _INT32_MIN):
        raise ValueError(f"{name}: expected values that fit int32, got {a.min()}..{a.max()}")
    return np.ascontiguousarray(a, dtype=np.int32)


def check_caches(k_cache: Any, v_cache: Any) -> tuple[int, int, int, int]:
    """Validate the K/V cache pair (float32, float16 or int8, both alike); return (num_pages,
    num_kv_heads, page_size, head_dim), head_dim being an int8 pool's last axis less its scale
    bytes. Hand the kernels :func:`~pagedattn.kernels.kv_dtype.kernel_cache`."""
    if (  # the common case in one expression (a decode call pays for every check)
        type(k_cache) is np.ndarray
        and type(v_cache) is np.ndarray
        and k_cache.dtype in POOL_DTYPES
        and v_cache.dtype == k_cache.dtype
        and k_cache.ndim == 4
        and v_cache.shape == k_cache.shape
        and k_cache.flags.c_contiguous
        and v_cache.flags.c_contiguous
        and k_cache.shape[1] * k_cache.shape[2] * k_cache.shape[3]
        and (k_cache.dtype != INT8 or _int8_width_ok(k_cache.shape[3]))
    ):
        if k_cache.dtype == INT8:
            return (*k_cache.shape[:3], k_cache.shape[3] - SCALE_BYTES)  # type: ignore[return-value]
        return k_cache.shape  # type: ignore[no-any-return]
    if not isinstance(k_cache, np.ndarray) or k_cache.ndim != 4:
        shape = getattr(k_cache, "shape", type(k_cache).__name__)
        raise ValueError(f"k_cache: expected {CACHE_SHAPE}, got {shape}")
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        dtype = getattr(c, "dtype", type(c).__name__)
        if not isinstance(c, np.ndarray) or dtype not in POOL_DTYPES:
            raise ValueError(
                f"{name}: expected float32, float16 or int8 {CACHE_SHAPE}, got {dtype}"
            )
        if c.dtype != k_cache.dtype:
            raise ValueError(f"{name}: expected {k_cache.dtype} like k_cache, got {c.dtype}")
        if c.shape != k_cache.shape:
            raise ValueError(f"{name}: expected {CACHE_SHAPE} = {k_cache.shape}, got {c.shape}")
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not c.flags.c_contiguous:
            raise ValueError(f"{name}: expected a C-contiguous {CACHE_SHAPE} array (a pool view)")
    num_pages, num_kv_heads, page_size, width = k_cache.shape
    if k_cache.dtype == INT8 and not _int8_width_ok(width):
        raise ValueError(
            f"k_cache: expected int8 (num_pages, num_kv_heads, page_size, head_dim + 4), head_dim "
            f"a positive multiple of 4 (codes, then the row's float32 scale), got {k_cache.shape}"
        )
    head_dim = pool_head_dim(k_cache.dtype, width)
    if num_kv_heads == 0 or page_size == 0 or head_dim == 0:
        raise ValueError(f"k_cache: expected non-empty {CACHE_SHAPE}, got {k_cache.shape}")
    return num_pages, num_kv_heads, page_size, head_dim


def _int8_width_ok(width: int) -> bool:
    """An int8 row: a positive multiple of 4 codes, then the 4 scale bytes."""
    return width > SCALE_BYTES and width % SCALE_BYTES == 0


def check_window(sliding_window: int | None, num_sink_tokens: int) -> int:
    """Validate the mask options; return the window as the kernels take it (0 = none)."""
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window: expected None or >= 1, got {sliding_window}")
    if num_sink_tokens < 0:
        raise ValueError(f"num_sink_tokens: expected >= 0, got {num_sink_tokens}")
    return 0 if sliding_window is None else int(sliding_window)


@njit(cache=True, nogil=True)
def _metadata_ranges(
    tables: npt.NDArray[np.int32], ctx: npt.NDArray[np.int32], page_size: int
) -> tuple[int, int, int, int]:  # pragma: no cover - compiled
    """``(min ctx, max ctx, min, max)`` of the table entries up to the longest context (0, 0,
    0, -1 when none): one pass instead of a NumPy reduction per bound."""
    ctx_lo, ctx_hi = 0, 0
    for s in range(ctx.shape[0]):
        c = int(ctx[s])
        ctx_lo = c if s == 0 else min(ctx_lo, c)
        ctx_hi = c if s == 0 else max(ctx_hi, c)
    num_used = min(tables.shape[1], (max(ctx_hi, 0) + page_size - 1) // page_size)
    used_lo, used_hi = 0, -1
    for s in range(tables.shape[0]):
        for i in range(num_used):
            p = int(tables[s, i])
            used_lo = min(used_lo, p)
            used_hi = max(used_hi, p)
    return ctx_lo, ctx_hi, used_lo, used_hi


def check_pages(
    tables: npt.NDArray[np.int32],
    ctx: npt.NDArray[np.int32],
    q_lens: npt.NDArray[np.integer[Any]] | None,
    page_size: int,
    num_pages: int,
    sliding_window: int | None,
    num_sink_tokens: int,
) -> None:
    """Check context lengths against the page tables and the page ids the kernels will read.

    ``-1`` means "absent page" (evicted by the cache): its keys are not visible and it is
    never read. Every other entry of a page holding a key visible to some query row must be a
    valid page id: the sinks ``[0, min(S, ctx))`` and ``[max(p_first - W + 1, S), ctx)``, where
    ``p_first = ctx - q_len`` is the first new row's position; entries outside those ranges
    are never read nor checked. ``q_lens`` None: one new row per sequence (decode).
    """
    capacity = tables.shape[1] * page_size
    ctx_lo, ctx_hi, used_lo, used_hi = _metadata_ranges(tables, ctx, page_size)
    if ctx_lo < 0 or ctx_hi > capacity:
        s = int(np.argmax((ctx < 0) | (ctx > capacity)))
        raise ValueError(
            f"context_lens: expected 0 <= context_len <= max_pages_per_seq * page_size = "
            f"{tables.shape[1]} * {page_size} = {capacity}, sequence {s} has {int(ctx[s])}"
        )
    if used_lo >= -1 and used_hi < num_pages:
        return  # fast path: every entry up to the longest context is a page id or absent
    if q_lens is None:
        q_lens = np.ones(len(ctx), np.int64)
    ctx64 = ctx.astype(np.int64)
    sink_end = np.minimum(num_sink_tokens, ctx64)
    lo = np.zeros_like(ctx64)
    if sliding_window is not None:
        lo = np.maximum(ctx64 - q_lens - sliding_window + 1, 0)
    rest_start = np.maximum(lo, sink_end)
    start = np.arange(tables.shape[1], dtype=np.int64)[None, :] * page_size
    read = (start < sink_end[:, None]) | (
        (start < ctx64[:, None]) & (start + page_size > rest_start[:, None])
    )
    read &= (q_lens > 0)[:, None]
    bad = read & ((tables < -1) | (tables >= num_pages))
    if bad.any():
        s, i = (int(x) for x in np.argwhere(bad)[0])
        raise ValueError(
            f"page_tables: expected page ids in [0, num_pages = {num_pages}) or -1 (absent) "
            f"for every page read, sequence {s} entry {i} is {int(tables[s, i])}"
        )


@dataclass(frozen=True)
class SlotPlan:
    """Where a step's new tokens go in the pool: validated ``slot_mapping`` split into pages
    and in-page offsets. ``keep`` (num_tokens,) bool is False for padding (slot -1);
    ``pages`` / ``offsets`` (num_kept,) int64; ``cache_shape`` the pool layer it was made for."""

    keep: npt.NDArray[np.bool_]
    pages: npt.NDArray[np.int64]
    offsets: npt.NDArray[np.int64]
    cache_shape: CacheShape


def plan_slots(slot_mapping: IntArray, num_tokens: int, cache_shape: CacheShape) -> SlotPlan:
    """Validate ``slot_mapping`` once (the checks of :func:`~pagedattn.kernels.paged.write_kv`).

    Args:
        slot_mapping: integer (num_tokens,); slot = page_id * page_size + offset, or -1 (skip).
        num_tokens: rows of the k / v arrays that will be written.
        cache_shape: one layer's (num_pages, num_kv_heads, page_size, head_dim).

    Raises:
        ValueError: a wrong shape or dtype, or a slot out of range.
    """
    num_pages, _, page_size, _ = cache_shape
    slots = int_array("slot_mapping", slot_mapping, (num_tokens,), "(num_tokens,)")
    num_slots = num_pages * page_size
    bad = (slots < -1) | (slots >= num_slots)
    if bad.any():
        raise ValueError(
            f"slot_mapping: expected slots in [0, {num_slots}) or -1, got {int(slots[bad][0])}"
        )
    keep = slots >= 0
    kept = slots[keep].astype(np.int64)
    shape: CacheShape = tuple(cache_shape)  # type: ignore[assignment]
    return SlotPlan(keep, kept // page_size, kept % page_size, shape)
