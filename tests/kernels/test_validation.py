"""Every bad input is a ValueError naming the argument and the expected shape."""

from __future__ import annotations

import numpy as np
import pytest

from pagedattn.kernels import (
    paged_attention_decode,
    paged_attention_prefill,
    reference_attention,
    write_kv,
)

KC = np.zeros((6, 3, 4, 8), np.float32)  # num_pages 6, kv heads 3, page_size 4, head_dim 8
TABLES = np.array([[0, 1], [2, 3]], np.int32)
CTX = np.array([5, 8], np.int32)
Q = np.zeros((2, 9, 8), np.float32)


def decode(**kw):  # type: ignore[no-untyped-def]
    args = {"q": Q, "k_cache": KC, "v_cache": KC, "page_tables": TABLES, "context_lens": CTX}
    args.update(kw)
    return paged_attention_decode(**args)


def prefill(**kw):  # type: ignore[no-untyped-def]
    args = {
        "q": np.zeros((5, 9, 8), np.float32),
        "k_cache": KC,
        "v_cache": KC,
        "page_tables": TABLES,
        "query_start_loc": np.array([0, 2, 5], np.int32),
        "context_lens": CTX,
    }
    args.update(kw)
    return paged_attention_prefill(**args)


@pytest.mark.parametrize(
    ("kw", "pattern"),
    [
        (
            {"q": np.zeros((2, 9, 4), np.float32)},
            r"q: expected \(num_seqs, num_heads, head_dim\) = \(2, 9, 8\), got \(2, 9, 4\)",
        ),
        ({"q": np.zeros((2, 9), np.float32)}, r"q: expected \(num_seqs, num_heads, head_dim\)"),
        ({"q": np.zeros((2, 8, 8), np.float32)}, r"q: expected num_heads a multiple of"),
        ({"q": Q.astype(np.float64)}, r"q: expected float32 \(num_seqs, num_heads, head_dim\)"),
        ({"q_sink": np.zeros((1, 9, 8), np.float32)}, r"q_sink: expected .* = \(2, 9, 8\)"),
        ({"k_cache": KC[0]}, r"k_cache: expected \(num_pages, num_kv_heads, page_size, head_dim\)"),
        ({"v_cache": KC[:5]}, r"v_cache: expected .* = \(6, 3, 4, 8\), got \(5, 3, 4, 8\)"),
        ({"v_cache": KC.astype(np.float16)}, r"v_cache: expected float32"),
        (
            {"k_cache": np.zeros((6, 3, 8, 4), np.float32)[:, :, ::2]},
            r"v_cache: expected .* = \(6, 3, 4, 4\)",
        ),
        (
            {
                "k_cache": np.zeros((6, 3, 8, 8), np.float32)[:, :, ::2],
                "v_cache": np.zeros((6, 3, 8, 8), np.float32)[:, :, ::2],
            },
            r"k_cache: expected a C-contiguous",
        ),
        ({"page_tables": TABLES.astype(np.float32)}, r"page_tables: expected an integer ndarray"),
        (
            {"page_tables": TABLES[:1]},
            r"page_tables: expected \(num_seqs, max_pages_per_seq\) = \(2, \?\)",
        ),
        ({"context_lens": CTX[:1]}, r"context_lens: expected \(num_seqs,\) = \(2,\)"),
        (
            {"context_lens": np.array([5, 9], np.int32)},
            r"context_lens: expected .* max_pages_per_seq \* page_size = 2 \* 4 = 8",
        ),
        (
            {"page_tables": np.array([[0, 6], [2, 3]], np.int32)},
            r"page_tables: expected page ids in \[0, num_pages = 6\).*sequence 0 entry 1 is 6",
        ),
        (
            {"page_tables": np.array([[0, 1], [-2, 3]], np.int32)},
            r"page_tables: .*or -1 \(absent\).*sequence 1 entry 0 is -2",
        ),
        ({"sliding_window": 0}, r"sliding_window: expected None or >= 1"),
        ({"num_sink_tokens": -1}, r"num_sink_tokens: expected >= 0"),
    ],
)
def test_decode_rejects(kw: dict, pattern: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError, match=pattern):
        decode(**kw)


