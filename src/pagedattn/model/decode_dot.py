"""The exact decode kernel's register tile (:mod:`pagedattn.model.block_dot`): an intrinsic
that decodes a tile of output rows' blocks once in registers and meets several activation rows
with them, every accumulator taking the same ``fma`` sequence as one row alone, a variant per
block kind (a Q4_K tile of one row group through :class:`~pagedattn.model.q4_k.Q4KGroupTile`).
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from pagedattn.kernels.simd_ir import Arr2D, carried_loop, fma, hsum, load_vector, prefetch
from pagedattn.model.block_decoders import GROUP, decoder, prefetch_offsets
from pagedattn.model.block_ir import (
    LANES,
    Q4_K,
    ROW_GROUP,
    SHAPES,
    VF,
    block_ptr,
    by_kind,
    kinds_of,
    row_group,
    super_block,
)
from pagedattn.model.q4_k import SUBS, Q4KGroupTile

DECODE_TILE = 4  # output rows decoded side by side in registers (decode kernel)
STEPS = GROUP // LANES  # accumulator steps per group of 32 inputs


def _load_vf(builder: ir.IRBuilder, ptr: ir.Value) -> ir.Value:
    return load_vector(builder, ptr, LANES)


def make_decode_dot(rows: int, cols: int = 1) -> Any:
    """Intrinsic (kind, kind_set, blocks, n0, x, t0) -> UniTuple(float32, rows * cols):
    out[t0 + c, n0 + r] at index ``r * cols + c``: each block of ``rows`` output rows is decoded
    once in registers and met by ``cols`` activation rows, every accumulator taking the same
    ``fma`` sequence as one row alone; a variant per kind of ``kind_set``
    (:func:`~pagedattn.model.block_ir.kind_set`)."""

    @intrinsic  # type: ignore[misc]
    def decode_dot(
        typingctx: Any, kind: Any, kind_set: Any, blocks: Any, n0: Any, x: Any, t: Any
    ) -> Any:
        sig = types.UniTuple(types.float32, rows * cols)(kind, kind_set, blocks, n0, x, t)
        kinds = kinds_of(kind_set)

        def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> ir.Value:
            b_arr = Arr2D(context, builder, sig.args[2], args[2])
            x_arr = Arr2D(context, builder, sig.args[4], args[4])
            n_first, t_first = args[3], args[5]
            i64 = n_first.type

            def emit(kind: int, group: int | None = None) -> list[ir.Value]:
                """The tile's sums over ``kind`` blocks (of a matrix of ``group``-row groups
                where given)."""
                if kind == Q4_K and group is None:
                    # its fields lie apart by the group: a loop for each group size
                    return by_kind(
                        builder,
                        row_group(builder, b_arr),
                        lambda g: emit(kind, g),
                        (ROW_GROUP, 1),
                    )
                elements, size = SHAPES[kind]
                # Q4_K: a 32-input sub-block per step, as the int8 tiles walk it
                subs = SUBS if kind == Q4_K else 1
                accs = [ir.Constant(VF, [0.0] * LANES)] * (rows * cols)
                supers = builder.sdiv(b_arr.shape[1], i64(size))
                # a tile of rows of one group (tiles start at multiples of rows)
                tile = None
                if subs > 1 and group == ROW_GROUP and rows > 1:
                    tile = Q4KGroupTile(builder, b_arr, n_first, rows, supers)

                def body(b: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
                    k = builder.mul(b, i64(elements // subs))
                    sb, sub = (b, None) if subs == 1 else super_block(builder, b, subs)
                    if tile is not None and sub is not None:
                        decoders = tile.step(sb, sub)
                    else:
                        decoders = []
                        for r in range(rows):
                            n = builder.add(n_first, i64(r))
                            # the rows two tiles ahead (Q4_K: a line of a row's share per step)
                            ahead_n = builder.add(n, i64(2 * rows))
                            ahead = block_ptr(builder, b_arr, ahead_n, sb, size)
                            if sub is None:
                                for line in prefetch_offsets(kind):
                                    prefetch(builder, builder.gep(ahead, [i64(line)]))
                            else:
                                line = builder.mul(builder.and_(sub, i64(3)), i64(64))
                                prefetch(builder, builder.gep(ahead, [line]))
                            decoders.append(decoder(builder, kind, b_arr, n, sb, sub, group))
                    out = list(accs)
                    for g in range(decoders[0].groups):
                        at = builder.add(k, i64(GROUP * g))
                        xs = [
                            [
                                _load_vf(
                                    builder,
                                    x_arr.ptr(
                                        builder,
                                        builder.add(t_first, i64(c)),
                                        builder.add(at, i64(LANES * i)),
                                    ),
                                )
                                for i in range(STEPS)
                            ]
                            for c in range(cols)
                        ]
                        for r, dec in enumerate(decoders):
                            ws = dec.group(g)  # decoded once, met by every row of x
                            for c in range(cols):
                                j = r * cols + c
                                for w, xv in zip(ws, xs[c], strict=True):
                                    out[j] = fma(builder, w, xv, out[j])
                    return out

                count = builder.mul(supers, i64(subs))
                carried_loop(builder, count, accs, body)
                return [hsum(builder, a) for a in accs]

            sums = by_kind(builder, args[0], emit, kinds)
            return context.make_tuple(builder, sig.return_type, sums)

        return sig, codegen

    return decode_dot
