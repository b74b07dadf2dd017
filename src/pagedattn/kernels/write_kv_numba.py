"""Numba scatter of a step's new K/V rows into their pool slots (no validation here: the
callers, :func:`~pagedattn.kernels.paged.write_kv` and
:func:`~pagedattn.kernels.paged_plan.write_kv_planned`, check shapes and slots first)."""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit
from numba.extending import overload

from pagedattn.kernels.kv_dtype import store_as
from pagedattn.kernels.kv_int8 import CODE_MAX, is_int8_pool, store_scale


def write_row(cache: Any, page: Any, g: Any, t: Any, x: Any, i: Any) -> Any:  # pragma: no cover
    """Store float32 row ``x[i, g, :]`` as row ``cache[page, g, t]`` (int8: quantized)."""
    raise NotImplementedError("write_row is only callable from Numba kernels")


# The overload's parameters carry no annotations: Numba requires the typing function's
# signature to equal its implementations'.
@overload(write_row, inline="always")
def _write_row(cache, page, g, t, x, i):  # type: ignore[no-untyped-def]
    if is_int8_pool(cache):

        def quantize(cache, page, g, t, x, i):  # type: ignore[no-untyped-def]
            head_dim = x.shape[2]
            absmax = np.float32(0.0)
            for d in range(head_dim):
                absmax = max(absmax, abs(x[i, g, d]))
            scale = absmax / np.float32(CODE_MAX)
            if scale > 0:
                for d in range(head_dim):
                    code = min(max(np.rint(x[i, g, d] / scale), -CODE_MAX), CODE_MAX)
                    cache[page, g, t, d] = np.int8(code)
            else:
                for d in range(head_dim):
                    cache[page, g, t, d] = 0
            store_scale(cache, page, g, t, scale)  # type: ignore[call-arg]

        return quantize

    def narrow(cache, page, g, t, x, i):  # type: ignore[no-untyped-def]
        for d in range(x.shape[2]):
            cache[page, g, t, d] = store_as(x[i, g, d], cache)

    return narrow


@njit(cache=True, nogil=True)
def scatter_kv(
    keep: np.ndarray,
    pages: np.ndarray,
    offsets: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """``k_cache[pages[i], :, offsets[i], :] = k[t]`` (and v) for the i-th token ``t`` with
    ``keep[t]``: one copy loop instead of NumPy's fancy-index gather and scatter (a decode step
    writes one row per layer, where the indexing machinery costs 20x the copy).

    keep: (num_tokens,) bool; pages, offsets: (num_kept,) int64; k, v: (num_tokens,
    num_kv_heads, head_dim) float32; k_cache, v_cache: (num_pages, num_kv_heads, page_size,
    head_dim) float32 or float16 bits, or int8 ``head_dim + 4`` wide (each row quantized with
    its scale: :mod:`pagedattn.kernels.kv_int8`), updated in place.
    """
    i = 0
    for t in range(keep.shape[0]):
        if keep[t]:
            page, offset = pages[i], offsets[i]
            for h in range(k.shape[1]):
                write_row(k_cache, page, h, offset, k, t)
                write_row(v_cache, page, h, offset, v, t)
            i += 1
