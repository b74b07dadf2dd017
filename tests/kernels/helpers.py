"""Build paged caches from dense per-sequence K/V for the kernel tests."""

from __future__ import annotations

import numpy as np

from pagedattn.kernels import write_kv


def scatter_sequences(
    ks: list[np.ndarray],
    vs: list[np.ndarray],
    page_size: int,
    rng: np.random.Generator,
    *,
    extra_pages: int = 3,
    fill: float = np.nan,
    dtype: type = np.float32,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Write each sequence's dense (k_len, num_kv_heads, head_dim) K/V into shuffled pages.

    Returns (k_cache, v_cache, page_tables) of ``dtype`` (float32, float16, or int8 with rows
    ``head_dim + 4`` wide); unused slots hold ``fill`` (int8: code 127 and a ``fill`` scale)
    and unused table entries are -1.
    """
    num_kv_heads, head_dim = ks[0].shape[1], ks[0].shape[2]
    pages_per_seq = [-(-k.shape[0] // page_size) for k in ks]
    num_pages = sum(pages_per_seq) + extra_pages
    max_pages = max([*pages_per_seq, 1]) + 1
    if np.dtype(dtype) == np.int8:
        shape = (num_pages, num_kv_heads, page_size, head_dim + 4)
        k_cache, v_cache = np.full(shape, 127, np.int8), np.full(shape, 127, np.int8)
        for c in (k_cache, v_cache):
            c.view(np.float32)[..., -1] = fill
    else:
        shape = (num_pages, num_kv_heads, page_size, head_dim)
        k_cache = np.full(shape, fill, dtype)
        v_cache = np.full(shape, fill, dtype)
    tables = np.full((len(ks), max_pages), -1, np.int32)
    free = rng.permutation(num_pages).astype(np.int32)
    used = 0
    for s, (k, v) in enumerate(zip(ks, vs, strict=True)):
        n = pages_per_seq[s]
        tables[s, :n] = free[used : used + n]
        used += n
        j = np.arange(k.shape[0])
        write_kv(k_cache, v_cache, k, v, tables[s, j // page_size] * page_size + j % page_size)
    return k_cache, v_cache, tables


def randn(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32)
