"""Per-token (row) operations of the Llama block, looped row by row in Numba so that a token's
result never depends on how many other rows share the array (batch invariance).

RMSNorm: Zhang & Sennrich 2019 (arXiv 1910.07467), ``weight * x / sqrt(mean(x^2) + eps)``;
SwiGLU: Shazeer 2020 (arXiv 2002.05202), ``silu(gate) * up`` with ``silu(g) = g sigmoid(g)``.
"""

from __future__ import annotations

import numba
import numpy as np

import pagedattn.kernels  # noqa: F401  (starts Numba's pool with a short OpenMP spin)


@numba.njit(parallel=True, fastmath=True, cache=True, nogil=True)
def _rms_norm_kernel(
    x: np.ndarray, weight: np.ndarray, eps: np.float32, out: np.ndarray
) -> None:  # pragma: no cover - compiled
    hidden = x.shape[1]
    for t in numba.prange(x.shape[0]):
        xt, ot = x[t], out[t]
        total = np.float32(0.0)
        for h in range(hidden):
            total += xt[h] * xt[h]
        inv = np.float32(1.0) / np.sqrt(total / np.float32(hidden) + eps)
        for h in range(hidden):
            ot[h] = (xt[h] * inv) * weight[h]


SILU_CHUNK = 256  # elements per parallel task: elementwise, so even one row uses every thread


@numba.njit(parallel=True, fastmath=True, cache=True, nogil=True)
def _silu_mul_kernel(gate_up: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover
    rows, inter = out.shape
    per_row = (inter + SILU_CHUNK - 1) // SILU_CHUNK
    for task in numba.prange(rows * per_row):
        t, i0 = task // per_row, (task % per_row) * SILU_CHUNK
        for i in range(i0, min(inter, i0 + SILU_CHUNK)):  # sigmoid via tanh: never overflows
            g, u = gate_up[t, i], gate_up[t, inter + i]
            out[t, i] = g * (np.float32(0.5) * np.tanh(g * np.float32(0.5)) + np.float32(0.5)) * u


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm over the last axis, float32, each row computed alone.

    Args:
        x: (num_tokens, hidden) float32.
        weight: (hidden,) float32.
        eps: added to the mean square.

    Returns:
        A new (num_tokens, hidden) float32 array.

    Raises:
        ValueError: shapes that do not match.
    """
    if x.ndim != 2 or weight.shape != (x.shape[1],):
        raise ValueError(f"x: expected (num_tokens, {weight.shape[0]}), got {x.shape}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty_like(x)
    _rms_norm_kernel(x, np.ascontiguousarray(weight, dtype=np.float32), np.float32(eps), out)
    return out


def silu_mul(gate_up: np.ndarray) -> np.ndarray:
    """``silu(gate) * up`` of the fused projection's two halves, each row computed alone.

    Args:
        gate_up: (num_tokens, 2 * intermediate) float32, ``[gate | up]`` columns.

    Returns:
        (num_tokens, intermediate) float32.

    Raises:
        ValueError: an odd number of columns.
    """
    if gate_up.ndim != 2 or gate_up.shape[1] % 2:
        raise ValueError(f"gate_up: expected (num_tokens, 2 * intermediate), got {gate_up.shape}")
    gate_up = np.ascontiguousarray(gate_up, dtype=np.float32)
    out = np.empty((gate_up.shape[0], gate_up.shape[1] // 2), np.float32)
    _silu_mul_kernel(gate_up, out)
    return out
