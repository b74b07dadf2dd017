"""The array-namespace kernels: fixed cases on every available library, arrays stay on the
backend, and the argument checks name the expected shape like the Numba kernels' do."""

from __future__ import annotations

import numpy as np
import pytest

from pagedattn.backends import xp_kernels
from pagedattn.backends.arrays import to_host
from pagedattn.kernels import paged_attention_decode, reference_attention
from tests.kernels.helpers import randn, scatter_sequences
from tests.kernels.impls import ATTENTION_PARAMS, IMPL_PARAMS, impl

XP_PARAMS = [p for p in ATTENTION_PARAMS if p.id != "numba"]


@pytest.mark.parametrize("kind", IMPL_PARAMS)
def test_write_kv_writes_exactly_the_given_slots(kind: str) -> None:
    rng = np.random.default_rng(9)
    k, v = randn(rng, 4, 2, 5), randn(rng, 4, 2, 5)
    slots = np.array([5, -1, 11, 0], np.int64)
    to = impl(kind).to_backend
    kc, vc = to(np.zeros((3, 2, 4, 5), np.float32)), to(np.zeros((3, 2, 4, 5), np.float32))
    impl(kind).ops.write_kv(kc, vc, to(k), to(v), slots)
    expected_k, expected_v = np.zeros((3, 2, 4, 5), np.float32), np.zeros((3, 2, 4, 5), np.float32)
    for t, slot in enumerate(slots):
        if slot >= 0:  # slot = page * page_size + offset, page_size 4
            expected_k[slot // 4, :, slot % 4] = k[t]
            expected_v[slot // 4, :, slot % 4] = v[t]
    np.testing.assert_array_equal(to_host(kc), expected_k)
    np.testing.assert_array_equal(to_host(vc), expected_v)


@pytest.mark.parametrize("kind", XP_PARAMS)
def test_nan_pages_never_reach_output_and_results_stay_on_the_backend(kind: str) -> None:
    rng = np.random.default_rng(3)
    lens = [1, 9, 17, 40]
    ks = [randn(rng, n, 2, 16) for n in lens]
    vs = [randn(rng, n, 2, 16) for n in lens]
    kc, vc, tables = scatter_sequences(ks, vs, 4, rng, fill=np.nan)
    tables[3, 2:6] = -1  # keys 8..23 freed: sinks 0..1 and window 34..39 stay
    kw = {"sliding_window": 6, "num_sink_tokens": 2}
    q, qs = randn(rng, 4, 4, 16), randn(rng, 4, 4, 16)
    to = impl(kind).to_backend
    out = impl(kind).ops.paged_attention_decode(
        to(q), to(kc), to(vc), tables, np.array(lens, np.int32), q_sink=to(qs), **kw
    )
    assert type(out) is type(to(q))  # the backend's array, on its device
    host = impl(kind).to_host(out)
    assert np.isfinite(host).all()
    for s in range(4):
        ref = reference_attention(q[s : s + 1], ks[s], vs[s], q_sink=qs[s : s + 1], **kw)
        np.testing.assert_allclose(host[s : s + 1], ref, atol=1e-5)


@pytest.mark.parametrize("kind", XP_PARAMS)
def test_row_seeing_no_key_is_zero_with_lse_minus_inf(kind: str) -> None:
    rng = np.random.default_rng(7)
    to = impl(kind).to_backend
    kc = to(np.full((4, 1, 4, 8), np.nan, np.float32))
    tables = np.array([[-1, -1], [3, -1]], np.int32)  # sequence 0: nothing cached
    out, lse = impl(kind).ops.paged_attention_decode(
        to(randn(rng, 2, 2, 8)), kc, kc, tables, np.array([0, 0], np.int32), return_lse=True
    )
    np.testing.assert_array_equal(impl(kind).to_host(out), 0.0)
    np.testing.assert_array_equal(impl(kind).to_host(lse), -np.inf)
    qsl = np.array([0, 0, 0], np.int32)
    out = impl(kind).ops.paged_attention_prefill(
        to(np.zeros((0, 2, 8), np.float32)), kc, kc, tables, qsl, np.array([0, 0], np.int32)
    )
    assert tuple(out.shape) == (0, 2, 8)


def test_long_prefill_over_several_row_blocks_with_window(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Blocks of 16 rows each gather only the pages their rows may see (sinks + window).
    monkeypatch.setattr(xp_kernels, "PREFILL_BLOCK_ROWS", 16)
    rng = np.random.default_rng(12)
    k, v = randn(rng, 90, 1, 8), randn(rng, 90, 1, 8)
    kc, vc, tables = scatter_sequences([k], [v], 8, rng)
    q = randn(rng, 70, 3, 8)  # rows at positions 20..89 over a 20-token cached prefix
    kw = {"sliding_window": 10, "num_sink_tokens": 3}
    out = xp_kernels.paged_attention_prefill(
        q, kc, vc, tables, np.array([0, 70], np.int32), np.array([90], np.int32), **kw
    )
    np.testing.assert_allclose(out, reference_attention(q, k, v, **kw), atol=1e-5)


def test_integer_tables_may_be_backend_arrays() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    k, v = randn(rng, 12, 1, 8), randn(rng, 12, 1, 8)
    kc, vc, tables = scatter_sequences([k], [v], 4, rng)
    q = randn(rng, 1, 2, 8)
    out = xp_kernels.paged_attention_decode(
        torch.from_numpy(q),
        torch.from_numpy(kc),
        torch.from_numpy(vc),
        torch.from_numpy(tables),
        torch.tensor([12], dtype=torch.int32),
    )
    expected = paged_attention_decode(q, kc, vc, tables, np.array([12], np.int32))
    np.testing.assert_allclose(out.numpy(), expected, atol=1e-6)


def _decode_args() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    kc = np.zeros((4, 2, 4, 8), np.float32)
    return np.zeros((1, 4, 8), np.float32), kc, kc.copy(), np.zeros((1, 2), np.int32), np.ones(1)


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"q": np.zeros((1, 3, 8), np.float32)}, "num_heads a multiple of num_kv_heads = 2"),
        ({"q": np.zeros((1, 4, 7), np.float32)}, r"q: expected \(num_seqs, num_heads, head_dim"),
        ({"q": np.zeros((1, 4, 8), np.float64)}, "q: expected float32"),
        ({"k_cache": np.zeros((4, 2, 8), np.float32)}, "k_cache: expected \\(num_pages"),
        ({"page_tables": np.zeros((2, 2), np.int32)}, "page_tables: expected"),
        ({"context_lens": np.array([9], np.int32)}, "context_lens: expected 0 <= context_len"),
        ({"page_tables": np.array([[7, 0]], np.int32)}, "page_tables: expected page ids"),
        ({"q_sink": np.zeros((2, 4, 8), np.float32)}, "q_sink: expected"),
    ],
)
def test_bad_arguments_name_the_expected_shape(change: dict, fragment: str) -> None:  # type: ignore[type-arg]
    q, kc, vc, tables, ctx = _decode_args()
    args = {"q": q, "k_cache": kc, "v_cache": vc, "page_tables": tables}
    args |= {"context_lens": ctx.astype(np.int32), "q_sink": None} | change
    with pytest.raises(ValueError, match=fragment):
        xp_kernels.paged_attention_decode(**args)


def test_mixed_libraries_are_refused() -> None:
    torch = pytest.importorskip("torch")
    q, kc, vc, tables, ctx = _decode_args()
    with pytest.raises(ValueError, match="expected arrays of one array library"):
        xp_kernels.paged_attention_decode(torch.from_numpy(q), kc, vc, tables, ctx.astype(int))
    with pytest.raises(ValueError, match=r"slot_mapping: expected slots in \[0, 16\) or -1"):
        xp_kernels.write_kv(kc, vc, q[:, :2], q[:, :2], np.array([16]))


@pytest.mark.parametrize("kind", XP_PARAMS)
def test_int8_pages_are_refused_by_name(kind: str) -> None:
    to = impl(kind).to_backend
    q = to(np.zeros((1, 4, 8), np.float32))
    pool = np.zeros((2, 2, 4, 8 + 4), np.int8)
    with pytest.raises(ValueError, match=r"k_cache: int8 KV pages .* numpy backend's kernels"):
        impl(kind).ops.paged_attention_decode(
            q, to(pool), to(pool), np.zeros((1, 1), np.int32), np.array([1], np.int32)
        )
