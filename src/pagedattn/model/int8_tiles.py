"""The int8-activation matmuls' register tiles of whole row groups (and of one row): a group's
four output rows side by side, one row per 128-bit lane, against ``cols`` activation rows.

A tile of one group (four rows) or of a task's four groups (sixteen rows, on zmm against one,
two or four activation rows: decode steps, small batches, verify rows) loads each group's block
whole, its fields then picked in registers (:class:`pagedattn.model.int8_blocks.Groups`:
``vpermt2d``), where per-row loads cost a load and an insert per row and field; Q6_K reads its
super-block's sub-block through each row's pointer. The block's products are summed exactly in
integers (:func:`pagedattn.model.int8_ir.quads`, :func:`~pagedattn.model.int8_ir.block_sums`),
then take ggml's reference float operations (:mod:`pagedattn.model.block_dot_int8`), the same
whatever the tile.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llvmlite import ir

from pagedattn.kernels.simd_ir import (
    F32,
    I8,
    I32,
    Arr2D,
    carried_loop,
    fma,
    mask,
)
from pagedattn.model.block_ir import BLOCK, Q4_K, ROW_GROUP, SHAPES, super_block
from pagedattn.model.int8_blocks import (
    Blocks,
    Groups,
    TileOperands,
    block_offsets,
    int8_tile,
    q4_k_fields,
    row_floats,
    sub_blocks,
    tile_blocks,
    tile_codes,
)
from pagedattn.model.int8_ir import (
    GROUPS,
    biased_q8,
    block_sums,
    operands,
    quads,
    repeated,
)
from pagedattn.model.int8_q6_k import (
    Q6_K,
    minus_32,
    q6_k_codes,
    q6_k_scales,
    q6_k_sub_scales,
    q6_k_total,
)
from pagedattn.model.int8_row_tiles import ROWS


def make_int8_dot(rows: int, cols: int, kinds: tuple[int, ...] = tuple(SHAPES)) -> Any:
    """Intrinsic (kind, blocks, n0, xq, xd, xsum, t0) -> UniTuple(float32, rows * cols): at index
    ``r * cols + c``, out[t0 + c, n0 + r] from int8 activations ``xq`` (T, K), block scales
    ``xd`` (K / 32, T) and the integer sums ``xsum`` of each block's 16-input halves (K / 16,
    T; both block-major); Q4_0 = 0, Q4_1 = 1, Q8_0 = 2
    (ggml's ``ggml_vec_dot_q8_0_q8_0``: signed codes; with VNNI they meet ``xq`` as the
    unsigned ``code + 128`` and ``128 * xsum`` is taken off the integer sum, without it as
    ``|xq|`` times the codes with ``xq``'s sign, a product pair at most 2 * 127 * 127, below
    int16's limit), Q5_0 = 3, Q5_1 = 4, Q6_K = 7 (a 32-input sub-block of its super-block per
    step; each half's sum met by its int8 scale first, :mod:`pagedattn.model.int8_blocks`). A
    block's codes are unpacked once for the ``cols`` activation rows
    (:func:`pagedattn.model.int8_blocks.tile_codes`). Per (output,
    activation row) and block, as ggml's reference ``ggml_vec_dot_q4_1_q8_1``: ``acc =
    fma(d * dx, float(sum), acc)`` with ``sum`` the block's exact integer dot product, and
    ``off = fma(offset, xs, off)`` with ``xs = dx * float(xsum)`` (q8_1's ``s``); the result
    is ``acc + off`` (Q6_K: no offset term); the same operations whatever ``rows``, ``cols``
    and instruction set."""
    assert rows in (1, ROW_GROUP, ROWS)
    tile = rows * cols
    lanes = GROUPS * rows

    def emitter(builder: ir.IRBuilder, ops: TileOperands) -> Callable[[int], list[ir.Value]]:
        b_arr, q_arr, d_arr, x_arr, n_first, t_first = ops
        i64 = n_first.type
        tile_ty = ir.VectorType(F32, tile)
        sum_ty = ir.VectorType(I32, lanes)
        v16 = ir.VectorType(I8, 16).as_pointer()
        # a tile's sums: lane r * cols + c for output row r and activation row c
        by_row = mask([r for r in range(rows) for _ in range(cols)])
        by_col = mask([c for _ in range(rows) for c in range(cols)])

        def per_col(b: ir.Value, arr: Arr2D, element: ir.Type) -> ir.Value:
            """<cols x element>: arr[b, t0 .. t0 + cols - 1] (block-major, one load)."""
            ptr = arr.ptr(builder, b, t_first)
            at = builder.bitcast(ptr, ir.VectorType(element, cols).as_pointer())
            return builder.load(at, align=4)

        def by_cols(values: ir.Value) -> ir.Value:
            """<tile x ...>: lane r * cols + c of ``values``' element c."""
            return builder.shuffle_vector(values, values, by_col)

        def by_rows(values: ir.Value) -> ir.Value:
            """<tile x ...>: lane r * cols + c of ``values``' element r."""
            return builder.shuffle_vector(values, values, by_row)

        def emit(kind: int) -> list[ir.Value]:
            size = SHAPES[kind][1]
            subs = sub_blocks(kind)  # Q6_K: eight 32-input blocks per super-block
            zero = ir.Constant(tile_ty, [0.0] * tile)

            def body(b: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
                k = builder.mul(b, i64(BLOCK))
                sb, sub = (b, None) if subs == 1 else super_block(builder, b, subs)
                # prefetched: the same block of the rows two tiles further (at least eight)
                pointers = tile_blocks(
                    builder, b_arr, n_first, sb, size, rows, max(8, 2 * rows), sub, subs
                )
                blocks: Blocks = pointers
                q4_k = None
                if kind == Q4_K:
                    assert sub is not None
                    q4_k = q4_k_fields(builder, b_arr, n_first, sb, sub, rows)
                    lo, hi = q4_k.lo, q4_k.hi
                elif sub is None:
                    if rows > 1:  # each group's blocks: one load, fields picked in registers
                        blocks = Groups.load(builder, pointers[::ROW_GROUP], size)
                    lo, hi = tile_codes(builder, kind, blocks)
                else:  # Q6_K
                    lo, hi = q6_k_codes(builder, pointers, sub)
                biased = biased_q8(kind, lo.type.count)
                split = kind == Q6_K  # a scale per 16 inputs: the halves' sums apart
                halves: tuple[list[ir.Value], list[ir.Value]] = ([], [])
                for c in range(cols):
                    t_row = builder.add(t_first, i64(c))
                    sums = ir.Constant(sum_ty, [0] * lanes)
                    for half, (codes, at) in enumerate(((lo, k), (hi, builder.add(k, i64(16))))):
                        x_ptr = builder.bitcast(q_arr.ptr(builder, t_row, at), v16)
                        x = repeated(builder, builder.load(x_ptr, align=1), rows)
                        sums = quads(builder, *operands(builder, kind, biased, codes, x), sums)
                        if split or half == 1:
                            halves[half if split else 0].append(sums)
                            sums = ir.Constant(sum_ty, [0] * lanes)
                # <cols x i32>: the integer sums of the block's two halves of activations
                x_halves = [
                    per_col(builder.add(builder.mul(b, i64(2)), i64(h)), x_arr, I32)
                    for h in range(2)
                ]
                dx = per_col(b, d_arr, F32)
                if kind == Q6_K:
                    assert sub is not None
                    centred = [  # each half's sum of (code - 32) * xq (minus_32)
                        builder.add(block_sums(builder, h), by_cols(minus_32(builder, x)))
                        for h, x in zip(halves, x_halves, strict=True)
                    ]
                    scales = q6_k_sub_scales(builder, pointers, sub)
                    block_total = q6_k_total(
                        builder, (by_rows(scales[0]), by_rows(scales[1])), (centred[0], centred[1])
                    )
                    d = by_rows(q6_k_scales(builder, pointers))
                    total = builder.sitofp(block_total, tile_ty)
                    return [fma(builder, builder.fmul(d, by_cols(dx)), total, accs[0]), accs[1]]
                block_total = block_sums(builder, halves[0])
                x_sums = builder.add(*x_halves)
                if biased:
                    bias = builder.shl(by_cols(x_sums), ir.Constant(block_total.type, [7] * tile))
                    block_total = builder.sub(block_total, bias)
                total = builder.sitofp(block_total, tile_ty)
                d_rows = row_floats(builder, blocks, 0) if q4_k is None else q4_k.scales
                d = by_rows(d_rows)
                acc = fma(builder, builder.fmul(d, by_cols(dx)), total, accs[0])
                if q4_k is None:
                    offsets = block_offsets(builder, kind, blocks, d_rows)
                else:
                    offsets = q4_k.offsets
                if offsets is None:
                    return [acc, accs[1]]
                xs = builder.fmul(dx, builder.sitofp(x_sums, dx.type))  # q8_1's s
                return [acc, fma(builder, by_rows(offsets), by_cols(xs), accs[1])]

            accs = [zero, zero]
            count = builder.mul(builder.sdiv(b_arr.shape[1], i64(size)), i64(subs))
            carried_loop(builder, count, accs, body)
            result = builder.fadd(accs[0], accs[1])
            return [builder.extract_element(result, I32(i)) for i in range(tile)]

        return emit

    return int8_tile(tile, emitter, kinds)
