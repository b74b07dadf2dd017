"""Random GGUF blocks of every type the kernels read: random bytes with finite float16 scales.

``gguf``'s numpy code quantizes none of the K-quants, so tests draw their blocks directly: every
code, sub-block scale and high bit is a random byte, and the float16 fields (the super-block's
``d``, ``dmin``, a 32-block's scale and minimum) hold finite values of size ``scale``.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q

# type -> (inputs per block, bytes per block, byte offsets of its float16 fields)
LAYOUTS = {
    Q.Q4_0: (32, 18, (0,)), Q.Q4_1: (32, 20, (0, 2)), Q.Q8_0: (32, 34, (0,)),
    Q.Q5_0: (32, 22, (0,)), Q.Q5_1: (32, 24, (0, 2)), Q.Q4_K: (256, 144, (0, 2)),
    Q.Q5_K: (256, 176, (0, 2)), Q.Q6_K: (256, 210, (208,)),
}  # fmt: skip
NEW_TYPES = (Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K)
# the minimum (field 2) over the scale (field 0) that centres a type's weights on 0
_CENTRES = {Q.Q4_1: -7.5, Q.Q5_1: -15.5, Q.Q4_K: 7.5, Q.Q5_K: 15.5}


def random_blocks(
    qtype: Q,
    shape: tuple[int, int],
    rng: np.random.Generator,
    scale: float = 0.01,
    centred: bool = False,
) -> np.ndarray:
    """(out, in // block * bytes) uint8: ``shape``'s rows of random ``qtype`` blocks;
    ``centred``: each minimum a fixed multiple of its block's scale, so that the weights of a
    block average about 0 (as a model's do)."""
    n, k = shape
    elements, size, halves = LAYOUTS[qtype]
    raw = rng.integers(0, 256, (n, k // elements, size), dtype=np.uint8)
    for at in halves:
        half = (scale * rng.standard_normal((n, k // elements, 1))).astype(np.float16)
        raw[:, :, at : at + 2] = half.view(np.uint8)
    if centred and qtype in _CENTRES:
        d = raw[:, :, 0:2].copy().view(np.float16).astype(np.float32)
        raw[:, :, 2:4] = (_CENTRES[qtype] * d).astype(np.float16).view(np.uint8)
    return raw.reshape(n, -1)


def blocks_by_row(kernel_blocks: np.ndarray, size: int) -> np.ndarray:
    """(rows, blocks per row, ``size``) bytes of a matrix in the kernels' layout, each row's
    blocks in order: the layout undone by hand (rows in groups of four when their count is a
    multiple of four, block ``b`` of a group's rows side by side; rows in order otherwise)."""
    rows = kernel_blocks.shape[0]
    flat = kernel_blocks.reshape(-1, size)
    if rows % 4:
        return flat.reshape(rows, -1, size)
    return flat.reshape(rows // 4, -1, 4, size).transpose(0, 2, 1, 3).reshape(rows, -1, size)
