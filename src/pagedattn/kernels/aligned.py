"""Float32 arrays whose data starts on a cache line.

The GEMM register tiles (:mod:`pagedattn.model.block_tiles`) load one vector per two
multiply-adds, and a vector load that straddles two cache lines costs two; NumPy aligns its
allocations to 16 bytes only. The activations a matmul reads (a norm's, the attention's, the
gated activation's output, another matmul's) are allocated here, so the matmul finds them on a
line; :func:`aligned` copies the rest. Inside compiled kernels, :func:`aligned_scratch` does the
same for a scratch (Numba's own allocations are 32-byte aligned).
"""

from __future__ import annotations

import numba
import numpy as np

ALIGN = 64  # bytes: a cache line, and one zmm


def empty_aligned(shape: tuple[int, ...]) -> np.ndarray:
    """An uninitialised C-contiguous float32 array of ``shape`` starting on a cache line (rows
    whose length is a multiple of 16 floats then all start on one)."""
    size = int(np.prod(shape))
    buf = np.empty(size + ALIGN // 4, np.float32)
    first = (ALIGN - buf.ctypes.data % ALIGN) % ALIGN // 4
    return buf[first : first + size].reshape(shape)


@numba.njit(cache=True, nogil=True, inline="always")
def aligned_scratch(rows, cols):  # type: ignore[no-untyped-def]  # pragma: no cover
    """:func:`empty_aligned` ``((rows, cols))`` inside a compiled kernel."""
    buf = np.empty(rows * cols + ALIGN // 4, np.float32)
    first = (ALIGN - buf.ctypes.data % ALIGN) % ALIGN // 4
    return buf[first : first + rows * cols].reshape((rows, cols))


def aligned(x: np.ndarray) -> np.ndarray:
    """``x`` (C-contiguous float32) if its data starts on a cache line, else such a copy."""
    if x.ctypes.data % ALIGN == 0:
        return x
    out = empty_aligned(x.shape)
    out[...] = x
    return out
