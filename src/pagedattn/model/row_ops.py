"""Per-token (row) operations of the Llama block, looped row by row in Numba so that a token's
result never depends on how many other rows share the array (batch invariance).

RMSNorm: Zhang & Sennrich 2019 (arXiv 1910.07467), ``weight * x / sqrt(mean(x^2) + eps)``;
SwiGLU: Shazeer 2020 (arXiv 2002.05202), ``silu(gate) * up`` with ``silu(g) = g sigmoid(g)``.
"""

from __future__ import annotations

import numba
import numpy as np

import pagedattn.kernels  # noqa: F401  (starts Numba's pool with a short OpenMP spin)
from pagedattn.kernels.aligned import empty_aligned

NORM_LANES = 16  # partial sums of the mean square: element h goes to lane h % NORM_LANES


@numba.njit(error_model="numpy", cache=True, nogil=True)
def _rms_norm_row(
    xt: np.ndarray, weight: np.ndarray, eps: np.float32, ot: np.ndarray
) -> None:  # pragma: no cover - compiled
    """``ot = weight * xt / sqrt(mean(xt^2) + eps)`` in one fixed order of IEEE float32
    operations (no fast-math): lane ``l`` sums ``xt[h]^2`` for ``h = l, l + 16, ...`` in
    increasing ``h``, the lanes are added by halving (lane i += lane i + 8, + 4, + 2, + 1),
    then ``inv = 1 / sqrt(total / hidden + eps)`` and ``ot[h] = (xt[h] * inv) * weight[h]``.

    A fast-math sum left the order to LLVM's vectorizer, which chose differently depending on
    the function that inlined this one and on whether that caller came from Numba's cache:
    the same row could round differently in two processes, which the int8 path (activations
    rounded to int8 codes) turned into logprob differences of 0.2."""
    hidden = xt.shape[0]
    lanes = np.zeros(NORM_LANES, np.float32)
    full = hidden - hidden % NORM_LANES
    for h0 in range(0, full, NORM_LANES):
        for lane in range(NORM_LANES):  # whole steps of 16; the tail below fills the first lanes
            v = xt[h0 + lane]
            lanes[lane] += v * v
    for lane in range(hidden - full):
        v = xt[full + lane]
        lanes[lane] += v * v
    width = NORM_LANES
    while width > 1:
        width //= 2
        for lane in range(width):
            lanes[lane] += lanes[lane + width]
    inv = np.float32(1.0) / np.sqrt(lanes[0] / np.float32(hidden) + eps)
    for h in range(hidden):
        ot[h] = (xt[h] * inv) * weight[h]


@numba.njit(parallel=True, cache=True, nogil=True)
def _rms_norm_kernel(
    x: np.ndarray, weight: np.ndarray, eps: np.float32, out: np.ndarray
) -> None:  # pragma: no cover - compiled
    for t in numba.prange(x.shape[0]):
        _rms_norm_row(x[t], weight, eps, out[t])


@numba.njit(cache=True, nogil=True)
def rms_norm_serial(
    x: np.ndarray, weight: np.ndarray, eps: np.float32, out: np.ndarray
) -> None:  # pragma: no cover - compiled
    """``out = rms_norm(x)`` on the calling thread (x, out: (T, H) float32; weight: (H,))."""
    for t in range(x.shape[0]):
        _rms_norm_row(x[t], weight, eps, out[t])


SERIAL_MAX_ROWS = 2  # a decode step's rows: waking the thread pool costs more than the row


SILU_CHUNK = 256  # elements per parallel task: elementwise, so even a few rows use every thread
TANH_CLAMP = np.float32(7.90531110763549805)  # |tanh(x)| rounds to 1 in float32 beyond this

# IEEE arithmetic without FMA contraction (whether LLVM fuses a product into an add depends on
# the CPU having FMA, and changes the rounding), reassociation or reciprocal approximations, and
# NumPy's error model (no ZeroDivisionError branch): the loops vectorize, and each element is the
# same operations whether a vector or the scalar tail computes it, on every CPU.
_ELEMENTWISE = {"nnan", "ninf", "nsz"}


