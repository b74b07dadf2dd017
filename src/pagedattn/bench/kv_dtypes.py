"""Decode-attention pools of each KV dtype for ``pagedattn bench kernels``, and the same-run
comparison of the dtypes: the paged kernel over a float32, float16 and int8 copy of the same
keys and values, timed in turn one call each per round, so the ratios compare the same moments
of the machine. At head_dim 64 an int8 pool streams (64 + 4) / 128 = 0.53 of float16's bytes."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np


def kv_dtype_decode_ms(
    batch: int, context: int, repeats: int, dtypes: Sequence[str], *, seed: int = 0
) -> dict[str, float]:
    """Median ms of the paged decode kernel over a pool of each of ``dtypes`` (the same values,
    shuffled pages, 9 query heads over 3 KV heads, head_dim 64, page_size 16), interleaved."""
    from pagedattn.bench.kernels import (
        HEAD_DIM,
        NUM_HEADS,
        NUM_KV_HEADS,
        PAGE_SIZE,
        interleaved_median_ms,
    )
    from pagedattn.bench.kv_pools import quantize_pool
    from pagedattn.kernels import paged_attention_decode

    rng = np.random.default_rng(seed)
    pages_per_seq = math.ceil(context / PAGE_SIZE)
    num_pages = batch * pages_per_seq
    shape = (num_pages, NUM_KV_HEADS, PAGE_SIZE, HEAD_DIM)
    k = rng.random(shape, dtype=np.float32) - np.float32(0.5)
    v = rng.random(shape, dtype=np.float32) - np.float32(0.5)
    tables = rng.permutation(num_pages).astype(np.int32).reshape(batch, pages_per_seq)
    lens = np.full(batch, context, np.int32)
    q = rng.standard_normal((batch, NUM_HEADS, HEAD_DIM), dtype=np.float32)

    def timer(dtype: str) -> Callable[[], object]:
        if dtype == "int8":
            kc, vc = quantize_pool(k), quantize_pool(v)
        else:
            kc, vc = k.astype(dtype), v.astype(dtype)
        return lambda: paged_attention_decode(q, kc, vc, tables, lens)

    return interleaved_median_ms({d: timer(d) for d in dtypes}, repeats, warmup=2)


def kv_dtype_comparisons(ms: dict[str, float]) -> list[tuple[str, str]]:
    """(comparison, measured) rows: each dtype's decode speed over float16's, when float16 was
    timed in the same rounds."""
    if "float16" not in ms:
        return []
    return [
        (f"{dtype} vs float16 (decode speed)", f"{ms['float16'] / value:.2f}x")
        for dtype, value in ms.items()
        if dtype != "float16"
    ]
