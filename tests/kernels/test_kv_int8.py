"""An int8 KV pool: each (token, KV head) row written as codes plus a float32 scale (a NumPy
re-derivation of absmax / 127 and round-half-even is the oracle), and attention over it equals
the dense reference on the dequantized K/V (codes times scale, by hand in NumPy)."""

from __future__ import annotations

import numpy as np
import pytest

from pagedattn.kernels import (
    paged_attention_decode,
    paged_attention_prefill,
    reference_attention,
    write_kv,
)
from pagedattn.kernels.attention_mass import page_attention_mass
from pagedattn.kernels.paged_plan import decode_planned, plan_decode, plan_slots, write_kv_planned
from tests.kernels.helpers import randn, scatter_sequences

TOL = 1e-5  # paged kernels on int8 pages vs the dense reference on the dequantized K/V


def _quantize(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes int8, scales float32) of float32 rows (..., head_dim), derived here in NumPy."""
    absmax = np.abs(rows).max(axis=-1, keepdims=True)
    scale = absmax / np.float32(127)
    with np.errstate(divide="ignore", invalid="ignore"):
        codes = np.where(scale > 0, np.rint(rows / scale), 0)
    return np.clip(codes, -127, 127).astype(np.int8), scale[..., 0]


def _codes(cache: np.ndarray) -> np.ndarray:
    return cache[..., :-4]


def _scales(cache: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(cache).view(np.float32)[..., -1]


def _dequantized(cache: np.ndarray, table: np.ndarray, n: int) -> np.ndarray:
    """(n, num_kv_heads, head_dim) float32 values of a sequence's first n rows."""
    j = np.arange(n)
    pages, offsets = table[j // cache.shape[2]], j % cache.shape[2]
    codes = _codes(cache)[pages, :, offsets].astype(np.float32)
    return codes * _scales(cache)[pages, :, offsets][..., None]


def test_write_kv_stores_codes_and_scales_as_numpy_derives_them() -> None:
    rng = np.random.default_rng(1)
    k_cache = np.zeros((4, 2, 8, 16 + 4), np.int8)
    v_cache = np.zeros((4, 2, 8, 16 + 4), np.int8)
    k = (randn(rng, 5, 2, 16) * 1000).astype(np.float32)
    v = randn(rng, 5, 2, 16)
    # ties: absmax 127 gives scale 1, so x.5 must round to even; a zero row gets scale 0
    k[1, 0] = np.array([127, 2.5, 3.5, -2.5, -3.5, 0.5, 1.5, -0.5] * 2, np.float32)
    v[3, 1] = 0.0
    slots = np.array([3, 8, -1, 31, 17])
    write_kv(k_cache, v_cache, k, v, slots)
    written = np.zeros((4, 8), bool)
    for cache, rows in ((k_cache, k), (v_cache, v)):
        codes, scales = _quantize(rows)
        for t, slot in enumerate(slots):
            if slot < 0:
                continue
            page, off = divmod(int(slot), 8)
            written[page, off] = True
            np.testing.assert_array_equal(_codes(cache)[page, :, off], codes[t])
            np.testing.assert_array_equal(_scales(cache)[page, :, off], scales[t])
        assert not cache.transpose(0, 2, 1, 3)[~written].any()
    assert _codes(k_cache)[1, 0, 0, :8].tolist() == [127, 2, 4, -2, -4, 0, 2, 0]
    assert _scales(v_cache)[3, 1, 7] == 0 and not _codes(v_cache)[3, 1, 7].any()


@pytest.mark.parametrize(("window", "sinks"), [(None, 0), (50, 4)])
def test_attention_over_an_int8_pool_is_the_reference_on_the_dequantized_kv(
    window: int | None, sinks: int
) -> None:
    """GQA (9 query heads over 3 KV heads), several pages per sequence, lengths across
    online-softmax blocks (64 keys) and flash-decoding splits (256 keys); unwritten rows hold
    code 127 and a NaN scale, so a read outside the sequences would show."""
    rng = np.random.default_rng(2)
    lens = [1, 70, 300, 600]
    ks = [randn(rng, n, 3, 64) * 2 for n in lens]
    vs = [randn(rng, n, 3, 64) for n in lens]
    kc, vc, tables = scatter_sequences(ks, vs, 16, rng, fill=np.nan, dtype=np.int8)
    assert kc.dtype == np.int8 and kc.shape[-1] == 68
    ctx = np.array(lens, np.int32)
    opts = {"sliding_window": window, "num_sink_tokens": sinks}
    dense = [(_dequantized(kc, tables[s], n), _dequantized(vc, tables[s], n)) for s, n in
             enumerate(lens)]  # fmt: skip
    for (k, _), written in zip(dense, ks, strict=True):  # within a step of the written rows
        assert np.abs(k - written).max() <= np.abs(written).max() / 127
    q = randn(rng, len(lens), 9, 64)
    out = paged_attention_decode(q, kc, vc, tables, ctx, **opts)
    planned = decode_planned(plan_decode(tables, ctx, (kc.shape[0], 3, 16, 64), **opts),
                             q, None, kc, vc)  # fmt: skip
    np.testing.assert_array_equal(planned, out)
    for s, (k, v) in enumerate(dense):
        ref = reference_attention(q[s : s + 1], k, v, **opts)
        np.testing.assert_allclose(out[s : s + 1], ref, atol=TOL)
    q_lens = [1, 30, 40, 7]
    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    qp = randn(rng, int(qsl[-1]), 9, 64)
    out = paged_attention_prefill(qp, kc, vc, tables, qsl, ctx, **opts)
    for s, (k, v) in enumerate(dense):
        ref = reference_attention(qp[qsl[s] : qsl[s + 1]], k, v, **opts)
        np.testing.assert_allclose(out[qsl[s] : qsl[s + 1]], ref, atol=TOL)


def test_planned_write_quantizes_as_write_kv_does() -> None:
    rng = np.random.default_rng(3)
    shape = (3, 2, 4, 8 + 4)
    a_k, a_v, b_k, b_v = (np.zeros(shape, np.int8) for _ in range(4))
    k, v = randn(rng, 6, 2, 8), randn(rng, 6, 2, 8)
    slots = np.array([0, 5, 11, -1, 2, 7])
    write_kv(a_k, a_v, k, v, slots)
    write_kv_planned(plan_slots(slots, 6, (3, 2, 4, 8)), b_k, b_v, k, v)
    np.testing.assert_array_equal(a_k, b_k)
    np.testing.assert_array_equal(a_v, b_v)


def test_page_mass_over_an_int8_pool_is_the_softmax_of_the_dequantized_keys() -> None:
    rng = np.random.default_rng(4)
    lens = [5, 40]
    ks = [randn(rng, n, 2, 16) for n in lens]
    kc, vc, tables = scatter_sequences(ks, ks, 8, rng, fill=0.0, dtype=np.int8)
    q = randn(rng, 2, 4, 16)
    ctx = np.array(lens, np.int32)
    _, lse = paged_attention_decode(q, kc, vc, tables, ctx, return_lse=True)
    mass = page_attention_mass(q, kc, tables, ctx, lse)
    for s, n in enumerate(lens):
        k = _dequantized(kc, tables[s], n)  # (n, 2, 16)
        logits = np.einsum("hd,jhd->hj", q[s], np.repeat(k, 2, axis=1)) / 4.0
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        per_page = np.add.reduceat(p.sum(axis=0), np.arange(0, n, 8))
        np.testing.assert_allclose(mass[s, : len(per_page)], per_page, atol=1e-5)


@pytest.mark.parametrize(
    ("width", "message"),
    [
        (8 + 2, r"k_cache: expected int8 .*head_dim \+ 4.*multiple of 4"),
        (4, r"k_cache: expected int8 .*head_dim \+ 4"),
    ],
)
def test_int8_pools_without_room_for_whole_codes_and_a_scale_are_refused(
    width: int, message: str
) -> None:
    q = np.zeros((1, 4, width - 4), np.float32)
    kc = np.zeros((2, 2, 4, width), np.int8)
    with pytest.raises(ValueError, match=message):
        paged_attention_decode(q, kc, kc.copy(), np.zeros((1, 1), np.int32), np.array([1]))


def test_an_int8_pool_beside_a_float16_one_is_refused() -> None:
    q = np.zeros((1, 4, 8), np.float32)
    kc = np.zeros((2, 2, 4, 12), np.int8)
    vc = np.zeros((2, 2, 4, 12), np.float16)
    with pytest.raises(ValueError, match="v_cache: expected int8 like k_cache, got float16"):
        paged_attention_decode(q, kc, vc, np.zeros((1, 1), np.int32), np.array([1]))
