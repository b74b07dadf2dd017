"""Constants shared by the Numba attention loops (decode and prefill).

Fast-math flags deliberately exclude ``nnan`` / ``ninf``: running maxima start at ``-inf`` and
masked rows must stay ``-inf`` / zero, never NaN. The ``exp`` constants serve the vectorisable
exponential both kernels inline: ``exp(v) = 2^k * exp(r)``, ``k = round(v / ln 2)``, with ``ln 2``
split in two so that ``k * LN2_HI`` is exact (Cody & Waite range reduction, as in Cephes
``expf``), and ``exp(r)`` by its degree-7 Taylor polynomial ``1 + r + C2 r^2 + ... + C7 r^7``.
"""

from __future__ import annotations

import numpy as np

FASTMATH = {"nsz", "arcp", "contract", "reassoc"}
# The same without reassociation: for sums whose order must not depend on how (or in which
# process) LLVM compiled them.
FASTMATH_ORDERED = {"nsz", "arcp", "contract"}
NEG_INF = np.float32(-np.inf)
LOG2E = np.float32(1.4426950408889634)
LN2_HI = np.float32(0.693359375)
LN2_LO = np.float32(-2.12194440e-4)
C2, C3, C4 = np.float32(1 / 2), np.float32(1 / 6), np.float32(1 / 24)
C5, C6, C7 = np.float32(1 / 120), np.float32(1 / 720), np.float32(1 / 5040)
BLOCK_KEYS = 64  # keys per online-softmax update (whole pages; at least one page)
