"""RMSNorm and SwiGLU rows against float64 formulas, and bitwise the same for a row alone (the
serial decode path) or inside a batch (the parallel path)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedattn.model.row_ops import TANH_CLAMP, rms_norm, silu_mul


def _rows(seed: int, rows: int, width: int, scale: float) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((rows, width)) * scale).astype(np.float32)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 9), st.integers(1, 700))
def test_rms_norm_matches_float64_and_is_row_invariant(seed: int, rows: int, hidden: int) -> None:
    x = _rows(seed, rows, hidden, 3.0)
    weight = _rows(seed + 1, 1, hidden, 1.0)[0]
    out = rms_norm(x, weight, 1e-5)
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64**2).mean(axis=1, keepdims=True) + 1e-5) * weight
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-6)
    for t in range(rows):  # alone: the serial path when rows > SERIAL_MAX_ROWS above
        assert np.array_equal(rms_norm(x[t : t + 1], weight, 1e-5)[0], out[t])


def _rms_norm_in_documented_order(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """The float32 operations ``_rms_norm_row`` promises, one by one in NumPy: 16 lane sums of
    squares in increasing index, lanes added by halving, then the scale and the weight."""
    out = np.empty_like(x)
    f32 = np.float32
    for t, row in enumerate(x):
        lanes = np.zeros(16, f32)
        for h0 in range(0, row.size, 16):
            chunk = row[h0 : h0 + 16]
            lanes[: chunk.size] = lanes[: chunk.size] + chunk * chunk  # float32, elementwise
        width = 16
        while width > 1:
            width //= 2
            lanes[:width] = lanes[:width] + lanes[width : 2 * width]
        inv = f32(1.0) / np.sqrt(lanes[0] / f32(row.size) + f32(eps))
        out[t] = (row * inv) * weight
    return out


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 5), st.integers(1, 700))
def test_rms_norm_is_bitwise_its_documented_order(seed: int, rows: int, hidden: int) -> None:
    # A fixed order (no fast-math reduction) is what makes the result the same in every process,
    # whether the kernel was compiled there or loaded from Numba's cache.
    x = _rows(seed, rows, hidden, 3.0)
    weight = _rows(seed + 1, 1, hidden, 1.0)[0]
    assert np.array_equal(rms_norm(x, weight, 1e-5), _rms_norm_in_documented_order(x, weight, 1e-5))


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 9), st.integers(1, 600))
def test_silu_mul_matches_float64_and_is_row_invariant(seed: int, rows: int, inter: int) -> None:
    gate_up = _rows(seed, rows, 2 * inter, 6.0)  # gates well past the clamp at |g / 2| = 7.9
    out = silu_mul(gate_up)
    g, u = gate_up[:, :inter].astype(np.float64), gate_up[:, inter:].astype(np.float64)
    ref = g / (1.0 + np.exp(-g)) * u
    # float32 rounding of g * sigmoid(g) * u, plus the tanh approximation's few ulp; past the
    # clamp sigmoid is 0, where |g * sigmoid(g)| is at most its value at the clamp, 2.15e-6
    edge = 2 * float(TANH_CLAMP) / (1 + np.exp(2 * float(TANH_CLAMP)))
    atol = max(2e-6, 1.05 * edge) * np.abs(u).max()
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=atol)
    for t in range(rows):
        assert np.array_equal(silu_mul(gate_up[t : t + 1])[0], out[t])


def test_silu_saturates_without_overflow() -> None:
    g = np.array([[-200.0, -30.0, 0.0, 30.0, 200.0, 1.0, 1.0, 1.0, 1.0, 1.0]], np.float32)
    out = silu_mul(g)[0]
    assert np.all(np.isfinite(out))
    assert out[2] == 0.0 and out[3] == 30.0 and out[4] == 200.0
    assert -1e-6 < out[0] <= 0.0 and -1e-6 < out[1] <= 0.0


def test_wrong_shapes_name_the_expected_shape() -> None:
    with pytest.raises(ValueError, match=r"expected \(num_tokens, 4\)"):
        rms_norm(np.zeros((2, 3), np.float32), np.ones(4, np.float32), 1e-5)
    with pytest.raises(ValueError, match="2 \\* intermediate"):
        silu_mul(np.zeros((2, 3), np.float32))
