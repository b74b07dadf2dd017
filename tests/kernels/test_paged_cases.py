"""Fixed cases: NaN isolation, batch independence, GQA mapping, empty rows, write_kv."""

from __future__ import annotations

import numpy as np
import pytest

from pagedattn.kernels import (
    paged,
    paged_attention_decode,
    paged_attention_prefill,
    reference_attention,
    write_kv,
)
from tests.kernels.helpers import randn, scatter_sequences

LENS = [1, 9, 17]


@pytest.fixture
def nan_batch() -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    ks = [randn(rng, n, 2, 16) for n in LENS]
    vs = [randn(rng, n, 2, 16) for n in LENS]
    kc, vc, tables = scatter_sequences(ks, vs, 16, rng, fill=np.nan)
    return ks, vs, kc, vc, tables


def test_decode_nan_slots_never_reach_output_and_batch_independent(nan_batch) -> None:  # type: ignore[no-untyped-def]
    ks, vs, kc, vc, tables = nan_batch
    rng = np.random.default_rng(4)
    q = randn(rng, 3, 4, 16)
    ctx = np.array(LENS, np.int32)
    out = paged_attention_decode(q, kc, vc, tables, ctx)
    assert np.isfinite(out).all()
    for s in range(3):
        np.testing.assert_allclose(
            out[s : s + 1], reference_attention(q[s : s + 1], ks[s], vs[s]), atol=1e-5
        )
        alone = paged_attention_decode(q[s : s + 1], kc, vc, tables[s : s + 1], ctx[s : s + 1])
        np.testing.assert_array_equal(alone, out[s : s + 1])


def test_prefill_nan_slots_never_reach_output_and_batch_independent(nan_batch) -> None:  # type: ignore[no-untyped-def]
    ks, vs, kc, vc, tables = nan_batch
    rng = np.random.default_rng(5)
    qsl = np.array([0, 1, 10, 27], np.int32)
    q = randn(rng, 27, 4, 16)
    ctx = np.array(LENS, np.int32)
    out = paged_attention_prefill(q, kc, vc, tables, qsl, ctx, sliding_window=5, num_sink_tokens=1)
    assert np.isfinite(out).all()
    for s in range(3):
        a, b = qsl[s], qsl[s + 1]
        ref = reference_attention(q[a:b], ks[s], vs[s], sliding_window=5, num_sink_tokens=1)
        np.testing.assert_allclose(out[a:b], ref, atol=1e-5)
        alone = paged_attention_prefill(
            q[a:b],
            kc,
            vc,
            tables[s : s + 1],
            np.array([0, b - a], np.int32),
            ctx[s : s + 1],
            sliding_window=5,
            num_sink_tokens=1,
        )
        np.testing.assert_array_equal(alone, out[a:b])


def test_gqa_mapping_9_heads_3_kv_heads() -> None:
    rng = np.random.default_rng(6)
    k = randn(rng, 20, 3, 8)
    v = np.broadcast_to(np.arange(1, 4, dtype=np.float32)[None, :, None], (20, 3, 8)).copy()
    kc, vc, tables = scatter_sequences([k], [v], 16, rng)
    expected = np.repeat([1.0, 2.0, 3.0], 3)
    q = randn(rng, 20, 9, 8)
    ref = reference_attention(q, k, v)
    np.testing.assert_allclose(ref[:, :, 0], np.broadcast_to(expected, (20, 9)), rtol=1e-6)
    pre = paged_attention_prefill(
        q, kc, vc, tables, np.array([0, 20], np.int32), np.array([20], np.int32)
    )
    np.testing.assert_allclose(pre[:, :, 0], np.broadcast_to(expected, (20, 9)), rtol=1e-6)
    dec = paged_attention_decode(q[-1:], kc, vc, tables, np.array([20], np.int32))
    np.testing.assert_allclose(dec[0, :, 0], expected, rtol=1e-6)


def test_row_seeing_no_key_is_zero_with_lse_minus_inf() -> None:
    rng = np.random.default_rng(7)
    kc = np.full((4, 1, 4, 8), np.nan, np.float32)
    vc = kc.copy()
    tables = np.full((2, 2), -1, np.int32)  # nothing cached at all
    out, lse = paged_attention_decode(
        randn(rng, 2, 2, 8), kc, vc, tables, np.zeros(2, np.int32), return_lse=True
    )
    np.testing.assert_array_equal(out, 0.0)
    np.testing.assert_array_equal(lse, -np.inf)
    ref, ref_lse = reference_attention(
        np.zeros((0, 2, 8), np.float32),
        np.zeros((0, 1, 8), np.float32),
        np.zeros((0, 1, 8), np.float32),
        return_lse=True,
    )
    assert ref.shape == (0, 2, 8) and ref_lse.shape == (0, 2)
    # Non-causal rows over zero keys see nothing: zeros and -inf, no NaN.
    out1, lse1 = reference_attention(
        randn(rng, 2, 2, 8),
        np.zeros((0, 1, 8), np.float32),
        np.zeros((0, 1, 8), np.float32),
        causal=False,
        return_lse=True,
    )
    np.testing.assert_array_equal(out1, 0.0)
    np.testing.assert_array_equal(lse1, -np.inf)


