"""The tanh-GELU gated linear unit (Gemma's MLP: ``gelu_tanh(gate) * up``), each row alone.

``gelu_tanh(g) = g / 2 * (1 + tanh(sqrt(2 / pi) * (g + 0.044715 g^3)))`` (Hendrycks & Gimpel
2016; PyTorch ``gelu(approximate="tanh")``), with SiLU's float32 rational tanh
(:func:`pagedattn.model.row_ops.half_tanh_plus_half`) and IEEE arithmetic without contraction, so
the serial (fused decode) and parallel (general) kernels give the same bits.
"""

from __future__ import annotations

import numba
import numpy as np

from pagedattn.kernels.aligned import empty_aligned
from pagedattn.model.row_ops import (
    _ELEMENTWISE,
    SERIAL_MAX_ROWS,
    SILU_CHUNK,
    half_tanh_plus_half,
)

_SQRT_2_OVER_PI = np.float32(0.7978845608028654)
_CUBIC = np.float32(0.044715)


@numba.njit(fastmath=_ELEMENTWISE, error_model="numpy", cache=True, nogil=True)
def _gelu_mul_range(
    gate: np.ndarray, up: np.ndarray, out: np.ndarray
) -> None:  # pragma: no cover - compiled
    for i in range(out.shape[0]):
        g = gate[i]
        a = _SQRT_2_OVER_PI * (g + _CUBIC * (g * g * g))
        out[i] = g * half_tanh_plus_half(a) * up[i]


@numba.njit(parallel=True, cache=True, nogil=True)
def _gelu_mul_kernel(gate_up: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover
    rows, inter = out.shape
    per_row = (inter + SILU_CHUNK - 1) // SILU_CHUNK
    for task in numba.prange(rows * per_row):
        t, i0 = task // per_row, (task % per_row) * SILU_CHUNK
        i1 = min(inter, i0 + SILU_CHUNK)
        _gelu_mul_range(gate_up[t, i0:i1], gate_up[t, inter + i0 : inter + i1], out[t, i0:i1])


@numba.njit(cache=True, nogil=True)
def gelu_mul_serial(gate_up: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover
    """``out = gelu_tanh(gate) * up`` on the calling thread (gate_up: (T, 2 I), out: (T, I))."""
    inter = out.shape[1]
    for t in range(out.shape[0]):
        _gelu_mul_range(gate_up[t, :inter], gate_up[t, inter:], out[t])


def gelu_mul(gate_up: np.ndarray) -> np.ndarray:
    """``gelu_tanh(gate) * up`` of the fused projection's two halves, each row alone.

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
    out = empty_aligned((gate_up.shape[0], gate_up.shape[1] // 2))  # ffn_down's input
    kernel = gelu_mul_serial if out.shape[0] <= SERIAL_MAX_ROWS else _gelu_mul_kernel
    kernel(gate_up, out)
    return out
