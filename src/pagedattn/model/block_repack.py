"""GGUF blocks as the matmul kernels read them: the 32-input formats' float16 header fields
widened to float32 at load.

A Q4_0 / Q4_1 / Q8_0 / Q5_0 / Q5_1 block (ggml ``ggml-common.h``) starts with a float16
scale (and Q4_1's / Q5_1's float16 minimum). Read from the file's bytes, every block cost the
kernels a 16-bit load, a conversion and a broadcast per field before its first multiply-add:
on a 135M model's decode step, six of the fifteen instructions of a Q4_1 block against one
activation row. Widened once at load (an exact conversion), the field is a float32 the kernel
broadcasts straight from memory, or folds into a multiply-add's operand. This is the layout
llama.cpp's repacked CPU formats (``block_q4_0x8``) take for the same reason: one made for the
kernel, built once. The K-quants keep the file's bytes: their scales are decoded once per
256 inputs.

The layout of a widened block: the float32 fields where the float16 ones were, then the rest
of the block's bytes unchanged (Q5's high bits, the codes). Sizes: :data:`~.block_ir.SHAPES`
(the kernels') against :data:`~.block_ir.FILE_SHAPES` (the file's).
"""

from __future__ import annotations

import functools

import numba
import numpy as np

from pagedattn.model.block_ir import FILE_SHAPES, SHAPES, WIDENED_FIELDS


@functools.cache
def _half_table() -> np.ndarray:
    """float32 bits of every float16 bit pattern (an exact conversion, NaNs kept as NaNs)."""
    return np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32).view(np.uint32)


@numba.njit(cache=True, nogil=True)
def _widen(raw16, out16, out32, table, size, wide, fields):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Each block: its ``fields`` float16 at its start widened to float32 (by ``table``), then
    its other bytes copied (all block sizes and fields are whole 16-bit words). ``raw16`` is
    the file's rows as uint16, ``out16`` / ``out32`` the new rows as uint16 / uint32."""
    rows = raw16.shape[0]
    num_blocks = raw16.shape[1] * 2 // size
    src_words, dst_words, rest = size // 2, wide // 2, (size - 2 * fields) // 2
    for r in range(rows):
        src_row, dst_row, dst32 = raw16[r], out16[r], out32[r]
        for b in range(num_blocks):
            src, dst = b * src_words, b * dst_words
            for f in range(fields):
                dst32[dst // 2 + f] = table[src_row[src + f]]
            codes_src = src_row[src + fields : src + src_words]
            codes_dst = dst_row[dst + 2 * fields :]
            for i in range(rest):
                codes_dst[i] = codes_src[i]


def repack_blocks(raw: np.ndarray, kind: int) -> np.ndarray:
    """The kernels' layout of ``raw`` (rows of the file's ``kind`` blocks, C-contiguous uint8
    (n, bytes per row)): a new array with each block's float16 header fields widened to
    float32, or ``raw`` itself for a kind without such fields (the K-quants).

    The conversion is exact (every float16 is a float32), so every weight the kernels decode
    is the value ``gguf.quants.dequantize`` gives, bit for bit."""
    fields = WIDENED_FIELDS.get(kind, 0)
    if not fields:
        return raw
    size, wide = FILE_SHAPES[kind][1], SHAPES[kind][1]
    rows, nbytes = raw.shape
    out = np.empty((rows, nbytes // size * wide), np.uint8)
    words16, words32 = out.view(np.uint16), out.view(np.uint32)
    _widen(raw.view(np.uint16), words16, words32, _half_table(), size, wide, fields)
    return out