def test_absent_pages_are_not_visible() -> None:
    """-1 marks a page the cache evicted: its keys drop out of the softmax, never read."""
    rng = np.random.default_rng(7)
    k_cache = np.full((6, 3, 4, 8), np.nan, np.float32)  # NaN: any read would poison the output
    v_cache = np.full((6, 3, 4, 8), np.nan, np.float32)
    k = rng.standard_normal((12, 3, 8), dtype=np.float32)
    v = rng.standard_normal((12, 3, 8), dtype=np.float32)
    tables = np.array([[4, -1, 2]], np.int32)  # keys 4..7 live on an evicted page
    kept = np.r_[0:4, 8:12]
    j = kept
    write_kv(k_cache, v_cache, k[kept], v[kept], tables[0, j // 4] * 4 + j % 4)
    q = rng.standard_normal((1, 9, 8), dtype=np.float32)
    ctx = np.array([12], np.int32)
    expected = reference_attention(q, k[kept], v[kept])  # the last row sees every kept key
    out = paged_attention_decode(q, k_cache, v_cache, tables, ctx)
    np.testing.assert_allclose(out, expected, atol=1e-5)
    out = paged_attention_prefill(q, k_cache, v_cache, tables, np.array([0, 1], np.int32), ctx)
    np.testing.assert_allclose(out, expected, atol=1e-5)
    # A window that only covers the absent page: the row sees nothing -> zeros, lse -inf.
    only_absent = np.array([[4, -1, -1]], np.int32)
    out, lse = paged_attention_decode(
        q, k_cache, v_cache, only_absent, np.array([8], np.int32), sliding_window=4,
        return_lse=True,
    )  # fmt: skip
    assert (out == 0).all() and np.isneginf(lse).all()


@pytest.mark.parametrize(
    ("kw", "pattern"),
    [
        (
            {"q": np.zeros((5, 9, 7), np.float32)},
            r"q: expected \(num_tokens, num_heads, head_dim\) = \(5, 9, 8\)",
        ),
        (
            {"query_start_loc": np.array([0, 5], np.int32)},
            r"query_start_loc: expected \(num_seqs \+ 1,\) = \(3,\)",
        ),
        (
            {"query_start_loc": np.array([0, 3, 2], np.int32)},
            r"query_start_loc: expected non-decreasing",
        ),
        (
            {"query_start_loc": np.array([0, 2, 4], np.int32)},
            r"query_start_loc: .*to num_tokens = 5",
        ),
        (
            {"context_lens": np.array([1, 8], np.int32)},
            r"context_lens: expected >= q_len.*sequence 0 has q_len 2 > context_len 1",
        ),
        ({"page_tables": np.array([[0, 1], [2, 9]], np.int32)}, r"page_tables: expected page ids"),
    ],
)
def test_prefill_rejects(kw: dict, pattern: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError, match=pattern):
        prefill(**kw)


def test_write_kv_rejects() -> None:
    k = np.zeros((2, 3, 8), np.float32)
    with pytest.raises(
        ValueError, match=r"k: expected \(num_tokens, num_kv_heads, head_dim\) = \(2, 3, 8\)"
    ):
        write_kv(KC.copy(), KC.copy(), k[:, :2], k, np.array([0, 1]))
    with pytest.raises(ValueError, match=r"v: expected .* = \(2, 3, 8\), got \(1, 3, 8\)"):
        write_kv(KC.copy(), KC.copy(), k, k[:1], np.array([0, 1]))
    with pytest.raises(ValueError, match=r"slot_mapping: expected \(num_tokens,\) = \(2,\)"):
        write_kv(KC.copy(), KC.copy(), k, k, np.array([0]))
    with pytest.raises(
        ValueError, match=r"slot_mapping: expected slots in \[0, 24\) or -1, got 24"
    ):
        write_kv(KC.copy(), KC.copy(), k, k, np.array([0, 24]))
    with pytest.raises(ValueError, match=r"got -2"):
        write_kv(KC.copy(), KC.copy(), k, k, np.array([-2, 1]))


def test_reference_rejects() -> None:
    q = np.zeros((3, 4, 8), np.float32)
    k = np.zeros((5, 2, 8), np.float32)
    with pytest.raises(ValueError, match=r"v: expected \(5, 2, 8\), got \(5, 2, 4\)"):
        reference_attention(q, k, np.zeros((5, 2, 4), np.float32))
    with pytest.raises(ValueError, match=r"k: expected num_kv_heads dividing num_heads = 4"):
        reference_attention(q, np.zeros((5, 3, 8), np.float32), np.zeros((5, 3, 8), np.float32))
    with pytest.raises(ValueError, match=r"q_len: expected <= k_len = 2"):
        reference_attention(q, k[:2], k[:2])
