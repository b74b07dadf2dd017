"""What the int8-path tests compare across the CPUs Numba compiles for.

``python -m tests.model.int8_path_probe OUT.npz`` computes, on the CPU named by
``NUMBA_CPU_NAME`` / ``NUMBA_CPU_FEATURES`` (the host's without them), the int8-activation
matmuls of :func:`cases` and the name of the int8 path that CPU gets, and saves them to
``OUT.npz`` (plain arrays, no pickle); the tests call :func:`collect` in their own process for
the host's values.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import quantize

from pagedattn.model.quantized import from_gguf_blocks, qmatmul
from tests.model.random_blocks import random_blocks

KINDS = (Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q6_K)
ROWS = (1, 2, 3, 15)  # every kind of tile: 8, 4 (whole tasks on zmm), 2 and 1 activation rows
# 23: rows one after another, five tiles of four output rows and three leftover rows; 24:
# rows side by side in groups of four (the layout of every real model's matrices), six tiles
OUTPUTS = (23, 24)
BLOCKS = 5  # 32-input blocks per row (K-quants: two 256-input super-blocks)


def random_q6_k(rows: int, super_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """Q6_K rows of random bytes (every code, every int8 scale) with a positive float16 ``d``
    per super-block (``gguf`` has no Q6_K quantizer)."""
    raw = rng.integers(0, 256, size=(rows, super_blocks, 210), dtype=np.uint8)
    d = (rng.random((rows, super_blocks)) * 0.01 + 0.001).astype(np.float16)
    raw[..., 208:] = d.view(np.uint8).reshape(rows, super_blocks, 2)
    return raw.reshape(rows, -1)


def cases() -> Iterator[tuple[str, np.ndarray, np.ndarray, Q]]:
    """(key, x (T, K) float32, raw GGUF blocks (N, bytes per row), kind) per kind and row count,
    from fixed seeds; one activation channel is an outlier, as in real activations."""
    for kind in KINDS:
        for outputs in OUTPUTS:
            rng = np.random.default_rng(int(kind) + 100 * outputs)
            if kind == Q.Q6_K:
                k, raw = 512, random_q6_k(outputs, 2, rng)
            elif kind == Q.Q4_K:
                k, raw = 512, random_blocks(kind, (outputs, 512), rng, centred=True)
            else:
                k = 32 * BLOCKS
                raw = quantize(rng.standard_normal((outputs, k)).astype(np.float32), kind)
            for rows in ROWS:
                x = rng.standard_normal((rows, k)).astype(np.float32)
                x[:, 3] *= 30
                x[0, 32:64] = 0  # an all-zero block: scale 0
                yield f"{kind.name}_{outputs}_{rows}", x, raw, kind


def collect() -> dict[str, np.ndarray]:
    from pagedattn.model.int8_ir import int8_path

    out = {"path": np.frombuffer(int8_path().encode(), np.uint8)}
    for key, x, raw, kind in cases():
        w = from_gguf_blocks(raw, kind.name, (raw.shape[0], x.shape[1]))
        out[key] = qmatmul(x, w, activations="int8")
    return out


def main() -> None:
    np.savez(Path(sys.argv[1]), **collect())  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
