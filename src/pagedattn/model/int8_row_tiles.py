"""The int8-activation matmuls' widest register tile: sixteen output rows, one per int32 lane.

A task's sixteen rows (four groups of four, :data:`pagedattn.model.block_ir.ROW_GROUP`) have
their block codes transposed in registers, once per block, into eight vectors of four inputs
by sixteen rows (:func:`transposed_codes`). Each activation row then meets them with eight
``vpdpbusd`` (or ``vpmaddubsw`` + ``vpmaddwd``) whose activation operand is four of its bytes
broadcast to every lane (a load folded into the instruction), and the block's integer dot
products land one per row, with no sum across lanes: about half the instructions of four
four-row tiles (:mod:`pagedattn.model.block_dot_int8`) for the same integer sums and the same
float operations, so the same bits. Used on the zmm paths only (32 registers hold the codes and
the accumulators of eight activation rows), for matrices stored in groups of four rows (every
real model's), whose rows then lie a constant block apart.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llvmlite import ir

from pagedattn.kernels.simd_ir import F32, I8, I32, carried_loop, fma, mask, splat
from pagedattn.model.block_ir import (
    BLOCK,
    LAYOUT,
    Q4_K,
    Q5_KINDS,
    ROW_GROUP,
    SHAPES,
    Place,
    super_block,
)
from pagedattn.model.int8_blocks import (
    TileOperands,
    block_offsets,
    fifth_bits,
    int8_tile,
    loaded,
    q4_k_fields,
    row_floats,
    sub_blocks,
    tile_blocks,
)
from pagedattn.model.int8_ir import (
    GROUPS,
    as_type,
    biased_q8,
    code_plus_128,
    concat,
    operands,
    quads,
)
from pagedattn.model.int8_q6_k import (
    Q6_K,
    minus_32,
    q6_k_place,
    q6_k_scales,
    q6_k_sub_scales,
    q6_k_total,
    q6_k_unpack,
)
from pagedattn.model.q4_k import q4_k_at

ROWS = 16  # output rows per tile: one per int32 lane of a zmm

_V16 = ir.VectorType(I8, 16)


def _transposed(builder: ir.IRBuilder, per_group: list[ir.Value]) -> list[ir.Value]:
    """Four <16 x i32>, ``out[g]``'s lane ``4q + i`` = lane ``4i + g`` of ``per_group[q]``
    (each: four rows' four words, row after row)."""
    first, second = concat(builder, per_group[:2]), concat(builder, per_group[2:])
    return [
        builder.shuffle_vector(
            first,
            second,
            mask([16 * q + 4 * i + g for q in range(GROUPS) for i in range(GROUPS)]),
        )
        for g in range(GROUPS)
    ]


def transposed_codes(
    builder: ir.IRBuilder, kind: int, blocks: list[ir.Value], sub: ir.Value | None = None
) -> tuple[list[ir.Value], list[ir.Value]]:
    """The sixteen rows' codes of a block (``blocks``: i8* at each row's, the kernels' layout)
    as ``lo[g]`` and ``hi[g]`` (<64 x i8>): in lane ``r``, row ``r``'s inputs ``4g .. 4g + 3``
    and ``16 + 4g .. 16 + 4g + 3`` (as :func:`pagedattn.model.int8_blocks.tile_codes` codes them;
    transposing the packed codes first, then unpacking, takes fewer shuffles than transposing
    tile_codes' two results; Q6_K's ``ql`` and ``qh`` bytes are transposed, then unpacked)."""

    def words(offset: int | ir.Value) -> list[ir.Value]:
        per_group = [
            as_type(builder, loaded(builder, blocks[q : q + GROUPS], offset, _V16), I32)
            for q in range(0, ROWS, GROUPS)
        ]
        return [as_type(builder, v, I8) for v in _transposed(builder, per_group)]

    if kind == Q6_K:
        assert sub is not None
        place = q6_k_place(builder, sub)
        i64 = sub.type
        halves = []
        for part in (0, 16):
            ql = words(builder.add(place.ql_at, i64(part)))
            qh = words(builder.add(place.qh_at, i64(part)))
            halves.append([q6_k_unpack(builder, a, b, place) for a, b in zip(ql, qh, strict=True)])
        return halves[0], halves[1]
    if kind == Q4_K:  # a group's sub-block codes side by side: one load per group
        assert sub is not None
        i64 = sub.type
        at = [
            q4_k_at(builder, Place(p, i64(0), i64(ROW_GROUP)), "codes", sub)
            for p in blocks[::ROW_GROUP]
        ]
        v16 = ir.VectorType(I32, 16).as_pointer()
        per_group = [builder.load(builder.bitcast(p, v16), align=1) for p in at]
        packed = [as_type(builder, v, I8) for v in _transposed(builder, per_group)]
        count = packed[0].type.count
        return (
            [builder.and_(p, ir.Constant(p.type, [15] * count)) for p in packed],
            [builder.lshr(p, ir.Constant(p.type, [4] * count)) for p in packed],
        )
    header = LAYOUT[kind][1]
    if not LAYOUT[kind][2]:  # Q8_0 (biased as tile_codes biases it)
        lo, hi = words(header), words(header + 16)
        if biased_q8(kind, 16 * GROUPS):
            return [code_plus_128(builder, v) for v in lo], [code_plus_128(builder, v) for v in hi]
        return lo, hi
    packed = words(header)
    count = packed[0].type.count
    lo = [builder.and_(p, ir.Constant(p.type, [15] * count)) for p in packed]
    hi = [builder.lshr(p, ir.Constant(p.type, [4] * count)) for p in packed]
    if kind in Q5_KINDS:
        qh = loaded(builder, blocks, header - 4, I32)
        for g in range(GROUPS):
            lo[g] = builder.or_(lo[g], fifth_bits(builder, qh, [4 * g] * ROWS))
            hi[g] = builder.or_(hi[g], fifth_bits(builder, qh, [16 + 4 * g] * ROWS))
    return lo, hi


def make_rows_dot(cols: int) -> Any:
    """Intrinsic (kind, blocks, n0, xq, xd, xsum, t0) -> UniTuple(float32, 16 * cols), as
    :func:`pagedattn.model.int8_tiles.make_int8_dot` gives for 16 output rows (``n0`` a
    multiple of ROW_GROUP): the same integer sums and float operations, so the same bits."""
    tile = ROWS * cols

    def emitter(builder: ir.IRBuilder, ops: TileOperands) -> Callable[[int], list[ir.Value]]:
        b_arr, q_arr, d_arr, x_arr, n_first, t_first = ops
        i64 = n_first.type
        vf = ir.VectorType(F32, ROWS)
        vi = ir.VectorType(I32, ROWS)

        def emit(kind: int) -> list[ir.Value]:
            size = SHAPES[kind][1]
            subs = sub_blocks(kind)  # Q6_K: eight 32-input blocks per super-block
            biased = biased_q8(kind, 16 * GROUPS)  # as tile_codes codes each group of rows
            zero = ir.Constant(vi, [0] * ROWS)

            def body(b: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
                k = builder.mul(b, i64(BLOCK))
                sb, sub = (b, None) if subs == 1 else super_block(builder, b, subs)
                blocks = tile_blocks(builder, b_arr, n_first, sb, size, ROWS, ROWS, sub, subs)
                lo, hi = transposed_codes(builder, kind, blocks, sub)
                scales = offsets = None
                if kind == Q6_K:
                    assert sub is not None
                    d = q6_k_scales(builder, blocks)
                    scales = q6_k_sub_scales(builder, blocks, sub)
                elif kind == Q4_K:
                    assert sub is not None
                    q4_k = q4_k_fields(builder, b_arr, n_first, sb, sub, ROWS)
                    d, offsets = q4_k.scales, q4_k.offsets
                else:
                    d = row_floats(builder, blocks, 0)
                    offsets = block_offsets(builder, kind, blocks, d)
                out = list(accs)
                for c in range(cols):
                    t_row = builder.add(t_first, i64(c))
                    x_words = builder.bitcast(q_arr.ptr(builder, t_row, k), I32.as_pointer())
                    two_b = builder.mul(b, i64(2))
                    x_halves = [
                        builder.load(x_arr.ptr(builder, builder.add(two_b, i64(h)), t_row))
                        for h in range(2)
                    ]
                    # the block's sum, or Q6_K's sums of inputs 0-15 and 16-31, each from -32 *
                    # sum(xq) (minus_32)
                    halves = [
                        zero if scales is None else splat(builder, minus_32(builder, x), ROWS)
                        for x in x_halves
                    ]
                    for j, codes in enumerate(lo + hi):
                        word = builder.load(builder.gep(x_words, [i64(j)]), align=1)
                        x = as_type(builder, splat(builder, word, ROWS), I8)  # 4 bytes, every row
                        h = j // GROUPS if scales is not None else 0  # Q6_K: halves apart
                        halves[h] = quads(
                            builder, *operands(builder, kind, biased, codes, x), halves[h]
                        )
                    dx = builder.load(d_arr.ptr(builder, b, t_row))
                    ddx = builder.fmul(d, splat(builder, dx, ROWS))
                    if scales is not None:
                        total = q6_k_total(builder, scales, (halves[0], halves[1]))
                        out[c] = fma(builder, ddx, builder.sitofp(total, vf), out[c])
                        continue
                    sums = halves[0]
                    x_sum = builder.add(x_halves[0], x_halves[1])
                    if biased:
                        sums = builder.sub(sums, splat(builder, builder.shl(x_sum, I32(7)), ROWS))
                    out[c] = fma(builder, ddx, builder.sitofp(sums, vf), out[c])
                    if offsets is not None:
                        xs = builder.fmul(dx, builder.sitofp(x_sum, F32))  # q8_1's s
                        out[cols + c] = fma(
                            builder, offsets, splat(builder, xs, ROWS), out[cols + c]
                        )
                return out

            accs = [ir.Constant(vf, [0.0] * ROWS)] * (2 * cols)
            count = builder.mul(builder.sdiv(b_arr.shape[1], i64(size)), i64(subs))
            carried_loop(builder, count, accs, body)
            results = [builder.fadd(accs[c], accs[cols + c]) for c in range(cols)]
            return [
                builder.extract_element(results[c], I32(r))
                for r in range(ROWS)
                for c in range(cols)
            ]

        return emit

    return int8_tile(tile, emitter)
