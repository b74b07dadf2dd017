"""Block-quantized weight matrices kept as the GGUF's own bytes, and a Numba matmul over them.

A GGUF Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 matrix is, per block of 32 inputs,
``w = scale * code + offset`` with float16 ``scale``/``offset`` and small integer codes (ggml
``ggml-common.h`` ``block_q4_0`` ...); a Q4_K / Q5_K / Q6_K matrix is made of 256-input
super-blocks whose sub-blocks of 32 (16 for Q6_K) have 6- or 8-bit scales under a float16 one.
:class:`BlockQuantized` keeps the blocks (a copy with the 32-input formats' float16 scales
widened to float32, Q4_K in a compact layout of float32 super-block scales and byte sub-block
ones, Q5_K as Q5_1 blocks of its 32-input sub-blocks, Q6_K as in the file,
:mod:`pagedattn.model.block_repack`; 0.59-1.13 bytes per weight, never a float32
matrix) and
:func:`qmatmul` multiplies by them without
expanding the matrix: the kernels of :mod:`pagedattn.model.block_dot` decode each block in
registers (:mod:`pagedattn.model.block_decoders`, bit-identical to ``gguf.quants.dequantize``)
and accumulate in one fixed SIMD lane order.

Batch invariance: ``out[t, n]`` is the same sequence of float32 operations on ``x[t]`` and row
``n`` whatever the number of rows in the call and wherever row ``t`` sits: up to
``DECODE_MAX_ROWS`` rows decode the blocks in registers, more rows decode them once into a
scratch, and both kernels share the
lane order (``block_dot``'s docstring), so a token's result is bitwise the same alone or inside
any batch, on every host.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numba
import numpy as np

from pagedattn.config import ACTIVATIONS
from pagedattn.kernels.aligned import aligned, empty_aligned
from pagedattn.model.block_dot import DECODE_COLS, qmatmul_blocks
from pagedattn.model.block_ir import (
    FILE_SHAPES,
    KINDS,
    LANES,
    NAMES,
    READ_AS,
    SHAPES,
    kind_set,
)
from pagedattn.model.block_repack import repack_blocks
from pagedattn.model.block_tiles import decode_into, matmul_float, qmatmul_tiled
from pagedattn.model.row_ops import SERIAL_MAX_ROWS

BLOCK = 32  # inputs per activation block of the int8 path
SUPPORTED = tuple(KINDS)  # the GGUF block types a matrix may come in
# the block types the kernels read -> (inputs per block, bytes per block) in their layout
BLOCK_SHAPES = {NAMES[kind]: shape for kind, shape in SHAPES.items()}
ROWS_PER_TASK = 16  # output rows one thread applies to every input row (float weights)
ROWS_PER_TILE = 32  # input rows applied to those outputs while they sit in cache
# Up to this many rows, decode each block once in registers for all rows; past one register
# group the decoded scratch (qmatmul_tiled) is faster.
DECODE_MAX_ROWS = DECODE_COLS


@dataclass(frozen=True)
class BlockQuantized:
    """A (out_features, in_features) matrix as GGUF blocks.

    Attributes:
        blocks: (out_features, blocks per row * bytes per block) uint8 in the kernels' layout
            (:func:`~pagedattn.model.block_repack.repack_blocks`): blocks of
            :data:`~pagedattn.model.block_ir.SHAPES` (the 32-input formats with float32 header
            fields, Q4_K compact, Q6_K as in the file) and, where out_features is a multiple
            of four,
            rows interleaved by groups of four (:func:`~pagedattn.model.block_ir.block_ptr`);
            otherwise row ``n`` is ``blocks[n]``, for Q6_K a view of the memory-mapped
            GGUF where rows keep their order. Read-only.
        type_name: the block type of that layout, a key of :data:`BLOCK_SHAPES` (``"Q4_0"``,
            ``"Q6_K"``...; a Q5_K matrix is held as ``"Q5_1"`` blocks).
        kernel_kinds: further block kinds the register-decode kernel reading this matrix is
            compiled for (a model gives each of its matrices the kinds of all of them, so that
            they share one compiled kernel); the matrix's own kind is always included.

    The kernels read each block's scales from these bytes: nothing else is held per matrix.
    """

    blocks: np.ndarray
    type_name: str
    kernel_kinds: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        # Read-only, as a view of the memory-mapped file is: the read-only flag is part of a
        # kernel's signature, so blocks copied at load (repack_blocks) would compile every block
        # kernel a second time.
        if self.blocks.flags.writeable:
            view = self.blocks.view()
            view.flags.writeable = False
            object.__setattr__(self, "blocks", view)

    @property
    def shape(self) -> tuple[int, int]:
        elements, size = BLOCK_SHAPES[self.type_name]
        return (int(self.blocks.shape[0]), int(self.blocks.shape[1]) // size * elements)

    @property
    def kind(self) -> int:
        return KINDS[self.type_name]

    @property
    def compiled_kinds(self) -> frozenset[int]:
        """:attr:`kernel_kinds` and this matrix's kind: the kinds of the register-decode kernel
        reading it (its :func:`~pagedattn.model.block_ir.kind_set`)."""
        return self.kernel_kinds | {self.kind}

    def dequantize(self) -> np.ndarray:
        """(out_features, in_features) float32, bit-identical to ``gguf.quants.dequantize``."""
        return dequantize_rows(self, np.arange(self.shape[0]))


def kind_set_of(matrices: Iterable[BlockQuantized]) -> np.ndarray:
    """The :func:`~pagedattn.model.block_ir.kind_set` a register-decode launch over
    ``matrices`` is compiled for: every kind any of them is compiled for."""
    return kind_set(frozenset().union(*(m.compiled_kinds for m in matrices)))


def from_gguf_blocks(
    raw: np.ndarray, type_name: str, shape: tuple[int, int], rows: np.ndarray | None = None
) -> BlockQuantized:
    """Wrap raw GGUF tensor bytes as a :class:`BlockQuantized` in the kernels' layout
    (:func:`~pagedattn.model.block_repack.repack_blocks`: Q5_K as Q5_1 blocks;
    a Q6_K matrix of a row count that is not a multiple of four a view of the bytes).

    Args:
        raw: uint8 tensor data, (out_features, bytes_per_row) or flat (e.g. the reader's memmap).
        type_name: one of :data:`SUPPORTED`.
        shape: (out_features, in_features); in_features a multiple of the type's block (32,
            or 256 for the K-quants).
        rows: the matrix's rows as indices into the file's (llama.cpp's q/k permutation
            undone), in one copy; None: the file's order.

    Raises:
        ValueError: another type, or a byte count that does not match ``shape``.
    """
    if type_name not in SUPPORTED:
        raise ValueError(f"block type {type_name!r} not supported; expected one of {SUPPORTED}")
    n, k = shape
    elements, size = FILE_SHAPES[KINDS[type_name]]
    if k % elements or raw.size != n * (k // elements) * size:
        raise ValueError(f"{type_name} data of {raw.size} bytes does not match shape {shape}")
    blocks = np.asarray(raw, dtype=np.uint8).reshape(n, k // elements * size)
    if not blocks.flags.c_contiguous:
        blocks = np.ascontiguousarray(blocks)
    kind = KINDS[type_name]
    return BlockQuantized(repack_blocks(blocks, kind, rows), NAMES[READ_AS.get(kind, kind)])


@numba.njit(error_model="numpy", cache=True, nogil=True)
def _dot(a: np.ndarray, b: np.ndarray, lanes: np.ndarray) -> np.float32:  # pragma: no cover
    """sum_k a[k] b[k] for float rows whose length is not a multiple of LANES, in one fixed
    order of IEEE float32 operations (no fast-math: the same bits on every CPU): lane ``l`` of
    the scratch ``lanes`` (LANES,) sums ``a[k] * b[k]`` for ``k = l, l + LANES, ...``, then the
    lanes are added by halving."""
    n = a.shape[0]
    full = n - n % LANES
    lanes[:] = 0.0
    for k0 in range(0, full, LANES):
        for lane in range(LANES):
            lanes[lane] += a[k0 + lane] * b[k0 + lane]
    for lane in range(n - full):
        lanes[lane] += a[full + lane] * b[full + lane]
    width = LANES
    while width > 1:
        width //= 2
        for lane in range(width):
            lanes[lane] += lanes[lane + width]
    total: np.float32 = lanes[0]
    return total


@numba.njit(parallel=True, cache=True, nogil=True)
def _matmul_kernel(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover
    """out[t, n] = dot(x[t], w[n]) for float32 w whose in_features is not a multiple of
    LANES (the same code for every row count, so still batch-invariant)."""
    num_rows = x.shape[0]
    num_out = w.shape[0]
    for task in numba.prange((num_out + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        n0 = task * ROWS_PER_TASK
        n1 = min(num_out, n0 + ROWS_PER_TASK)
        lanes = np.empty(LANES, np.float32)
        for t0 in range(0, num_rows, ROWS_PER_TILE):
            for n in range(n0, n1):
                wn = w[n]
                for t in range(t0, min(num_rows, t0 + ROWS_PER_TILE)):
                    out[t, n] = _dot(wn, x[t], lanes)


@numba.njit(parallel=True, cache=True, nogil=True)
def _dequantize_kernel(
    blocks: np.ndarray, kind: int, rows: np.ndarray, out: np.ndarray
) -> None:  # pragma: no cover - compiled
    for i in numba.prange(rows.shape[0]):
        decode_into(kind, blocks, rows[i], out, i)  # type: ignore[call-arg]


def dequantize_rows(w: BlockQuantized, rows: np.ndarray) -> np.ndarray:
    """Rows ``rows`` of ``w`` in float32 (embedding lookup), bit-identical to ``gguf``'s values.

    Args:
        w: (out_features, in_features) block-quantized matrix.
        rows: (num_rows,) integer indices in ``[0, out_features)``.

    Returns:
        (num_rows, in_features) float32.

    Raises:
        ValueError: an index out of range.
    """
    idx = np.ascontiguousarray(rows, dtype=np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= w.shape[0]):
        raise ValueError(
            f"rows: expected indices in [0, {w.shape[0]}), got {idx.min()}..{idx.max()}"
        )
    out = np.empty((idx.size, w.shape[1]), np.float32)
    _dequantize_kernel(w.blocks, w.kind, idx, out)
    return out


Matrix = BlockQuantized | np.ndarray  # (out_features, in_features): blocks, or float32


def check_activations(activations: str) -> None:
    """Raise ValueError unless ``activations`` is one of :data:`ACTIVATIONS` and runs on the
    CPU Numba compiles for (``int8`` needs AVX2:
    :func:`pagedattn.model.int8_ir.int8_unsupported`, whose line is the message)."""
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations: expected one of {ACTIVATIONS}, got {activations!r}")
    if activations == "int8":
        from pagedattn.model.int8_ir import require_int8  # only for the int8 path

        require_int8()


def qmatmul(x: np.ndarray, *parts: Matrix, activations: str = "float32") -> np.ndarray:
    """``x @ concat(parts).T`` with each ``out[t, n]`` independent of the other rows of ``x``.

    Several parts with the same ``in_features`` (q, k and v; gate and up) share one output
    array, their columns side by side, without concatenating the weights.

    Args:
        x: (num_tokens, in_features) float32.
        parts: (out_i, in_features) block-quantized matrices, or float32 arrays (float
            checkpoints: the same dot product, so float models are batch-invariant too).
        activations: ``"float32"`` (default: exact, see the module docstring) or ``"int8"``:
            block-quantized parts meet ``x`` quantized per 32-input block to int8, as
            llama.cpp does (:mod:`pagedattn.model.block_dot_int8`, AVX2 or wider): faster,
            within about 1% of the exact result; float parts stay exact.

    Returns:
        (num_tokens, sum(out_i)) float32; bitwise the same row for a token alone or in a batch
        (on either path).

    Raises:
        ValueError: no parts, an in_features mismatch, a float part that is not float32, or
            activations not in :data:`ACTIVATIONS` (int8 on a CPU without AVX2).
    """
    if not parts:
        raise ValueError("qmatmul: expected at least one weight matrix")
    k = parts[0].shape[1]
    if x.ndim != 2 or x.shape[1] != k:
        raise ValueError(f"x: expected (num_tokens, {k}), got {x.shape}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    int8: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    if activations != "float32":
        check_activations(activations)
        if k % BLOCK == 0:
            from pagedattn.model import int8_quantize  # compiled only for the int8 path

            xq = np.empty(x.shape, np.int8)
            xd = np.empty((k // BLOCK, x.shape[0]), np.float32)  # block-major
            xsum = np.empty((k // int8_quantize.HALF, x.shape[0]), np.int32)  # per 16 inputs

            quantize = (
                int8_quantize.quantize_activations_serial
                if len(x) <= SERIAL_MAX_ROWS
                else int8_quantize.quantize_activations
            )
            quantize(x, xq, xd, xsum)
            int8 = (xq, xd, xsum)
    for w in parts:
        if w.shape[1] != k:
            raise ValueError(f"weights: expected (out_features, {k}), got {w.shape}")
    out = empty_aligned((x.shape[0], sum(p.shape[0] for p in parts)))

    def path(w: Matrix) -> str:  # int8 / registers: qmatmul_blocks(_int8); tiled; float
        if not isinstance(w, BlockQuantized):
            return "float"
        if int8 is not None:
            return "int8"
        return "registers" if x.shape[0] <= DECODE_MAX_ROWS else "tiled"

    paths = {path(w) for w in parts}
    if paths & {"tiled", "float"}:
        x = aligned(x)  # the register tiles load x from cache lines (see block_tiles)
    if len(parts) <= 3 and len(paths) == 1 and paths <= {"int8", "registers"}:
        _launch_blocks(x, int8 if paths == {"int8"} else None, parts, out)  # q|k|v: one launch
        return out
    col = 0
    for w in parts:
        n = w.shape[0]
        view = out[:, col : col + n] if len(parts) > 1 else out
        kind = path(w)
        if isinstance(w, BlockQuantized) and kind in ("int8", "registers"):
            _launch_blocks(x, int8 if kind == "int8" else None, (w,), view)
        elif isinstance(w, BlockQuantized):
            qmatmul_tiled(x, w.blocks, w.kind, view)
        else:
            if w.dtype != np.float32 or w.ndim != 2:
                raise ValueError(f"weights: expected float32 (out, in), got {w.dtype} {w.shape}")
            float_kernel = matmul_float if k % LANES == 0 else _matmul_kernel
            float_kernel(x, np.ascontiguousarray(w), view)
        col += n
    return out


def _launch_blocks(
    x: np.ndarray,
    int8: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
    parts: tuple[Matrix, ...],
    out: np.ndarray,
) -> None:
    """:func:`~pagedattn.model.block_dot.qmatmul_blocks` (float ``x``) or, given ``int8``,
    :func:`~pagedattn.model.block_dot_int8.qmatmul_blocks_int8` on 1 to 3 block-quantized
    ``parts`` (the unused slots repeat the last part)."""
    blocks = [w for w in parts if isinstance(w, BlockQuantized)]
    padded = blocks + [blocks[-1]] * (3 - len(blocks))
    kinds = (padded[0].kind, padded[1].kind, padded[2].kind)
    b0, b1, b2 = (w.blocks for w in padded)
    if int8 is None:
        qmatmul_blocks(x, b0, b1, b2, kinds, kind_set_of(blocks), len(blocks), out)
    else:
        from pagedattn.model.block_dot_int8 import qmatmul_blocks_int8

        qmatmul_blocks_int8(*int8, b0, b1, b2, kinds, len(blocks), out)
