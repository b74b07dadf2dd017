"""merge_states: two halves merged equal attention over all keys; -inf is the identity."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pagedattn.kernels import merge_states, reference_attention
from tests.kernels.helpers import randn


@given(st.integers(2, 40), st.data())
def test_merging_two_halves_equals_attention_over_all(k_len: int, data: st.DataObject) -> None:
    split = data.draw(st.integers(1, k_len - 1))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1)))
    q, k, v = randn(rng, 3, 4, 8), randn(rng, k_len, 2, 8), randn(rng, k_len, 2, 8)
    kw = {"causal": False, "return_lse": True}
    out_a, lse_a = reference_attention(q, k[:split], v[:split], **kw)  # type: ignore[arg-type]
    out_b, lse_b = reference_attention(q, k[split:], v[split:], **kw)  # type: ignore[arg-type]
    full, full_lse = reference_attention(q, k, v, **kw)  # type: ignore[arg-type]
    out, lse = merge_states(out_a, lse_a, out_b, lse_b)
    np.testing.assert_allclose(out, full, atol=1e-5)
    np.testing.assert_allclose(lse, full_lse, atol=1e-5)


def test_merging_with_empty_state_is_identity() -> None:
    rng = np.random.default_rng(10)
    out_a, lse_a = randn(rng, 5, 3, 8), randn(rng, 5, 3)
    empty_out = np.full_like(out_a, np.nan)  # an empty state's output must be ignored
    empty_lse = np.full_like(lse_a, -np.inf)
    for out, lse in (
        merge_states(out_a, lse_a, empty_out, empty_lse),
        merge_states(empty_out, empty_lse, out_a, lse_a),
    ):
        np.testing.assert_array_equal(out, out_a)
        np.testing.assert_array_equal(lse, lse_a)
    both, both_lse = merge_states(empty_out, empty_lse, empty_out, empty_lse)
    np.testing.assert_array_equal(both, 0.0)
    np.testing.assert_array_equal(both_lse, -np.inf)


def test_merge_rejects_mismatched_shapes() -> None:
    a = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(ValueError, match=r"lse_a: expected \(2, 3\)"):
        merge_states(a, np.zeros((2, 4), np.float32), a, np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match=r"out_b: expected \(2, 3, 4\)"):
        merge_states(a, np.zeros((2, 3), np.float32), a[:1], np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="float32"):
        merge_states(
            a.astype(np.float64), np.zeros((2, 3), np.float32), a, np.zeros((2, 3), np.float32)
        )
