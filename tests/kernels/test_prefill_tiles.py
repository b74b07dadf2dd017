"""Prefill kernel tile paths: head_dim and page sizes off the 4 / 8 multiples, long blocks."""

from __future__ import annotations

import numpy as np
import pytest

from pagedattn.kernels import paged_attention_prefill, reference_attention
from tests.kernels.helpers import randn, scatter_sequences


@pytest.mark.parametrize(
    ("head_dim", "page_size", "group", "window", "sinks"),
    [
        (5, 3, 3, None, 0),  # head_dim % 4 == 1, page_size % 4 == 3
        (7, 17, 1, 40, 2),  # odd head_dim, pages crossing key blocks, window + sinks
        (6, 16, 8, None, 0),  # head_dim % 4 == 2, many lanes per row
        (64, 16, 3, 100, 4),  # the SmolLM2 shape: unmasked tiles, diagonal, window edge
        (64, 64, 3, None, 0),  # one page per key block
    ],
)
def test_prefill_chunk_matches_reference(
    head_dim: int, page_size: int, group: int, window: int | None, sinks: int
) -> None:
    rng = np.random.default_rng(head_dim * 100 + page_size)
    num_kv_heads, ctx, q_len = 2, 203, 150  # chunked: 53 keys already cached
    k = randn(rng, ctx, num_kv_heads, head_dim)
    v = randn(rng, ctx, num_kv_heads, head_dim)
    kc, vc, tables = scatter_sequences([k], [v], page_size, rng, fill=np.nan)
    q = randn(rng, q_len, num_kv_heads * group, head_dim)
    q_sink = randn(rng, *q.shape)
    out, lse = paged_attention_prefill(
        q,
        kc,
        vc,
        tables,
        np.array([0, q_len], np.int32),
        np.array([ctx], np.int32),
        q_sink=q_sink,
        return_lse=True,
        sliding_window=window,
        num_sink_tokens=sinks,
    )
    ref, ref_lse = reference_attention(
        q, k, v, q_sink=q_sink, return_lse=True, sliding_window=window, num_sink_tokens=sinks
    )
    np.testing.assert_allclose(out, ref, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(lse, ref_lse, atol=1e-5, rtol=1e-5)
