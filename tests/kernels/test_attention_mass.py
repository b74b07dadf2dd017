"""Per-page attention mass (the H2O opt-in output) vs the dense reference softmax."""

from __future__ import annotations

import numpy as np
import pytest

from pagedattn.kernels import paged_attention_decode
from pagedattn.kernels.attention_mass import page_attention_mass
from pagedattn.kernels.reference import visible_mask
from tests.kernels.helpers import randn, scatter_sequences


def dense_page_mass(
    q: np.ndarray,
    k: np.ndarray,
    visible: np.ndarray,
    page_size: int,
    num_table_pages: int,
    q_sink: np.ndarray,
    num_sinks: int,
) -> np.ndarray:
    """Softmax over the visible keys in float64, summed per page and over heads."""
    num_heads, group = q.shape[0], q.shape[0] // k.shape[1]
    out = np.zeros(num_table_pages)
    for h in range(num_heads):
        kh = k[:, h // group].astype(np.float64)  # (k_len, D)
        s = np.where(np.arange(k.shape[0]) < num_sinks, kh @ q_sink[h], kh @ q[h])
        s = s / np.sqrt(q.shape[1])
        s = np.where(visible, s, -np.inf)
        p = np.exp(s - s.max())
        p /= p.sum()
        np.add.at(out, np.arange(k.shape[0]) // page_size, p)
    return out


@pytest.mark.parametrize(
    ("window", "sinks", "shifted"),
    [(None, 0, False), (21, 0, False), (21, 3, False), (17, 4, True)],
)
def test_page_mass_matches_dense_softmax(window: int | None, sinks: int, shifted: bool) -> None:
    rng = np.random.default_rng(7)
    page_size, nh, nkv, d = 8, 6, 2, 16
    lens = [1, 45, 70]
    ks = [randn(rng, n, nkv, d) for n in lens]
    vs = [randn(rng, n, nkv, d) for n in lens]
    k_cache, v_cache, tables = scatter_sequences(ks, vs, page_size, rng, fill=0.0)
    tables[2, 2] = -1  # an evicted page: invisible, mass 0
    q = randn(rng, len(lens), nh, d)
    q_sink = randn(rng, len(lens), nh, d) if shifted else None
    ctx = np.asarray(lens, np.int32)
    kw = {"sliding_window": window, "num_sink_tokens": sinks, "q_sink": q_sink}
    _, lse = paged_attention_decode(q, k_cache, v_cache, tables, ctx, return_lse=True, **kw)
    mass = page_attention_mass(q, k_cache, tables, ctx, lse, **kw)
    assert mass.shape == tables.shape and mass.dtype == np.float32
    for s, n in enumerate(lens):
        visible = visible_mask(1, n, sliding_window=window, num_sink_tokens=sinks)[0]
        resident = tables[s, np.arange(n) // page_size] >= 0
        qs = q[s] if q_sink is None else q_sink[s]
        expected = dense_page_mass(
            q[s], ks[s], visible & resident, page_size, tables.shape[1], qs, sinks
        )
        np.testing.assert_allclose(mass[s], expected, rtol=0, atol=1e-5)
        assert mass[s].sum() == pytest.approx(nh, abs=1e-4)
    assert mass[2, 2] == 0.0


def test_page_mass_names_the_bad_argument() -> None:
    k = np.zeros((4, 2, 8, 16), np.float32)
    q = np.zeros((1, 4, 16), np.float32)
    tables = np.zeros((1, 2), np.int32)
    with pytest.raises(ValueError, match=r"lse: expected \(num_seqs, num_heads\)"):
        page_attention_mass(q, k, tables, np.ones(1, np.int32), np.zeros((1, 3), np.float32))
