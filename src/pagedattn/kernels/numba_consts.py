"""Constants shared by the Numba attention loops (decode and prefill).

Fast-math flags deliberately exclude ``nnan`` / ``ninf``: running maxima start at ``-inf`` and
masked rows must stay ``-inf`` / zero, never NaN. The exponential both kernels inline is
:mod:`pagedattn.kernels.fast_exp`.
"""

from __future__ import annotations

import numpy as np

FASTMATH = {"nsz", "arcp", "contract", "reassoc"}
# The same without reassociation: for sums whose order must not depend on how (or in which
# process) LLVM compiled them.
FASTMATH_ORDERED = {"nsz", "arcp", "contract"}
NEG_INF = np.float32(-np.inf)
BLOCK_KEYS = 64  # keys per online-softmax update (whole pages; at least one page)
