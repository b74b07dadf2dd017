"""Argument checks of the array-namespace kernels: one library, one device, float32 shapes.

Every failure is a ValueError naming the argument and the expected shape, as
:mod:`pagedattn.kernels.paged_checks` reports for the Numba kernels (whose integer-table checks
these kernels reuse on the host).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from array_api_compat import array_namespace, device, is_array_api_obj

from pagedattn.kernels.paged_checks import check_window

CACHE_SHAPE = "(num_pages, num_kv_heads, page_size, head_dim)"


def _shape_str(shape: tuple[int, ...]) -> str:
    inner = ", ".join("?" if s < 0 else str(s) for s in shape)
    return f"({inner}{',' if len(shape) == 1 else ''})"


def namespace(names: str, *arrays: Any) -> tuple[Any, Any]:
    """The array namespace and device shared by ``arrays`` (None entries are skipped).

    Args:
        names: the arguments' names, for the message (e.g. ``"q, k_cache, v_cache"``).

    Raises:
        ValueError: an entry is not an array, the arrays come from different libraries, or
            they live on different devices.
    """
    present = [a for a in arrays if a is not None]
    for a in present:
        if not is_array_api_obj(a):
            raise ValueError(f"{names}: expected float32 arrays, got {type(a).__name__}")
    try:
        xp = array_namespace(*present)
    except TypeError as e:
        kinds = sorted({type(a).__module__ + "." + type(a).__name__ for a in present})
        raise ValueError(f"{names}: expected arrays of one array library, got {kinds}") from e
    devices = [device(a) for a in present]
    if any(d != devices[0] for d in devices[1:]):
        raise ValueError(f"{names}: expected arrays on one device, got {[str(d) for d in devices]}")
    return xp, devices[0]


def check_float(name: str, a: Any, xp: Any, expected: tuple[int, ...], names: str) -> None:
    """Raise unless ``a`` is a float32 array of shape ``expected`` (-1 = any size)."""
    if not is_array_api_obj(a):
        raise ValueError(f"{name}: expected a float32 array {names}, got {type(a).__name__}")
    if a.dtype != xp.float32:
        raise ValueError(f"{name}: expected float32 {names}, got dtype {a.dtype}")
    shape = tuple(a.shape)
    if len(shape) != len(expected) or any(
        e >= 0 and e != s for e, s in zip(expected, shape, strict=False)
    ):
        raise ValueError(f"{name}: expected {names} = {_shape_str(expected)}, got {shape}")


def check_caches(k_cache: Any, v_cache: Any, xp: Any) -> tuple[int, int, int, int]:
    """Validate the K/V cache pair; return (num_pages, num_kv_heads, page_size, head_dim).

    Unlike the Numba kernels the caches may be strided views: they are read with ``take``.
    """
    shape = tuple(getattr(k_cache, "shape", ()))
    if len(shape) != 4:
        got = shape if is_array_api_obj(k_cache) else type(k_cache).__name__
        raise ValueError(f"k_cache: expected {CACHE_SHAPE}, got {got}")
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if str(getattr(c, "dtype", "")).rsplit(".", 1)[-1] == "int8":  # torch.int8, ...
            raise ValueError(
                f"{name}: int8 KV pages (kv_cache_dtype int8) are read by the numpy backend's "
                f"kernels only; the array-namespace kernels take float32 pools"
            )
    check_float("k_cache", k_cache, xp, shape, CACHE_SHAPE)
    check_float("v_cache", v_cache, xp, shape, CACHE_SHAPE)
    num_pages, num_kv_heads, page_size, head_dim = shape
    if num_kv_heads == 0 or page_size == 0 or head_dim == 0:
        raise ValueError(f"k_cache: expected non-empty {CACHE_SHAPE}, got {shape}")
    return num_pages, num_kv_heads, page_size, head_dim


def check_query(
    q: Any, q_sink: Any, xp: Any, num_kv_heads: int, head_dim: int, q_shape: str
) -> tuple[int, int]:
    """Validate ``q`` (and ``q_sink`` like it); return (rows, num_heads).

    Raises:
        ValueError: not 3-D, ``num_heads`` not a positive multiple of ``num_kv_heads``, a
            wrong head_dim or dtype, or ``q_sink`` shaped unlike ``q``.
    """
    shape = tuple(q.shape)
    if len(shape) != 3:
        raise ValueError(f"q: expected {q_shape}, got {shape}")
    rows, num_heads = shape[0], shape[1]
    if num_heads == 0 or num_heads % num_kv_heads != 0:
        raise ValueError(
            f"q: expected num_heads a multiple of num_kv_heads = {num_kv_heads}, got {shape}"
        )
    check_float("q", q, xp, (rows, num_heads, head_dim), q_shape)
    if q_sink is not None:
        check_float("q_sink", q_sink, xp, (rows, num_heads, head_dim), q_shape)
    return rows, num_heads


def check_attention(
    q: Any,
    q_sink: Any,
    k_cache: Any,
    v_cache: Any,
    q_shape: str,
    scale: float | None,
    sliding_window: int | None,
    num_sink_tokens: int,
) -> tuple[Any, Any, tuple[int, int, int, int], int, float]:
    """Check the float arguments and mask options of a paged attention call.

    Returns:
        (namespace, device, (num_pages, num_kv_heads, page_size, head_dim), num_heads,
        the scale as the float32 value the kernels multiply by).
    """
    xp, dev = namespace("q, q_sink, k_cache, v_cache", q, q_sink, k_cache, v_cache)
    dims = check_caches(k_cache, v_cache, xp)
    _, num_heads = check_query(q, q_sink, xp, dims[1], dims[3], q_shape)
    check_window(sliding_window, num_sink_tokens)
    scale32 = float(np.float32(1.0 / math.sqrt(dims[3]) if scale is None else scale))
    return xp, dev, dims, num_heads, scale32
