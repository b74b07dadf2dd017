"""The vectorisable exponential both attention kernels inline (no libm call).

``exp(v) = 2^k * exp(r)``, ``k = round(v / ln 2)``, ``|r| <= ln 2 / 2``: Cody & Waite range
reduction with ``ln 2`` split in two so that ``k * LN2_HI`` is exact (as in Cephes ``expf``),
``exp(r)`` by its degree-7 Taylor polynomial ``1 + r + C2 r^2 + ... + C7 r^7`` (relative error
below 1e-8), and ``2^k`` built in the float32 exponent bits. The kernels run the reduction and
the polynomial in two passes over a row, the ``2^k`` bits stored in between (that is what lets
both loops vectorise); these helpers are the per-element steps, inlined into the caller (so
the caller's fast-math flags apply to them, as if written in place).
"""

from __future__ import annotations

import numpy as np
from numba import njit

LOG2E = np.float32(1.4426950408889634)
LN2_HI = np.float32(0.693359375)
LN2_LO = np.float32(-2.12194440e-4)
C2, C3, C4 = np.float32(1 / 2), np.float32(1 / 6), np.float32(1 / 24)
C5, C6, C7 = np.float32(1 / 120), np.float32(1 / 720), np.float32(1 / 5040)


@njit(inline="always")
def exp_reduce(v):  # type: ignore[no-untyped-def]  # pragma: no cover - inlined
    """``(r, bits)``: ``v = k ln 2 + r`` and the float32 bits of ``2^k`` (``v >= -87``)."""
    k = np.floor(v * LOG2E + np.float32(0.5))
    return (v - k * LN2_HI) - k * LN2_LO, (np.int32(k) + np.int32(127)) << np.int32(23)


@njit(inline="always")
def exp_poly(r):  # type: ignore[no-untyped-def]  # pragma: no cover - inlined
    """``exp(r)`` for ``|r| <= ln 2 / 2`` (Horner's scheme of the degree-7 Taylor polynomial)."""
    p = C7 * r + C6
    p = p * r + C5
    p = p * r + C4
    p = p * r + C3
    p = p * r + C2
    p = p * r + np.float32(1.0)
    return p * r + np.float32(1.0)
