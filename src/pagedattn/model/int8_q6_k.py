"""Q6_K under int8 activations: its six-bit codes, its sixteen-input scales, and the tile that
meets one activation row.

A Q6_K super-block (ggml ``block_q6_K``: ``ql[128]``, ``qh[64]``, int8 ``scales[16]``, float16
``d``) of 256 inputs is read one 32-input sub-block at a time, as the other kinds' blocks
(:func:`q6_k_codes` gives :func:`pagedattn.model.int8_blocks.tile_codes`' ``lo`` and ``hi``).
Its scale per 16 inputs keeps each half's integer sum apart: ``sc0 * sum_lo + sc1 * sum_hi``
(:func:`q6_k_total`), exact in int32, each half's sum starting at ``-32 * sum(xq)``
(:func:`minus_32`; codes are stored + 32) before its ``code * xq`` products are added; then the
one float multiply-add every kind takes, ``fma(d * dx, float(total), acc)``.

Against one activation row (a decode step), the four-row tiles' layout, four rows' halves side
by side, costs sixteen 16-byte loads and their inserts per block, as the rows' ``ql`` and
``qh`` bytes lie 210 bytes apart: worth it when eight activation rows share the codes, not for
one. :func:`make_q6_k_rows_dot` holds each row's 32 ``ql`` and 32 ``qh`` bytes in one ymm each,
unpacked there, meeting the activation block's 32 bytes in one ``vpdpbusd`` (or ``vpmaddubsw``
+ ``vpmaddwd``), with a super-block's eight sub-blocks unrolled so that their offsets, shifts
and the rows' scales are read once per super-block: the same integer sums and float operations
as the other tiles, so the same bits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from llvmlite import ir

from pagedattn.kernels.half_ir import widen_half_bits
from pagedattn.kernels.simd_ir import F32, I8, I32, carried_loop, fma, mask, splat
from pagedattn.model.block_ir import BLOCK, KINDS, Q6_K_FIELDS, SHAPES
from pagedattn.model.int8_blocks import (
    TileOperands,
    int8_tile,
    loaded,
    sub_blocks,
    tile_blocks,
)
from pagedattn.model.int8_ir import GROUPS, I16, as_type, block_sums, quads

Q6_K = KINDS["Q6_K"]
_V16 = ir.VectorType(I8, 16)


class Q6KPlace(NamedTuple):
    """Where a Q6_K sub-block's codes are (i64 values known at run time): the byte offsets of
    its inputs 0-15 in ``ql`` and in ``qh`` (inputs 16-31 follow 16 bytes on), and the shifts
    that bring its nibble and its two high bits down (:func:`q6_k_unpack`)."""

    ql_at: ir.Value
    qh_at: ir.Value
    nibble_shift: ir.Value
    bits_shift: ir.Value


def q6_k_place(builder: ir.IRBuilder, sub: ir.Value) -> Q6KPlace:
    """Sub-block ``sub`` (i64, 0-7) of a Q6_K super-block, as ggml's ``dequantize_row_q6_K``
    reads it: half ``h = sub / 4`` of 128 inputs, quarter ``s = sub % 4``; input ``l`` (0-31)
    is the low (``s`` < 2) or high nibble of ``ql[64 h + 32 (s % 2) + l]``, with bits ``2 s``
    of ``qh[32 h + l]`` above it."""
    i64 = sub.type
    ql_at, qh_at, _, _ = Q6_K_FIELDS
    half = builder.lshr(sub, i64(2))
    quarter = builder.and_(sub, i64(3))
    odd = builder.and_(quarter, i64(1))
    return Q6KPlace(
        builder.add(builder.mul(half, i64(64)), builder.add(builder.mul(odd, i64(32)), i64(ql_at))),
        builder.add(builder.mul(half, i64(32)), i64(qh_at)),
        builder.mul(builder.lshr(quarter, i64(1)), i64(4)),
        builder.mul(quarter, i64(2)),
    )


def q6_k_unpack(builder: ir.IRBuilder, ql: ir.Value, qh: ir.Value, place: Q6KPlace) -> ir.Value:
    """Code bytes (0-63) from ``ql`` and ``qh`` bytes of the same inputs: the nibble and the
    two bits are shifted out of 16-bit lanes by :class:`Q6KPlace`'s amounts (one ``vpsrlw``
    each) and masked per byte."""

    def shifted(v: ir.Value, by: ir.Value) -> ir.Value:
        words = as_type(builder, v, I16)
        amount = splat(builder, builder.trunc(by, I16), words.type.count)
        return as_type(builder, builder.lshr(words, amount), I8)

    count = ql.type.count
    nib = builder.and_(shifted(ql, place.nibble_shift), ir.Constant(ql.type, [15] * count))
    top = builder.and_(shifted(qh, place.bits_shift), ir.Constant(qh.type, [3] * count))
    return builder.or_(nib, builder.shl(top, ir.Constant(qh.type, [4] * count)))


def q6_k_codes(
    builder: ir.IRBuilder, blocks: list[ir.Value], sub: ir.Value
) -> tuple[ir.Value, ir.Value]:
    """Sub-block ``sub`` of each row's Q6_K super-block as
    :func:`~pagedattn.model.int8_blocks.tile_codes`' ``lo`` and ``hi`` (codes 0-63, stored
    + 32; :func:`q6_k_place`)."""
    place = q6_k_place(builder, sub)
    i64 = sub.type
    lo, hi = (
        q6_k_unpack(
            builder,
            loaded(builder, blocks, builder.add(place.ql_at, i64(part)), _V16),
            loaded(builder, blocks, builder.add(place.qh_at, i64(part)), _V16),
            place,
        )
        for part in (0, 16)
    )
    return lo, hi


def q6_k_sub_scales(
    builder: ir.IRBuilder, blocks: list[ir.Value], sub: ir.Value
) -> tuple[ir.Value, ir.Value]:
    """<rows x i32> twice: each row's int8 scales of sub-block ``sub``'s two halves
    (``scales[2 sub]``, ``scales[2 sub + 1]``)."""
    i64 = sub.type
    at = builder.add(builder.mul(sub, i64(2)), i64(Q6_K_FIELDS[2]))
    pairs = as_type(builder, loaded(builder, blocks, at, I16), I8)  # row r: bytes 2r, 2r + 1
    rows = len(blocks)
    lo, hi = (
        builder.sext(
            builder.shuffle_vector(pairs, pairs, mask([2 * r + i for r in range(rows)])),
            ir.VectorType(I32, rows),
        )
        for i in range(2)
    )
    return lo, hi


def minus_32(builder: ir.IRBuilder, x_sum: ir.Value) -> ir.Value:
    """``-32 * x_sum`` (an int32 or a vector of them): where a Q6_K half's sum of ``code * xq``
    starts, so that it ends as the sum of ``(code - 32) * xq`` (codes are stored + 32)."""
    ty = x_sum.type
    count = ty.count if isinstance(ty, ir.VectorType) else 0

    def const(v: int) -> ir.Constant:
        return ir.Constant(ty, [v] * count) if count else ir.Constant(ty, v)

    return builder.sub(const(0), builder.shl(x_sum, const(5)))


def q6_k_total(
    builder: ir.IRBuilder, scales: tuple[ir.Value, ir.Value], halves: tuple[ir.Value, ir.Value]
) -> ir.Value:
    """A Q6_K sub-block's exact integer dot products: ``scales[0] * halves[0] + scales[1] *
    halves[1]`` per lane, ``halves`` the sums of ``(code - 32) * xq`` of its two 16-input
    halves (lanes as ``scales``'). At most 2 * 128 * 16 * 32 * 128 in magnitude."""
    return builder.add(builder.mul(scales[0], halves[0]), builder.mul(scales[1], halves[1]))


def q6_k_scales(builder: ir.IRBuilder, blocks: list[ir.Value]) -> ir.Value:
    """<rows x float>: each row's super-block scale ``d`` (float16, exactly widened)."""
    return widen_half_bits(builder, loaded(builder, blocks, Q6_K_FIELDS[3], I16))


_V32 = ir.VectorType(I8, 32)


def make_q6_k_rows_dot(rows: int) -> Any:
    """Intrinsic (kind, blocks, n0, xq, xd, xsum, t0) -> UniTuple(float32, rows): out[t0, n0 +
    r] of Q6_K ``blocks`` for ``rows`` output rows (1 or a ROW_GROUP group) and one activation
    row, the values :func:`pagedattn.model.int8_tiles.make_int8_dot` gives."""
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
                blocks = tile_blocks(builder, b_arr, n_first, sb, size, rows, 8)
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