def test_decode_skips_freed_pages_outside_window() -> None:
    rng = np.random.default_rng(8)
    k, v = randn(rng, 40, 1, 8), randn(rng, 40, 1, 8)
    kc, vc, tables = scatter_sequences([k], [v], 8, rng)
    tables[0, 1:3] = -1  # keys 8..23 freed: sinks 0..1 and window 34..39 stay
    q, qs = randn(rng, 1, 2, 8), randn(rng, 1, 2, 8)
    out = paged_attention_decode(
        q, kc, vc, tables, np.array([40], np.int32), sliding_window=6, num_sink_tokens=2, q_sink=qs
    )
    ref = reference_attention(q, k, v, sliding_window=6, num_sink_tokens=2, q_sink=qs)
    np.testing.assert_allclose(out, ref, atol=1e-5)


def test_decode_split_whose_pages_are_all_absent_weighs_nothing(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # 64 keys in 4 splits of 16 (two pages of 8 each): split 1 (keys 16..31) and the whole of
    # sequence 1 are absent pages; the merge must drop those partial states, not average NaN in.
    monkeypatch.setattr(paged, "SPLIT_MIN_KEYS", 16)
    rng = np.random.default_rng(12)
    ks = [randn(rng, 64, 1, 8), randn(rng, 64, 1, 8)]
    vs = [randn(rng, 64, 1, 8), randn(rng, 64, 1, 8)]
    kc, vc, tables = scatter_sequences(ks, vs, 8, rng)
    tables[0, 2:4] = -1
    tables[1, :] = -1
    q = randn(rng, 2, 2, 8)
    lens = np.array([64, 64], np.int32)
    assert paged.decode_splits(lens, None).tolist() == [4, 4]
    out, lse = paged_attention_decode(q, kc, vc, tables, lens, return_lse=True)
    seen = np.r_[0:16, 32:64]
    ref, ref_lse = reference_attention(
        q[:1], ks[0][seen], vs[0][seen], causal=False, return_lse=True
    )
    np.testing.assert_allclose(out[:1], ref, atol=1e-5)
    np.testing.assert_allclose(lse[:1], ref_lse, atol=1e-5)
    np.testing.assert_array_equal(out[1], 0.0)
    np.testing.assert_array_equal(lse[1], -np.inf)


def test_split_counts_are_one_per_256_keys_capped_at_8_with_their_maximum() -> None:
    # by hand: 255 keys -> 1 (at least one), 600 // 256 = 2, 5000 // 256 = 19 -> 8 (the cap)
    splits, most = paged.split_counts(np.array([0, 255, 600, 5000], np.int32), None)
    assert splits.dtype == np.int32 and splits.tolist() == [1, 1, 2, 8] and most == 8
    splits, most = paged.split_counts(np.array([600, 5000], np.int64), 512)  # min(keys, W)
    assert splits.tolist() == [2, 2] and most == 2
    splits, most = paged.split_counts(np.zeros(0, np.int32), None)
    assert splits.size == 0 and most == 1


def test_write_kv_writes_exactly_the_given_slots() -> None:
    rng = np.random.default_rng(9)
    kc = np.zeros((3, 2, 4, 5), np.float32)
    vc = np.zeros_like(kc)
    k, v = randn(rng, 4, 2, 5), randn(rng, 4, 2, 5)
    slots = np.array([5, -1, 11, 0], np.int64)
    write_kv(kc, vc, k, v, slots)
    expected_k = np.zeros_like(kc)
    expected_v = np.zeros_like(vc)
    for t, slot in enumerate(slots):
        if slot >= 0:
            expected_k[slot // 4, :, slot % 4] = k[t]
            expected_v[slot // 4, :, slot % 4] = v[t]
    np.testing.assert_array_equal(kc, expected_k)
    np.testing.assert_array_equal(vc, expected_v)
    assert np.count_nonzero(kc.any(axis=(1, 3))) == 3  # three (page, offset) slots touched


@pytest.mark.parametrize(("window", "sinks"), [(None, 0), (None, 3), (50, 0), (37, 5), (300, 2)])
def test_decode_split_keys_match_reference(monkeypatch, window: int | None, sinks: int) -> None:  # type: ignore[no-untyped-def]
    # Each sequence's keys are cut into slices by its own length; their states get merged.
    monkeypatch.setattr(paged, "SPLIT_MIN_KEYS", 8)
    lens = [200, 3, 61]
    splits = paged.decode_splits(np.array(lens), window)
    assert splits[1] == 1 and splits.max() > 1  # one batch mixes split counts
    rng = np.random.default_rng(11)
    ks = [randn(rng, n, 1, 16) for n in lens]
    vs = [randn(rng, n, 1, 16) for n in lens]
    kc, vc, tables = scatter_sequences(ks, vs, 7, rng)
    q, qs = randn(rng, 3, 2, 16), randn(rng, 3, 2, 16)
    kw = {"sliding_window": window, "num_sink_tokens": sinks}
    out, lse = paged_attention_decode(
        q, kc, vc, tables, np.array(lens, np.int32), q_sink=qs, return_lse=True, **kw
    )
    for s in range(3):
        ref, ref_lse = reference_attention(
            q[s : s + 1], ks[s], vs[s], q_sink=qs[s : s + 1], return_lse=True, **kw
        )
        np.testing.assert_allclose(out[s : s + 1], ref, atol=1e-5)
        np.testing.assert_allclose(lse[s : s + 1], ref_lse, atol=1e-5)
