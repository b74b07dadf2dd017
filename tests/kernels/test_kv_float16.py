"""A float16 KV pool: written rounded to nearest-even (NumPy's ``astype(float16)`` is the
oracle), read exactly, and attention over it equals the dense reference on the rounded K/V."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from pagedattn.kernels import (
    paged_attention_decode,
    paged_attention_prefill,
    reference_attention,
    write_kv,
)
from pagedattn.kernels.kv_dtype import kernel_cache, load_f32, store_as
from tests.kernels.helpers import randn, scatter_sequences


@njit(cache=False)
def _widen(bits: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled
    for i in range(bits.shape[0]):
        out[i] = load_f32(bits[i])


@njit(cache=False)
def _narrow(x: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled
    for i in range(x.shape[0]):
        out[i] = store_as(x[i], out)


def _same_bits_or_both_nan(a: np.ndarray, b: np.ndarray) -> bool:
    nan = np.isnan(a)
    return bool(np.array_equal(nan, np.isnan(b)) and np.array_equal(a[~nan], b[~nan]))


def test_every_half_bit_pattern_widens_as_numpy_does() -> None:
    bits = np.arange(2**16, dtype=np.uint16)
    out = np.empty(bits.shape, np.float32)
    _widen(bits, out)
    expected = bits.view(np.float16).astype(np.float32)
    assert _same_bits_or_both_nan(out, expected)
    assert np.array_equal(np.signbit(out), np.signbit(expected))  # -0.0 stays -0.0


def test_float32_rounds_to_the_nearest_half_ties_to_even_as_numpy_does() -> None:
    rng = np.random.default_rng(0)
    halves = np.arange(2**16, dtype=np.uint16).view(np.float16).astype(np.float32)
    finite = halves[np.isfinite(halves)]
    # midpoints between neighbouring halves are the ties; just below / above them must round
    # down / up; then the overflow boundary (65520 rounds to inf), subnormals, NaN, +-inf
    s = np.sort(np.unique(finite))
    mid = ((s[:-1].astype(np.float64) + s[1:]) / 2).astype(np.float32)
    specials = np.array(
        [65504, 65519.99, 65520, 1e6, -1e6, 6e-8, 3e-8, 2.9e-8, 1e-10, -0.0, np.inf, -np.inf],
        np.float32,
    )
    x = np.concatenate(
        [
            mid,
            np.nextafter(mid, np.float32(np.inf)),
            np.nextafter(mid, np.float32(-np.inf)),
            specials,
            [np.float32(np.nan)],
            (rng.standard_normal(100_000) * 300).astype(np.float32),
        ]
    ).astype(np.float32)
    out = np.empty(x.shape, np.uint16)
    _narrow(x, out)
    with np.errstate(over="ignore"):
        expected = x.astype(np.float16)
    assert _same_bits_or_both_nan(out.view(np.float16), expected)


def test_write_kv_stores_the_rounded_rows_at_their_slots_only() -> None:
    rng = np.random.default_rng(1)
    k_cache = np.zeros((4, 2, 8, 16), np.float16)
    v_cache = np.zeros((4, 2, 8, 16), np.float16)
    k = (randn(rng, 5, 2, 16) * 1000).astype(np.float32)  # beyond 2048: steps of 2 and more
    v = randn(rng, 5, 2, 16)
    slots = np.array([3, 8, -1, 31, 17])
    write_kv(k_cache, v_cache, k, v, slots)
    written = np.zeros((4, 8), bool)
    for t, slot in enumerate(slots):
        if slot < 0:
            continue
        page, off = divmod(int(slot), 8)
        written[page, off] = True
        np.testing.assert_array_equal(k_cache[page, :, off], k[t].astype(np.float16))
        np.testing.assert_array_equal(v_cache[page, :, off], v[t].astype(np.float16))
    assert not k_cache.transpose(0, 2, 1, 3)[~written].any()
    assert not v_cache.transpose(0, 2, 1, 3)[~written].any()


def _rounded(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).astype(np.float32)


@pytest.mark.parametrize(("window", "sinks"), [(None, 0), (50, 4)])
def test_attention_over_a_float16_pool_is_the_reference_on_the_rounded_kv(
    window: int | None, sinks: int
) -> None:
    """Lengths across online-softmax blocks (64 keys) and flash-decoding splits (256 keys);
    NaN in every unwritten slot, so a read outside the sequences would show."""
    rng = np.random.default_rng(2)
    lens = [1, 70, 300, 600]
    ks = [randn(rng, n, 3, 64) * 2 for n in lens]
    vs = [randn(rng, n, 3, 64) for n in lens]
    kc, vc, tables = scatter_sequences(ks, vs, 16, rng, fill=np.nan, dtype=np.float16)
    assert kc.dtype == np.float16
    ctx = np.array(lens, np.int32)
    opts = {"sliding_window": window, "num_sink_tokens": sinks}
    q = randn(rng, len(lens), 9, 64)
    out = paged_attention_decode(q, kc, vc, tables, ctx, **opts)
    for s, (k, v) in enumerate(zip(ks, vs, strict=True)):
        ref = reference_attention(q[s : s + 1], _rounded(k), _rounded(v), **opts)
        np.testing.assert_allclose(out[s : s + 1], ref, atol=2e-5)
    q_lens = [1, 30, 40, 7]
    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    qp = randn(rng, int(qsl[-1]), 9, 64)
    out = paged_attention_prefill(qp, kc, vc, tables, qsl, ctx, **opts)
    for s, (k, v) in enumerate(zip(ks, vs, strict=True)):
        ref = reference_attention(qp[qsl[s] : qsl[s + 1]], _rounded(k), _rounded(v), **opts)
        np.testing.assert_allclose(out[qsl[s] : qsl[s + 1]], ref, atol=2e-5)


def test_a_float16_pool_reaches_the_kernels_as_its_bits_without_a_copy() -> None:
    pool = np.zeros((2, 1, 4, 8), np.float16)
    bits = kernel_cache(pool)
    assert bits.dtype == np.uint16 and np.shares_memory(bits, pool)
    f32 = np.zeros((2, 1, 4, 8), np.float32)
    assert kernel_cache(f32) is f32


@pytest.mark.parametrize(
    ("k_dtype", "v_dtype", "message"),
    [
        (np.float16, np.float32, r"v_cache: expected float16 like k_cache, got float32"),
        (np.float64, np.float64, r"k_cache: expected float32, float16 or int8 .*, got float64"),
    ],
)
def test_caches_of_other_or_mixed_dtypes_are_refused(
    k_dtype: type, v_dtype: type, message: str
) -> None:
    q = np.zeros((1, 4, 8), np.float32)
    kc = np.zeros((2, 2, 4, 8), k_dtype)
    vc = np.zeros((2, 2, 4, 8), v_dtype)
    with pytest.raises(ValueError, match=message):
        paged_attention_decode(q, kc, vc, np.zeros((1, 1), np.int32), np.array([1], np.int32))
