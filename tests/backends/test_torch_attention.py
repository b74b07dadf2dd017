"""The torch paged attention (gather by page table + SDPA) against the dense reference over
exactly the visible keys: chunked prefill and decode rows in one batch, GQA, sliding window,
sinks scored with their own queries, evicted pages (-1) and never-written (NaN) slots."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pagedattn.backends import BackendSpec
from pagedattn.kernels import reference_attention, write_kv
from pagedattn.model.forward_batch import ForwardBatch
from tests.kernels.helpers import scatter_sequences

torch = pytest.importorskip("torch")
from pagedattn.model.torch_attention import TorchStepAttention  # noqa: E402

CASES = [
    # (k_lens, q_lens, page_size, num_heads, num_kv_heads, window, sinks, shifted)
    ([1, 9, 17], [1, 9, 1], 4, 4, 2, None, 0, False),
    ([40, 7, 23], [5, 1, 23], 8, 6, 2, 6, 0, False),
    ([33, 50, 12], [1, 16, 12], 4, 4, 1, 9, 2, False),
    ([64, 31], [1, 3], 4, 8, 8, 10, 3, True),
    ([5, 70, 18, 1], [5, 1, 7, 1], 16, 4, 2, 20, 4, True),
]


def _batch(k_lens, q_lens, tables, window, sinks) -> ForwardBatch:  # type: ignore[no-untyped-def]
    n = sum(q_lens)
    return ForwardBatch(
        input_ids=np.zeros(n, np.int64),
        positions=np.zeros(n, np.int64),
        slot_mapping=np.full(n, -1, np.int64),
        query_start_loc=np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32),
        context_lens=np.asarray(k_lens, np.int32),
        page_tables=tables,
        logits_indices=np.zeros(0, np.int64),
        sliding_window=window,
        num_sink_tokens=sinks,
    )


@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_dense_reference_over_visible_keys(torch_backend: BackendSpec, case) -> None:  # type: ignore[no-untyped-def]
    k_lens, q_lens, page_size, nh, nkv, window, sinks, shifted = case
    rng = np.random.default_rng(sum(k_lens))
    D = 16
    ks = [rng.standard_normal((n, nkv, D)).astype(np.float32) for n in k_lens]
    vs = [rng.standard_normal((n, nkv, D)).astype(np.float32) for n in k_lens]
    kc, vc, tables = scatter_sequences(ks, vs, page_size, rng, fill=np.nan)
    if window is not None:  # evict pages no row can see (as the cache manager does): -1 + NaN
        for s, (k_len, q_len) in enumerate(zip(k_lens, q_lens, strict=True)):
            for p in range(-(-k_len // page_size)):
                first, last = p * page_size, min((p + 1) * page_size, k_len) - 1
                if first >= sinks and last <= k_len - q_len - window:
                    kc[tables[s, p]] = vc[tables[s, p]] = np.nan
                    tables[s, p] = -1
    q = rng.standard_normal((sum(q_lens), nh, D)).astype(np.float32)
    q_sink = rng.standard_normal(q.shape).astype(np.float32) if shifted else None
    dev = torch_backend.device
    step = TorchStepAttention(
        torch, _batch(k_lens, q_lens, tables, window, sinks), page_size, kc.shape[0], dev
    )
    out = step.attention(
        torch.from_numpy(q).to(dev),
        None if q_sink is None else torch.from_numpy(q_sink).to(dev),
        torch.from_numpy(kc).to(dev),
        torch.from_numpy(vc).to(dev),
    )
    out = out.cpu().numpy()
    assert out.shape == q.shape and np.isfinite(out).all()
    start = 0
    for s, q_len in enumerate(q_lens):
        rows = slice(start, start + q_len)
        ref = reference_attention(
            q[rows], ks[s], vs[s], sliding_window=window, num_sink_tokens=sinks,
            q_sink=None if q_sink is None else q_sink[rows],
        )  # fmt: skip
        np.testing.assert_allclose(out[rows], ref, atol=1e-5, err_msg=f"sequence {s}")
        start += q_len


def test_write_kv_matches_numpy_write_kv_bitwise(torch_backend: BackendSpec) -> None:
    rng = np.random.default_rng(0)
    shape = (6, 2, 4, 8)
    k = rng.standard_normal((7, 2, 8)).astype(np.float32)
    v = rng.standard_normal((7, 2, 8)).astype(np.float32)
    slots = np.array([3, 0, -1, 23, 9, -1, 14], np.int64)
    kc, vc = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
    write_kv(kc, vc, k, v, slots)
    batch = _slots_batch(slots)
    step = TorchStepAttention(torch, batch, 4, 6, torch_backend.device)
    tk = torch.zeros(shape, device=torch_backend.device)
    tv = torch.zeros(shape, device=torch_backend.device)
    step.write_kv(tk, tv, torch.from_numpy(k).to(tk.device), torch.from_numpy(v).to(tk.device))
    np.testing.assert_array_equal(tk.cpu().numpy(), kc)
    np.testing.assert_array_equal(tv.cpu().numpy(), vc)


def _slots_batch(slots: np.ndarray) -> ForwardBatch:
    """A one-token-per-sequence batch whose only content is ``slots``."""
    n = slots.shape[0]
    return ForwardBatch(
        input_ids=np.zeros(n, np.int64),
        positions=np.zeros(n, np.int64),
        slot_mapping=slots,
        query_start_loc=np.arange(n + 1, dtype=np.int32),
        context_lens=np.ones(n, np.int32),
        page_tables=np.zeros((n, 1), np.int32),
        logits_indices=np.zeros(0, np.int64),
    )


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("slot_mapping", np.array([24], np.int64), "slot_mapping: expected slots in"),
        ("page_tables", np.array([[6]], np.int32), "page_tables: expected page ids in"),
    ],
)
def test_out_of_pool_ids_are_refused(field: str, value: np.ndarray, fragment: str) -> None:
    batch = _slots_batch(np.array([0], np.int64))
    with pytest.raises(ValueError, match=fragment):
        TorchStepAttention(torch, dataclasses.replace(batch, **{field: value}), 4, 6, "cpu")


def test_a_row_that_sees_no_key_is_zero_as_in_the_reference(torch_backend: BackendSpec) -> None:
    # sequence 1's only page was evicted (-1): its row sees nothing; sequence 0 is untouched
    rng = np.random.default_rng(2)
    kc = rng.standard_normal((3, 1, 4, 8)).astype(np.float32)
    vc = rng.standard_normal((3, 1, 4, 8)).astype(np.float32)
    tables = np.array([[1, 2], [-1, -1]], np.int32)
    batch = _batch([6, 3], [1, 1], tables, 2, 0)
    q = rng.standard_normal((2, 2, 8)).astype(np.float32)
    step = TorchStepAttention(torch, batch, 4, 3, torch_backend.device)
    dev = torch_backend.device
    t = [torch.from_numpy(a).to(dev) for a in (q, kc, vc)]
    out = step.attention(t[0], None, t[1], t[2]).cpu().numpy()
    k0 = np.concatenate([kc[1, :, :4], kc[2, :, :2]], axis=1).transpose(1, 0, 2)  # (6, 1, 8)
    v0 = np.concatenate([vc[1, :, :4], vc[2, :, :2]], axis=1).transpose(1, 0, 2)
    ref = reference_attention(q[:1], k0, v0, sliding_window=2)
    np.testing.assert_allclose(out[:1], ref, atol=1e-5)
    np.testing.assert_array_equal(out[1], np.zeros((2, 8), np.float32))