@numba.njit(fastmath=_ELEMENTWISE, error_model="numpy", cache=True, nogil=True, inline="always")
def half_tanh_plus_half(a: np.float32) -> np.float32:  # pragma: no cover - compiled
    """``(1 + tanh(a)) / 2`` with tanh as Eigen's / XLA's float32 rational approximation (odd
    degree-13 over even degree-6 polynomial on [-7.9, 7.9]; within 5 ulp of tanh), which
    vectorizes where libm's tanh does not; inlined into its callers' loops."""
    x = min(max(a, -TANH_CLAMP), TANH_CLAMP)
    x2 = x * x
    p = x2 * np.float32(-2.76076847742355e-16) + np.float32(2.00018790482477e-13)
    p = x2 * p + np.float32(-8.60467152213735e-11)
    p = x2 * p + np.float32(5.12229709037114e-08)
    p = x2 * p + np.float32(1.48572235717979e-05)
    p = x2 * p + np.float32(6.37261928875436e-04)
    p = x2 * p + np.float32(4.89352455891786e-03)
    q = x2 * np.float32(1.19825839466702e-06) + np.float32(1.18534705686654e-04)
    q = x2 * q + np.float32(2.26843463243900e-03)
    q = x2 * q + np.float32(4.89352518554385e-03)
    tanh = (x * p) / q
    if a >= TANH_CLAMP:  # the rational ends a few ulp short of +-1 at the clamp
        tanh = np.float32(1.0)
    elif a <= -TANH_CLAMP:
        tanh = np.float32(-1.0)
    return np.float32(0.5) * tanh + np.float32(0.5)


@numba.njit(fastmath=_ELEMENTWISE, error_model="numpy", cache=True, nogil=True)
def _silu_mul_range(
    gate: np.ndarray, up: np.ndarray, out: np.ndarray
) -> None:  # pragma: no cover - compiled
    """out[i] = silu(gate[i]) * up[i], with ``sigmoid(g) = (1 + tanh(g / 2)) / 2`` (never
    overflows; :func:`half_tanh_plus_half`)."""
    for i in range(out.shape[0]):
        g = gate[i]
        out[i] = g * half_tanh_plus_half(g * np.float32(0.5)) * up[i]


@numba.njit(parallel=True, cache=True, nogil=True)
def _silu_mul_kernel(gate_up: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover
    rows, inter = out.shape
    per_row = (inter + SILU_CHUNK - 1) // SILU_CHUNK
    for task in numba.prange(rows * per_row):
        t, i0 = task // per_row, (task % per_row) * SILU_CHUNK
        i1 = min(inter, i0 + SILU_CHUNK)
        _silu_mul_range(gate_up[t, i0:i1], gate_up[t, inter + i0 : inter + i1], out[t, i0:i1])


@numba.njit(cache=True, nogil=True)
def silu_mul_serial(gate_up: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover
    """``out = silu(gate) * up`` on the calling thread (gate_up: (T, 2 I), out: (T, I))."""
    inter = out.shape[1]
    for t in range(out.shape[0]):
        _silu_mul_range(gate_up[t, :inter], gate_up[t, inter:], out[t])


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
    out = empty_aligned(x.shape)  # the next matmul's input
    kernel = rms_norm_serial if x.shape[0] <= SERIAL_MAX_ROWS else _rms_norm_kernel
    kernel(x, np.ascontiguousarray(weight, dtype=np.float32), np.float32(eps), out)
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
    out = empty_aligned((gate_up.shape[0], gate_up.shape[1] // 2))  # ffn_down's input
    kernel = silu_mul_serial if out.shape[0] <= SERIAL_MAX_ROWS else _silu_mul_kernel
    kernel(gate_up, out)
    return out
