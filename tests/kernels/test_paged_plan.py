"""Planned write_kv / decode (metadata validated once per step) == the validated public API,
bit for bit, and == the dense reference; bad metadata is refused at plan time."""

from __future__ import annotations

import numpy as np
import pytest

from pagedattn.kernels import paged_attention_decode, reference_attention, write_kv
from pagedattn.kernels.paged_plan import decode_planned, plan_decode, plan_slots, write_kv_planned
from tests.kernels.helpers import randn, scatter_sequences

LENS = [1, 40, 600]  # 600 keys: two flash-decoding splits (SPLIT_MIN_KEYS = 256), merged


@pytest.mark.parametrize(("window", "sinks"), [(None, 0), (300, 4)])
def test_planned_decode_is_bitwise_paged_attention_decode(window: int | None, sinks: int) -> None:
    rng = np.random.default_rng(0)
    ks = [randn(rng, n, 2, 16) for n in LENS]
    vs = [randn(rng, n, 2, 16) for n in LENS]
    kc, vc, tables = scatter_sequences(ks, vs, 16, rng)
    ctx = np.array(LENS, np.int64)
    plan = plan_decode(tables, ctx, kc.shape, sliding_window=window, num_sink_tokens=sinks)
    assert plan.splits.tolist() == [1, 1, 2 if window is None else 1]
    for layer in range(2):  # the same plan serves every layer's q
        q, q_sink = randn(rng, 3, 4, 16), randn(rng, 3, 4, 16)
        want = paged_attention_decode(
            q, kc, vc, tables, ctx, sliding_window=window, num_sink_tokens=sinks, q_sink=q_sink
        )
        got = decode_planned(plan, q, q_sink, kc, vc)
        np.testing.assert_array_equal(got, want, err_msg=f"layer {layer}")
        for s in range(3):  # and the dense oracle
            ref = reference_attention(
                q[s : s + 1], ks[s], vs[s], sliding_window=window, num_sink_tokens=sinks,
                q_sink=q_sink[s : s + 1],
            )  # fmt: skip
            np.testing.assert_allclose(got[s : s + 1], ref, atol=2e-5)


def test_planned_write_kv_is_write_kv_and_skips_padding() -> None:
    rng = np.random.default_rng(1)
    shape = (5, 2, 4, 8)
    slots = np.array([3, -1, 17, 0, 19], np.int64)
    k, v = randn(rng, 5, 2, 8), randn(rng, 5, 2, 8)
    want_k, want_v = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
    write_kv(want_k, want_v, k, v, slots)
    got_k, got_v = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
    write_kv_planned(plan_slots(slots, 5, shape), got_k, got_v, k, v)
    np.testing.assert_array_equal(got_k, want_k)
    np.testing.assert_array_equal(got_v, want_v)
    np.testing.assert_array_equal(got_k[4, :, 1], k[2])  # slot 17 = page 4, offset 1, by hand
    assert np.count_nonzero(got_v.any(axis=(1, 3))) == 4  # the -1 row wrote nothing


def test_bad_metadata_and_arrays_are_refused() -> None:
    shape = (5, 2, 4, 8)
    with pytest.raises(ValueError, match=r"slot_mapping: expected slots in \[0, 20\) or -1"):
        plan_slots(np.array([20]), 1, shape)
    with pytest.raises(ValueError, match=r"slot_mapping: expected \(num_tokens,\)"):
        plan_slots(np.array([1, 2]), 3, shape)
    with pytest.raises(ValueError, match="page_tables: expected page ids"):
        plan_decode(np.array([[7]]), np.array([3]), shape)
    with pytest.raises(ValueError, match="context_lens: expected 0 <= context_len"):
        plan_decode(np.array([[1]]), np.array([5]), shape)
    plan = plan_decode(np.array([[1]]), np.array([3]), shape)
    cache = np.zeros(shape, np.float32)
    with pytest.raises(ValueError, match=r"q: expected float32 \(num_seqs, num_heads, head_dim\)"):
        decode_planned(plan, np.zeros((2, 4, 8), np.float32), None, cache, cache)
    with pytest.raises(ValueError, match="num_heads a multiple of 2"):
        decode_planned(plan, np.zeros((1, 3, 8), np.float32), None, cache, cache)
    with pytest.raises(ValueError, match=r"k_cache: expected C-contiguous float32"):
        decode_planned(plan, np.zeros((1, 4, 8), np.float32), None, cache[:4], cache)
    slots = plan_slots(np.array([0]), 1, shape)
    with pytest.raises(ValueError, match=r"v: expected float32 \(num_tokens, num_kv_heads"):
        write_kv_planned(slots, cache, cache, np.zeros((1, 2, 8), np.float32), np.zeros((1, 2, 8)))
