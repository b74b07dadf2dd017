"""Q6_K against one int8 activation row (a decode step): each output row's 32-input block in
one ymm, row after row.

The four-row tiles (:mod:`pagedattn.model.block_dot_int8`) hold four rows' halves of a block
side by side, one row per 128-bit lane: for Q6_K, whose rows' ``ql`` and ``qh`` bytes lie 210
bytes apart, that costs sixteen 16-byte loads and their inserts per block, worth it when eight
activation rows share the codes but not for one. Here each row's 32 ``ql`` and 32 ``qh`` bytes
are one load each, unpacked in a ymm (:func:`~pagedattn.model.int8_blocks.q6_k_unpack`), and
meet the activation block's 32 bytes in one ``vpdpbusd`` (or ``vpmaddubsw`` + ``vpmaddwd``)
that starts from ``-32 * sum(xq)`` of each half (:func:`~pagedattn.model.int8_blocks.minus_32`);
the rows' lanes are summed per half, met by the halves' int8 scales, and take the same float
multiply-add as every other tile: the same integer sums and float operations, so the same bits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llvmlite import ir

from pagedattn.kernels.simd_ir import F32, I8, I32, carried_loop, fma, mask, prefetch, splat
from pagedattn.model.block_ir import BLOCK, Q6_K_FIELDS, SHAPES, block_ptr
from pagedattn.model.int8_blocks import (
    Q6_K,
    TileOperands,
    int8_tile,
    loaded,
    minus_32,
    q6_k_place,
    q6_k_scales,
    q6_k_total,
    q6_k_unpack,
    sub_blocks,
    tile_blocks,
)
from pagedattn.model.int8_ir import GROUPS, block_sums, quads

_V32 = ir.VectorType(I8, 32)


def make_q6_k_rows_dot(rows: int) -> Any:
    """Intrinsic (kind, blocks, n0, xq, xd, xsum, t0) -> UniTuple(float32, rows): out[t0, n0 +
    r] of Q6_K ``blocks`` for ``rows`` output rows (1 or a ROW_GROUP group) and one activation
    row, the values :func:`pagedattn.model.block_dot_int8._make_int8_dot` gives."""
    size = SHAPES[Q6_K][1]
    subs = sub_blocks(Q6_K)

    def emitter(builder: ir.IRBuilder, ops: TileOperands) -> Callable[[int], list[ir.Value]]:
        b_arr, q_arr, d_arr, x_arr, n_first, t_row = ops
        i64 = n_first.type
        vf = ir.VectorType(F32, rows)
        lanes = ir.VectorType(I32, 2 * GROUPS)

        def emit(kind: int) -> list[ir.Value]:
            assert kind == Q6_K

            def sub_block(
                blocks: list[ir.Value],
                scales: ir.Value,
                d: ir.Value,
                b: ir.Value,
                j: int,
                acc: ir.Value,
            ) -> ir.Value:
                """``acc`` after 32-input block ``b``, sub-block ``j`` of the super-block."""
                place = q6_k_place(builder, i64(j))
                x_ptr = q_arr.ptr(builder, t_row, builder.mul(b, i64(BLOCK)))
                x = builder.load(builder.bitcast(x_ptr, _V32.as_pointer()), align=1)
                two_b = builder.mul(b, i64(2))
                x_sums = [
                    builder.load(x_arr.ptr(builder, builder.add(two_b, i64(h)), t_row))
                    for h in range(2)
                ]
                # lane 0 of each half starts at -32 * sum(xq) of that half, the others at 0
                start = ir.Constant(lanes, [0] * lanes.count)
                for h in range(2):
                    start = builder.insert_element(
                        start, minus_32(builder, x_sums[h]), I32(GROUPS * h)
                    )
                row_sums = []
                for r in range(rows):
                    ql = loaded(builder, blocks[r : r + 1], place.ql_at, _V32)
                    qh = loaded(builder, blocks[r : r + 1], place.qh_at, _V32)
                    codes = q6_k_unpack(builder, ql, qh, place)
                    row_sums.append(quads(builder, codes, x, start))
                # lane h * rows + r: row r's sum of (code - 32) * xq over half h
                halves = block_sums(builder, row_sums)
                lo, hi = (
                    builder.shuffle_vector(
                        halves, halves, mask([h * rows + r for r in range(rows)])
                    )
                    for h in range(2)
                )
                # row r's int8 scales of the sub-block's halves: bytes 2j, 2j + 1 of its 16
                sc = [
                    builder.sext(
                        builder.shuffle_vector(
                            scales, scales, mask([16 * r + 2 * j + h for r in range(rows)])
                        ),
                        ir.VectorType(I32, rows),
                    )
                    for h in range(2)
                ]
                total = q6_k_total(builder, (sc[0], sc[1]), (lo, hi))
                dx = builder.load(d_arr.ptr(builder, b, t_row))
                ddx = builder.fmul(d, splat(builder, dx, rows))
                return fma(builder, ddx, builder.sitofp(total, vf), acc)

            def body(sb: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
                ahead = block_ptr(builder, b_arr, builder.add(n_first, i64(8)), sb, size)
                for line in range(0, rows * size, 64):
                    prefetch(builder, builder.gep(ahead, [i64(line)]))
                blocks = tile_blocks(builder, b_arr, n_first, sb, size, rows)
                scales = loaded(builder, blocks, Q6_K_FIELDS[2], ir.VectorType(I8, 16))
                d = q6_k_scales(builder, blocks)
                acc = accs[0]
                for j in range(subs):
                    b = builder.add(builder.mul(sb, i64(subs)), i64(j))
                    acc = sub_block(blocks, scales, d, b, j, acc)
                return [acc]

            accs = [ir.Constant(vf, [0.0] * rows)]
            carried_loop(builder, builder.sdiv(b_arr.shape[1], i64(size)), accs, body)
            result = builder.fadd(accs[0], ir.Constant(vf, [0.0] * rows))  # as the other tiles
            return [builder.extract_element(result, I32(r)) for r in range(rows)]

        return emit

    return int8_tile(rows, emitter, (Q6_K,))
