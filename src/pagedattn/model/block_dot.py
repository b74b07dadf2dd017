"""Dot products of GGUF block-quantized rows with float32 activations, written as explicit SIMD.

Every ``out[t, n]`` is one fixed sequence of float32 operations, the same whichever kernel
computes it and on every CPU (any x86-64, aarch64):

* weights are decoded as ``gguf.quants.dequantize`` computes them, bit for bit
  (:mod:`pagedattn.model.block_decoders`: ``fma(scale, code, offset)`` where ``scale * code``
  is exact in float32, Q6_K's sub-block scales decoded once per 256-input super-block);
* ``LANES`` = 16 lane accumulators: lane ``l`` takes ``acc[l] = fma(w[k], x[k], acc[l])`` for
  ``k = l, l + 16, l + 32, ...`` in increasing ``k`` (a block of 32 inputs is two steps);
* the lanes are summed by halving: ``acc[i] += acc[i + 8]``, then ``+ 4``, ``+ 2``, ``+ 1``.

The operations are LLVM vector IR emitted through Numba intrinsics (``<16 x float>``,
``llvm.fma``, no fast-math flags), so LLVM may not reassociate them: it picks the instructions
(two ymm halves with AVX2 + FMA, one zmm with AVX-512, a call of libm's correctly rounded
``fmaf`` where the CPU has no FMA) but never the rounding. No host-specific instruction is
named anywhere in this module; the int8-activation kernels, which need AVX2, are
:mod:`pagedattn.model.block_dot_int8`, compiled only when asked for. Two kernels share that
definition:

* :func:`qmatmul_blocks` decodes each block in registers, four output rows side by side, and
  meets up to ``DECODE_COLS`` activation rows with it (decode steps and their verify rows,
  where decoding the weights costs more than the multiply-adds); the four rows' blocks lie side
  by side (:func:`~pagedattn.model.block_ir.block_ptr`), one stream of bytes, and it prefetches
  the rows two tiles ahead;
* :func:`~pagedattn.model.block_tiles.qmatmul_tiled` decodes a task's rows once into a float32
  scratch that every activation row then meets in register tiles (prefill, batches).

They agree bit for bit (``tests/model/test_block_dot.py``), which keeps a token's logits the
same alone or in any batch; :func:`~pagedattn.model.block_tiles.matmul_float` applies the same
order to float32 weights. The
block formats are :mod:`pagedattn.model.block_ir`'s; llama.cpp's own CPU path instead
quantizes the activations to int8 (``ggml_vec_dot_q4_1_q8_1``), which does less work per weight
and is not exact.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

import pagedattn.kernels  # noqa: F401  (starts Numba's pool with a short OpenMP spin)
from pagedattn.kernels.target import has_wide_registers
from pagedattn.model.decode_dot import DECODE_TILE, make_decode_dot

ROWS_PER_TASK = 16  # output rows one thread owns
# Most activation rows that meet each decoded block (decode kernel), and how many output rows a
# tile of ``cols`` rows decodes side by side (decode_tile_rows): sized by the vector registers
# (32 zmm with AVX-512, 16 ymm holding 8 16-lane vectors otherwise) and, with 16, by
# measurement. Speed only: every tile computes each output with the same operations.
DECODE_COLS = 8 if has_wide_registers() else 4


def decode_tile_rows(cols: int) -> int:
    """Output rows per register tile for ``cols`` activation rows.

    With 16 ymm registers: 4 output rows for one or two activation rows, single rows for three
    or four, as measured fastest on Zen 3 over every projection of a SmolLM2 decode step. The
    variants compile into one kernel and the set matters: with 2-row tiles for two activation
    rows (4 // cols), one row ran 1.5x and two rows 1.75x slower than with this set."""
    if has_wide_registers():
        return DECODE_TILE if cols <= 6 else DECODE_TILE // 2
    return DECODE_TILE if cols <= 2 else 1


def _make_decode_rows(cols: int) -> Any:
    """Compiled (x, blocks, kind, kind_set, n0, n1, t, out, col): out[t + c, col + n] for
    c < ``cols`` and n in [n0, n1), each block decoded once in registers for the ``cols`` rows
    of x, tiles of :func:`decode_tile_rows` output rows, then single rows."""
    tile = decode_tile_rows(cols)
    dot_tile, dot_one = make_decode_dot(tile, cols), make_decode_dot(1, cols)

    @numba.njit(nogil=True, inline="always")
    def decode_rows(x, blocks, kind, kind_set, n0, n1, t, out, col):  # type: ignore[no-untyped-def]  # pragma: no cover
        n = n0
        while n + tile <= n1:
            r = dot_tile(kind, kind_set, blocks, n, x, t)
            for i in range(tile):
                for c in range(cols):
                    out[t + c, col + n + i] = r[i * cols + c]
            n += tile
        while n < n1:
            s = dot_one(kind, kind_set, blocks, n, x, t)
            for c in range(cols):
                out[t + c, col + n] = s[c]
            n += 1

    return decode_rows


_rows1, _rows2, _rows3, _rows4 = (_make_decode_rows(c) for c in (1, 2, 3, 4))


@numba.njit(cache=True, nogil=True, inline="always")
def _decode_group4(x, blocks, kind, kind_set, n0, n1, t, cols, out, col):  # type: ignore[no-untyped-def]  # pragma: no cover
    """out[t + c, col + n] for c < cols (1 to 4), n in [n0, n1)."""
    if cols == 1:
        _rows1(x, blocks, kind, kind_set, n0, n1, t, out, col)
    elif cols == 2:
        _rows2(x, blocks, kind, kind_set, n0, n1, t, out, col)
    elif cols == 3:
        _rows3(x, blocks, kind, kind_set, n0, n1, t, out, col)
    else:
        _rows4(x, blocks, kind, kind_set, n0, n1, t, out, col)


if DECODE_COLS == 4:
    # the kernel holds the variants its groups can take, no more: each is a register tile per
    # block kind (with 8 variants where 4 can occur, a compile took 1.6x as long)
    _decode_group = _decode_group4
else:
    _rows5, _rows6, _rows7, _rows8 = (_make_decode_rows(c) for c in (5, 6, 7, 8))

    @numba.njit(cache=True, nogil=True, inline="always")
    def _decode_group(x, blocks, kind, kind_set, n0, n1, t, cols, out, col):  # type: ignore[no-untyped-def]  # pragma: no cover
        """out[t + c, col + n] for c < cols (1 to 8), n in [n0, n1)."""
        if cols <= 4:
            _decode_group4(x, blocks, kind, kind_set, n0, n1, t, cols, out, col)
        elif cols == 5:
            _rows5(x, blocks, kind, kind_set, n0, n1, t, out, col)
        elif cols == 6:
            _rows6(x, blocks, kind, kind_set, n0, n1, t, out, col)
        elif cols == 7:
            _rows7(x, blocks, kind, kind_set, n0, n1, t, out, col)
        else:
            _rows8(x, blocks, kind, kind_set, n0, n1, t, out, col)


@numba.njit(cache=True, nogil=True, inline="always")
def _decode_task(x, blocks, kind, kind_set, task, out, col):  # type: ignore[no-untyped-def]  # pragma: no cover
    """out[t, col + n] = dot(x[t], decoded row n) for the ROWS_PER_TASK rows of ``task``: the
    rows of x in as few groups of at most DECODE_COLS as cover them, sizes balanced (9 rows:
    5 + 4), each group meeting every decoded block once."""
    n0 = task * ROWS_PER_TASK
    n1 = min(blocks.shape[0], n0 + ROWS_PER_TASK)
    num_rows = x.shape[0]
    groups = (num_rows + DECODE_COLS - 1) // DECODE_COLS
    t = 0
    for g in range(groups):
        cols = (num_rows - t + groups - g - 1) // (groups - g)
        _decode_group(x, blocks, kind, kind_set, n0, n1, t, cols, out, col)
        t += cols


@numba.njit(cache=True, nogil=True, inline="always")
def _num_tasks(rows):  # type: ignore[no-untyped-def]  # pragma: no cover
    return (rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK


@numba.njit(cache=True, nogil=True, inline="always")
def num_part_tasks(b0, b1, b2, num_parts):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Tasks of ROWS_PER_TASK output rows over the first ``num_parts`` of b0, b1, b2."""
    total = _num_tasks(b0.shape[0])
    if num_parts > 1:
        total += _num_tasks(b1.shape[0])
    if num_parts > 2:
        total += _num_tasks(b2.shape[0])
    return total


@numba.njit(cache=True, nogil=True, inline="always")
def part_task(task, b0, b1, b2, kinds):  # type: ignore[no-untyped-def]  # pragma: no cover
    """``(blocks, kind, task within the part, first output column)`` of launch task ``task``:
    the parts' tasks follow each other, their columns side by side."""
    t0, t1 = _num_tasks(b0.shape[0]), _num_tasks(b1.shape[0])
    task = np.int64(task)
    if task < t0:
        return b0, kinds[0], task, np.int64(0)
    if task < t0 + t1:
        return b1, kinds[1], task - t0, np.int64(b0.shape[0])
    return b2, kinds[2], task - t0 - t1, np.int64(b0.shape[0] + b1.shape[0])


@numba.njit(parallel=True, cache=True, nogil=True)
def qmatmul_blocks(
    x: np.ndarray,
    b0: np.ndarray,
    b1: np.ndarray,
    b2: np.ndarray,
    kinds: tuple[int, int, int],
    kind_set: np.ndarray,
    num_parts: int,
    out: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """``out = x @ concat(b0, b1, b2)[:num_parts].T`` in one parallel launch over tasks of
    ROWS_PER_TASK output rows, each block decoded in registers and met by every row of ``x``
    (decode steps), DECODE_TILE output rows side by side.

    x: (T, K) float32; b0..b2: block rows of ``kinds`` (values of
    :data:`~pagedattn.model.block_ir.KINDS`), parts past ``num_parts`` (1 to 3) ignored;
    kind_set: a :func:`~pagedattn.model.block_ir.kind_set` holding ``kinds`` (the kernel is
    compiled once per set: a model passes the set of all its matrices); out: (T, sum of the
    parts' rows) float32, their columns side by side (q|k|v, gate|up: one thread-pool wake-up
    instead of three). Each output is the same operations whatever parts share the launch and
    whatever T is."""
    for task in numba.prange(num_part_tasks(b0, b1, b2, num_parts)):
        blocks, kind, local, col = part_task(task, b0, b1, b2, kinds)
        _decode_task(x, blocks, kind, kind_set, local, out, col)
