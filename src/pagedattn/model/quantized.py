"""Block-quantized weight matrices kept in their exact GGUF form, and a Numba matmul over them.

A GGUF Q4_0 / Q4_1 / Q8_0 matrix is, per block of 32 inputs, ``w = scale * code + offset`` with
float16 ``scale``/``offset`` and small integer codes (ggml ``ggml-quants.c``; the ``gguf``
package's ``dequantize_blocks`` computes exactly ``scale * code + offset`` in float32). Keeping
the int8 codes instead of the float32 products reads 4x fewer bytes per decode step, the
bottleneck of single-stream decoding, while computing the same sums:
``y = sum_b (scale_b * sum_j code_j x_j + offset_b * sum_j x_j)`` (as llama.cpp's ``vec_dot``
kernels do, but with float32 activations, so results agree with the dequantized float32 model to
float32 rounding).
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

BLOCK = 32  # inputs per quantization block for Q4_0, Q4_1 and Q8_0
SUPPORTED = ("Q4_0", "Q4_1", "Q8_0")


@dataclass(frozen=True)
class BlockQuantized:
    """``w[n, 32 b + j] = scale[n, b] * codes[n, 32 b + j] + offset[n, b]`` in float32.

    Attributes:
        codes: (out_features, in_features) int8.
        scale: (out_features, in_features // 32) float32.
        offset: (out_features, in_features // 32) float32 (zeros for symmetric types).
    """

    codes: np.ndarray
    scale: np.ndarray
    offset: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.codes.shape[0]), int(self.codes.shape[1]))

    def dequantize(self) -> np.ndarray:
        """(out_features, in_features) float32, computed as ggml does (scale * code + offset)."""
        n, k = self.shape
        codes = self.codes.reshape(n, k // BLOCK, BLOCK).astype(np.float32)  # (N, K/32, 32)
        w = self.scale[:, :, None] * codes + self.offset[:, :, None]  # (N, K/32, 32)
        out: np.ndarray = w.reshape(n, k)
        return out

    def take_rows(self, rows: np.ndarray) -> BlockQuantized:
        """The matrix with its output rows reordered (e.g. to undo llama.cpp's q/k permutation)."""
        return BlockQuantized(self.codes[rows], self.scale[rows], self.offset[rows])

    @staticmethod
    def concat(parts: list[BlockQuantized]) -> BlockQuantized:
        """Stack matrices with the same in_features along the output axis (fused projections)."""
        return BlockQuantized(
            np.ascontiguousarray(np.concatenate([p.codes for p in parts])),
            np.ascontiguousarray(np.concatenate([p.scale for p in parts])),
            np.ascontiguousarray(np.concatenate([p.offset for p in parts])),
        )


def from_gguf_blocks(raw: np.ndarray, type_name: str, shape: tuple[int, int]) -> BlockQuantized:
    """Split raw GGUF blocks into codes / scale / offset without rounding anything.

    Args:
        raw: uint8 tensor data, (out_features, bytes_per_row) or flat.
        type_name: ``"Q4_0"``, ``"Q4_1"`` or ``"Q8_0"``.
        shape: (out_features, in_features); in_features a multiple of 32.

    Raises:
        ValueError: another type, or a byte count that does not match ``shape``.
    """
    if type_name not in SUPPORTED:
        raise ValueError(f"block type {type_name!r} not supported; expected one of {SUPPORTED}")
    n, k = shape
    header = 4 if type_name == "Q4_1" else 2  # f16 scale (+ f16 offset for Q4_1)
    payload = BLOCK if type_name == "Q8_0" else BLOCK // 2
    blocks_per_row = k // BLOCK
    if k % BLOCK or raw.size != n * blocks_per_row * (header + payload):
        raise ValueError(f"{type_name} data of {raw.size} bytes does not match shape {shape}")
    blocks = np.asarray(raw, dtype=np.uint8).reshape(n, blocks_per_row, header + payload)
    scale = blocks[:, :, 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # (N, K/32)
    if type_name == "Q4_1":
        offset = blocks[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    else:
        offset = np.zeros_like(scale)
    qs = blocks[:, :, header:]  # (N, K/32, payload)
    if type_name == "Q8_0":
        codes = qs.view(np.int8)  # (N, K/32, 32)
    else:  # low nibbles are inputs 0..15 of the block, high nibbles 16..31
        nibbles = np.concatenate([qs & 0x0F, qs >> 4], axis=2).astype(np.int8)  # (N, K/32, 32)
        codes = nibbles - np.int8(8) if type_name == "Q4_0" else nibbles
    return BlockQuantized(np.ascontiguousarray(codes.reshape(n, k)), scale, offset)


@numba.njit(parallel=True, fastmath=True, cache=True, nogil=True)
def _qmatmul_kernel(
    x: np.ndarray,
    codes: np.ndarray,
    scale: np.ndarray,
    offset: np.ndarray,
    out: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """out[t, n] = sum_b scale[n,b] * (codes[n, block b] . x[t, block b]) + offset[n,b] * xsum[t,b].

    The scaled products are summed into 32 vertical float32 lanes (one per position in the
    block) and reduced once per row: no horizontal sum per block, so the loop vectorizes.
    """
    num_rows, num_in = x.shape
    num_out = codes.shape[0]
    num_blocks = num_in // 32
    xsum = np.zeros((num_rows, num_blocks), np.float32)  # per-block sums of x (offset term)
    for t in range(num_rows):
        for k in range(num_in):
            xsum[t, k // 32] += x[t, k]
    num_chunks = (num_out + 63) // 64
    for chunk in numba.prange(num_chunks):
        lanes = np.empty(32, np.float32)
        for n in range(chunk * 64, min(num_out, chunk * 64 + 64)):
            c = codes[n]
            for t in range(num_rows):
                xt = x[t]
                lanes[:] = 0.0
                bias = np.float32(0.0)
                for b in range(num_blocks):
                    sc = scale[n, b]
                    base = b * 32
                    for j in range(32):
                        lanes[j] += sc * (np.float32(c[base + j]) * xt[base + j])
                    bias += offset[n, b] * xsum[t, b]
                total = np.float32(0.0)
                for j in range(32):
                    total += lanes[j]
                out[t, n] = total + bias


def qmatmul(x: np.ndarray, w: BlockQuantized) -> np.ndarray:
    """``x @ w.T`` for a block-quantized ``w`` (the decode-time projection).

    Args:
        x: (num_tokens, in_features) float32.
        w: (out_features, in_features) block-quantized matrix.

    Returns:
        (num_tokens, out_features) float32.

    Raises:
        ValueError: in_features mismatch.
    """
    n, k = w.shape
    if x.ndim != 2 or x.shape[1] != k:
        raise ValueError(f"x: expected (num_tokens, {k}), got {x.shape}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty((x.shape[0], n), np.float32)
    _qmatmul_kernel(x, w.codes, w.scale, w.offset, out)
    return out
