"""Hypothesis: paged decode and prefill equal the dense reference (fp32, atol 1e-5), for every
implementation (the Numba kernels; the array-namespace kernels on NumPy, torch, CuPy)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pagedattn.kernels import reference_attention, visible_mask
from tests.kernels.helpers import randn, scatter_sequences
from tests.kernels.impls import ATTENTION_PARAMS, impl


@st.composite
def batches(draw: st.DrawFn) -> dict:  # type: ignore[type-arg]
    page_size = draw(st.sampled_from([1, 2, 3, 5, 8, 16, 17, 32, 64]))
    num_kv_heads = draw(st.sampled_from([1, 2, 3]))
    group = draw(st.sampled_from([1, 3, 8]))
    head_dim = draw(st.sampled_from([4, 8, 16, 64]))
    num_seqs = draw(st.integers(1, 4))
    ctx = draw(st.lists(st.integers(1, 100), min_size=num_seqs, max_size=num_seqs))
    # Chunked prefill: q_len new tokens on top of a cached prefix, boundary anywhere.
    q_lens = [draw(st.integers(1, c)) for c in ctx]
    window = draw(st.one_of(st.none(), st.integers(1, 40)))
    sinks = draw(st.sampled_from([0, 0, 1, 4, 20]))
    use_q_sink = draw(st.booleans())
    free_unread = draw(st.booleans())
    seed = draw(st.integers(0, 2**31 - 1))
    return {
        "page_size": page_size,
        "num_kv_heads": num_kv_heads,
        "num_heads": num_kv_heads * group,
        "head_dim": head_dim,
        "ctx": ctx,
        "q_lens": q_lens,
        "window": window,
        "sinks": sinks,
        "use_q_sink": use_q_sink,
        "free_unread": free_unread,
        "seed": seed,
    }


def _setup(b: dict, rows: list[int]):  # type: ignore[no-untyped-def, type-arg]
    rng = np.random.default_rng(b["seed"])
    ks = [randn(rng, c, b["num_kv_heads"], b["head_dim"]) for c in b["ctx"]]
    vs = [randn(rng, c, b["num_kv_heads"], b["head_dim"]) for c in b["ctx"]]
    kc, vc, tables = scatter_sequences(ks, vs, b["page_size"], rng)
    if b["free_unread"]:
        # Pages holding no visible key are freed (-1) and poisoned (NaN), as the cache does
        # for pages that slid out of the window: the kernels must never touch them.
        for s, (c, n) in enumerate(zip(b["ctx"], rows, strict=True)):
            seen = visible_mask(n, c, sliding_window=b["window"], num_sink_tokens=b["sinks"]).any(
                axis=0
            )
            for i in range(-(-c // b["page_size"])):
                if not seen[i * b["page_size"] : (i + 1) * b["page_size"]].any():
                    kc[tables[s, i]] = vc[tables[s, i]] = np.nan
                    tables[s, i] = -1
    q = randn(rng, sum(rows), b["num_heads"], b["head_dim"])
    q_sink = randn(rng, *q.shape) if b["use_q_sink"] else None
    return ks, vs, kc, vc, tables, q, q_sink


def _mask_kwargs(b: dict) -> dict:  # type: ignore[type-arg]
    return {"sliding_window": b["window"], "num_sink_tokens": b["sinks"]}


def _on(kind: str, *arrays: np.ndarray | None) -> list:  # type: ignore[type-arg]
    to = impl(kind).to_backend
    return [None if a is None else to(a) for a in arrays]


@pytest.mark.parametrize("kind", ATTENTION_PARAMS)
@given(b=batches())
def test_decode_matches_reference(kind: str, b: dict) -> None:  # type: ignore[type-arg]
    ks, vs, kc, vc, tables, q, q_sink = _setup(b, [1] * len(b["ctx"]))
    out, lse = impl(kind).ops.paged_attention_decode(
        *_on(kind, q, kc, vc),
        tables,
        np.array(b["ctx"], np.int32),
        q_sink=_on(kind, q_sink)[0],
        return_lse=True,
        **_mask_kwargs(b),
    )
    out, lse = impl(kind).to_host(out), impl(kind).to_host(lse)
    for s in range(len(ks)):
        qs = None if q_sink is None else q_sink[s : s + 1]
        ref, ref_lse = reference_attention(
            q[s : s + 1], ks[s], vs[s], q_sink=qs, return_lse=True, **_mask_kwargs(b)
        )
        np.testing.assert_allclose(out[s : s + 1], ref, atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(lse[s : s + 1], ref_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ATTENTION_PARAMS)
@given(b=batches())
def test_prefill_matches_reference(kind: str, b: dict) -> None:  # type: ignore[type-arg]
    ks, vs, kc, vc, tables, q, q_sink = _setup(b, b["q_lens"])
    qsl = np.concatenate([[0], np.cumsum(b["q_lens"])]).astype(np.int32)
    out, lse = impl(kind).ops.paged_attention_prefill(
        *_on(kind, q, kc, vc),
        tables,
        qsl,
        np.array(b["ctx"], np.int32),
        q_sink=_on(kind, q_sink)[0],
        return_lse=True,
        **_mask_kwargs(b),
    )
    out, lse = impl(kind).to_host(out), impl(kind).to_host(lse)
    for s in range(len(ks)):
        a, e = qsl[s], qsl[s + 1]
        qs = None if q_sink is None else q_sink[a:e]
        ref, ref_lse = reference_attention(
            q[a:e], ks[s], vs[s], q_sink=qs, return_lse=True, **_mask_kwargs(b)
        )
        np.testing.assert_allclose(out[a:e], ref, atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(lse[a:e], ref_lse, atol=1e-5, rtol=1e-5)
