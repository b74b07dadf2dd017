"""Numba scatter of a step's new K/V rows into their pool slots (no validation here: the
callers, :func:`~pagedattn.kernels.paged.write_kv` and
:func:`~pagedattn.kernels.paged_plan.write_kv_planned`, check shapes and slots first)."""

from __future__ import annotations

import numpy as np
from numba import njit

from pagedattn.kernels.kv_dtype import store_as


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
    head_dim) float32, updated in place.
    """
    i = 0
    for t in range(keep.shape[0]):
        if keep[t]:
            page, offset = pages[i], offsets[i]
            for h in range(k.shape[1]):
                for d in range(k.shape[2]):
                    k_cache[page, h, offset, d] = store_as(k[t, h, d], k_cache)
                    v_cache[page, h, offset, d] = store_as(v[t, h, d], v_cache)
            i += 1
