"""int8 quantization of activation rows per 32-input block (ggml's ``quantize_row_q8_1``), the
input of the int8-activation matmuls (:mod:`pagedattn.model.block_dot_int8`). Plain Numba: no
host-specific instruction."""

from __future__ import annotations

import numba
import numpy as np

from pagedattn.model.block_ir import BLOCK

HALF = BLOCK // 2  # inputs per activation sum: Q6_K's weights have a scale per 16 inputs


@numba.njit(cache=True, nogil=True, inline="always")
def _quantize_row(x, t, xq, xd, xsum):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Row ``t`` of :func:`quantize_activations`."""
    for b in range(x.shape[1] // BLOCK):
        amax = np.float32(0.0)
        for j in range(b * BLOCK, (b + 1) * BLOCK):
            amax = max(amax, abs(x[t, j]))
        d = amax / np.float32(127.0)
        inv = np.float32(0.0) if d == 0 else np.float32(1.0) / d
        for h in range(2 * b, 2 * b + 2):
            total = 0
            for j in range(h * HALF, (h + 1) * HALF):
                q = np.int8(np.rint(x[t, j] * inv))
                xq[t, j] = q
                total += int(q)
            xsum[h, t] = total
        xd[b, t] = d


@numba.njit(parallel=True, cache=True, nogil=True)
def quantize_activations(
    x: np.ndarray, xq: np.ndarray, xd: np.ndarray, xsum: np.ndarray
) -> None:  # pragma: no cover - compiled
    """Per 32-input block ``b`` of each row ``t`` of ``x`` (T, K) float32 (ggml's
    ``quantize_row_q8_1``): ``xd[b, t] = max|x| / 127``, ``xq = rint(x / xd)`` int8 (zeros for
    an all-zero block) and ``xsum[h, t]`` int32, the sum of the quantized inputs of the block's
    16-input half ``h`` (``xd`` (K / 32, T) and ``xsum`` (K / 16, T) are block-major: a tile's
    rows' values for a block are one load). The kernel computes exactly ``W @ (xd * xq)``: the
    offset term meets ``xd * (xsum[2b] + xsum[2b + 1])`` (q8_1's ``s``; Q6_K's halves meet
    their own scales), whose rounding errors meet the centred weights ``scale * code +
    offset`` (summing the unquantized ``x`` for the offset term would leave ``scale *
    sum(code * error)``, several times larger). Parallel over rows; the same values as
    :func:`quantize_activations_serial`."""
    for t in numba.prange(x.shape[0]):
        _quantize_row(x, t, xq, xd, xsum)


@numba.njit(cache=True, nogil=True)
def quantize_activations_serial(
    x: np.ndarray, xq: np.ndarray, xd: np.ndarray, xsum: np.ndarray
) -> None:  # pragma: no cover - compiled
    """:func:`quantize_activations` on the calling thread (a decode step's one or two rows:
    waking the thread pool costs more than the rows)."""
    for t in range(x.shape[0]):
        _quantize_row(x, t, xq, xd, xsum)
