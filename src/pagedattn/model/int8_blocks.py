"""What an int8 register tile reads from the weights' blocks: code bytes, scales and offsets.

A tile of ``rows`` output rows (one, or whole :data:`~pagedattn.model.block_ir.ROW_GROUP`-row
groups: :func:`tile_blocks`) meets the activations one 32-input block at a time, reading each
row's block through its pointer or each group's block loaded whole (:class:`Groups`).
:func:`tile_codes` gives the block's codes
as two byte vectors, ``lo`` with each row's inputs 0-15 and ``hi`` with its inputs 16-31, one
row per 16 bytes (:mod:`pagedattn.model.int8_ir` says how they meet the activations): Q8_0's
int8 codes, the 4-bit kinds' nibbles (with Q5_0 / Q5_1's fifth bit); Q6_K's six-bit codes and
sixteen-input scales are :mod:`pagedattn.model.int8_q6_k`'s.

The tile intrinsic wrapper (:func:`int8_tile`) and its operands live here too: every tile
module reads its arrays through them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from pagedattn.kernels.simd_ir import F32, I8, I32, Arr2D, mask, prefetch, splat
from pagedattn.model.block_ir import (
    BLOCK,
    CENTRED,
    LAYOUT,
    MINIMUM_KINDS,
    Q4_K,
    Q5_KINDS,
    ROW_GROUP,
    SHAPES,
    Place,
    block_place,
    block_ptr,
    by_kind,
)
from pagedattn.model.int8_ir import (
    GROUPS,
    as_type,
    biased_q8,
    code_plus_128,
    concat,
    require_int8,
)
from pagedattn.model.q4_k import q4_k_at, sub_block_fields

_V16 = ir.VectorType(I8, 16)


def sub_blocks(kind: int) -> int:
    """32-input blocks per block of ``kind`` as the kernels read it (8 for Q6_K, else 1)."""
    return SHAPES[kind][0] // BLOCK


def prefetch_share(
    builder: ir.IRBuilder, ahead: ir.Value, group_bytes: int, sub: ir.Value | None, subs: int
) -> None:
    """Prefetch sub-block ``sub``'s share (of ``subs``) of the ``group_bytes`` bytes at ``ahead``
    (a tile's blocks further on): all of them where ``sub`` is None, else the cache lines of
    one ``subs``-th, so that a super-block's blocks are fetched once over its sub-blocks."""
    i64 = ir.IntType(64)
    lines = -(-group_bytes // (64 * subs))
    first = i64(0) if sub is None else builder.mul(sub, i64(64 * lines))
    for line in range(lines):
        prefetch(builder, builder.gep(ahead, [builder.add(first, i64(64 * line))]))


class Groups(NamedTuple):
    """Block ``b`` of the rows of one or more ROW_GROUP-row groups (each group's blocks side by
    side in the kernels' layout), each group's loaded as one vector of ``ROW_GROUP * size / 4``
    int32 words: a tile picks its fields out of registers (``vpermt2d``), where per-row loads
    cost a load and an insert per row and field."""

    words: tuple[ir.Value, ...]
    size: int  # bytes of one row's block

    @classmethod
    def load(cls, builder: ir.IRBuilder, firsts: list[ir.Value], size: int) -> Groups:
        """The groups whose first rows' blocks are at ``firsts`` (i8*; 1, 2 or 4 of them)."""
        ty = ir.VectorType(I32, ROW_GROUP * size // 4).as_pointer()
        return cls(tuple(builder.load(builder.bitcast(f, ty), align=4) for f in firsts), size)

    def pick(self, builder: ir.IRBuilder, offset: int, ty: ir.Type) -> ir.Value:
        """As :func:`loaded` gives it for the groups' rows: the ``ty`` at byte ``offset`` (a
        multiple of 4) of each row's block, group after group."""
        element = ty.element if isinstance(ty, ir.VectorType) else ty
        count = ty.count if isinstance(ty, ir.VectorType) else 1
        words = count * (32 if isinstance(element, ir.FloatType) else element.width) // 32
        assert offset % 4 == 0 and words >= 1
        at = mask(
            [r * self.size // 4 + offset // 4 + w for r in range(ROW_GROUP) for w in range(words)]
        )
        picked = [builder.shuffle_vector(w, w, at) for w in self.words]
        return as_type(builder, concat(builder, picked), element)


Blocks = list[ir.Value] | Groups  # i8* at each row's block, or groups' blocks in registers


def loaded(builder: ir.IRBuilder, blocks: Blocks, offset: int | ir.Value, ty: ir.Type) -> ir.Value:
    """<len(blocks) * n x element> (``ty`` = <n x element>), or <len(blocks) x ty> for a
    scalar ``ty``: the ``ty`` at byte ``offset`` (an int, or an i64 known at run time) of each
    block (i8*), one after another."""
    if isinstance(blocks, Groups):
        assert isinstance(offset, int)
        return blocks.pick(builder, offset, ty)
    at_byte = ir.Constant(ir.IntType(64), offset) if isinstance(offset, int) else offset
    at = [builder.gep(p, [at_byte]) for p in blocks]
    values = [builder.load(builder.bitcast(p, ty.as_pointer()), align=1) for p in at]
    if isinstance(ty, ir.VectorType):
        return concat(builder, values)
    out = ir.Constant(ir.VectorType(ty, len(values)), ir.Undefined)
    for r, v in enumerate(values):
        out = builder.insert_element(out, v, I32(r))
    return out


def fifth_bits(builder: ir.IRBuilder, qh: ir.Value, shifts: list[int]) -> ir.Value:
    """Bytes 16 where bit ``shifts[i] + k`` of ``qh``'s lane ``i`` (the fifth bit of the input
    held in byte ``k`` of that lane) is set, and 0 elsewhere: each byte picks the byte of its
    lane's ``qh`` that holds its bit (``vpshufb``) and tests it."""
    lanes = qh.type.count
    positions = [shifts[i] + k for i in range(lanes) for k in range(4)]
    qh_bytes = as_type(builder, qh, I8)
    picked = builder.shuffle_vector(
        qh_bytes, qh_bytes, mask([4 * (b // 4) + p // 8 for b, p in enumerate(positions)])
    )
    bytes_ty = picked.type
    bit = builder.and_(picked, ir.Constant(bytes_ty, [1 << (p % 8) for p in positions]))
    return builder.select(
        builder.icmp_unsigned("!=", bit, ir.Constant(bytes_ty, [0] * (4 * lanes))),
        ir.Constant(bytes_ty, [16] * (4 * lanes)),
        ir.Constant(bytes_ty, [0] * (4 * lanes)),
    )


def tile_codes(builder: ir.IRBuilder, kind: int, blocks: Blocks) -> tuple[ir.Value, ir.Value]:
    """The ``lo`` and ``hi`` <16 * rows x i8> code bytes of a tile's blocks (i8* at each row's
    block, the kernels' layout): Q8_0's codes 0-15 and 16-31 of each row (signed, or
    :func:`~pagedattn.model.int8_ir.biased_q8`'s ``code + 128``); the 4-bit kinds' low and high
    nibbles (byte j: inputs j and 16 + j), with Q5_0 / Q5_1's fifth bit (bit j of the 32 bits
    before the codes: input j) as 16 (Q6_K's: :func:`pagedattn.model.int8_q6_k.q6_k_codes`)."""
    header = LAYOUT[kind][1]
    if not LAYOUT[kind][2]:  # Q8_0
        lo, hi = (loaded(builder, blocks, at, _V16) for at in (header, header + 16))
        if not biased_q8(kind, lo.type.count):
            return lo, hi
        return code_plus_128(builder, lo), code_plus_128(builder, hi)
    packed = loaded(builder, blocks, header, _V16)
    count = packed.type.count
    lo = builder.and_(packed, ir.Constant(packed.type, [15] * count))
    hi = builder.lshr(packed, ir.Constant(packed.type, [4] * count))
    if kind in Q5_KINDS:
        qh = loaded(builder, blocks, header - 4, I32)
        qh = builder.shuffle_vector(qh, qh, mask([i // GROUPS for i in range(count // 4)]))
        groups = [4 * (i % GROUPS) for i in range(qh.type.count)]  # lane (r, g): inputs 4g ..
        lo = builder.or_(lo, fifth_bits(builder, qh, groups))
        hi = builder.or_(hi, fifth_bits(builder, qh, [16 + s for s in groups]))
    return lo, hi


def row_floats(builder: ir.IRBuilder, blocks: Blocks, offset: int) -> ir.Value:
    """<rows x float>: the float32 at byte ``offset`` of each row's block (a widened header
    field: the scale at 0, Q4_1's / Q5_1's minimum at 4)."""
    return loaded(builder, blocks, offset, F32)


def tile_blocks(
    builder: ir.IRBuilder,
    b_arr: Arr2D,
    n: ir.Value,
    b: ir.Value,
    size: int,
    rows: int,
    ahead: int,
    sub: ir.Value | None = None,
    subs: int = 1,
) -> list[ir.Value]:
    """i8* at block ``b`` of each of rows ``n .. n + rows - 1``: one row of any matrix, or
    whole ROW_GROUP-row groups of a grouped matrix (``n`` a multiple of ROW_GROUP; a group's
    rows side by side, ``size`` apart). First prefetches (:func:`prefetch_share`, for
    sub-block ``sub`` of ``subs``) the same block of the rows ``ahead`` further."""
    i64 = n.type
    group = min(rows, ROW_GROUP)
    assert rows % group == 0
    out: list[ir.Value] = []
    for q in range(0, rows, group):
        first = builder.add(n, i64(q))
        further = block_ptr(builder, b_arr, builder.add(first, i64(ahead)), b, size)
        prefetch_share(builder, further, group * size, sub, subs)
        at = block_ptr(builder, b_arr, first, b, size)
        out += [builder.gep(at, [i64(size * r)]) for r in range(group)]
    return out


class Q4KFields(NamedTuple):
    """A tile's rows' Q4_K sub-block: its code bytes as :func:`tile_codes` gives Q4_1's, the
    rows' scales ``d * sc`` and offsets ``-(dmin * m)`` (<rows x float>)."""

    lo: ir.Value
    hi: ir.Value
    scales: ir.Value
    offsets: ir.Value


def q4_k_fields(
    builder: ir.IRBuilder, b_arr: Arr2D, n: ir.Value, sb: ir.Value, sub: ir.Value, rows: int
) -> Q4KFields:
    """Sub-block ``sub`` of super-block ``sb`` of rows ``n .. n + rows - 1`` (one row of any
    matrix, or whole groups of a grouped one, as :func:`tile_blocks` takes them) in Q4_K's
    layout (:data:`~pagedattn.model.q4_k.Q4_K_FIELDS`): a group's four rows' elements of
    a field lie side by side, so each field is one load per group."""
    i64 = n.type
    size = SHAPES[Q4_K][1]
    per = min(rows, ROW_GROUP)  # rows per place
    places = []
    for q in range(0, rows, per):
        place = block_place(builder, b_arr, builder.add(n, i64(q)), sb, size)
        if rows > 1:  # whole groups: the first row's, in a group of ROW_GROUP
            place = Place(place.base, i64(0), i64(ROW_GROUP))
        places.append(place)

    def field(name: str, j: ir.Value | int, ty: ir.Type) -> ir.Value:
        vector = ir.VectorType(ty, per * (16 if name == "codes" else 1))
        return concat(
            builder,
            [
                builder.load(
                    builder.bitcast(q4_k_at(builder, p, name, j), vector.as_pointer()), align=1
                )
                for p in places
            ],
        )

    packed = field("codes", sub, I8)
    sc, m = (builder.uitofp(field(name, sub, I8), ir.VectorType(F32, rows)) for name in ("sc", "m"))
    d, dmin = (field(name, 0, F32) for name in ("d", "dmin"))
    count = packed.type.count
    lo = builder.and_(packed, ir.Constant(packed.type, [15] * count))
    hi = builder.lshr(packed, ir.Constant(packed.type, [4] * count))
    return Q4KFields(lo, hi, *sub_block_fields(builder, d, dmin, sc, m))


def block_offsets(
    builder: ir.IRBuilder, kind: int, blocks: Blocks, d_rows: ir.Value
) -> ir.Value | None:
    """<rows x float> of each row's block offset (the values of
    :func:`pagedattn.model.block_ir.scale_offset`, ``d_rows`` the rows' scales), or None for
    Q8_0, which has none."""
    if kind in MINIMUM_KINDS:
        return row_floats(builder, blocks, 4)
    if kind in CENTRED:
        return builder.fmul(d_rows, splat(builder, F32(CENTRED[kind]), d_rows.type.count))
    return None


class TileOperands(NamedTuple):
    """A tile intrinsic's arrays and first output / activation row, in LLVM IR."""

    blocks: Arr2D  # the weights' blocks (kernels' layout)
    xq: Arr2D  # int8 activations (T, K)
    xd: Arr2D  # their block scales (K / 32, T)
    xsum: Arr2D  # the integer sums of their 16-input halves of blocks (K / 16, T)
    n0: ir.Value
    t0: ir.Value


def int8_tile(
    outputs: int,
    emitter: Callable[[ir.IRBuilder, TileOperands], Callable[[int], list[ir.Value]]],
    kinds: tuple[int, ...] = tuple(SHAPES),
) -> Any:
    """Intrinsic (kind, blocks, n0, xq, xd, xsum, t0) -> UniTuple(float32, outputs): the values
    ``emitter(builder, operands)(kind)`` emits for the block kind held by ``kind`` (a variant per
    kind of ``kinds``: by default every kind the kernels read, Q5_K as Q5_1)."""

    @intrinsic  # type: ignore[misc]
    def int8_dot(
        typingctx: Any, kind: Any, blocks: Any, n0: Any, xq: Any, xd: Any, xsum: Any, t0: Any
    ) -> Any:
        sig = types.UniTuple(types.float32, outputs)(kind, blocks, n0, xq, xd, xsum, t0)

        def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> ir.Value:
            require_int8()  # never emit the x86 intrinsics for a CPU without them
            blocks, xq, xd, xsum = (
                Arr2D(context, builder, sig.args[i], args[i]) for i in (1, 3, 4, 5)
            )
            emit = emitter(builder, TileOperands(blocks, xq, xd, xsum, args[2], args[6]))
            values = by_kind(builder, args[0], emit, kinds)
            return context.make_tuple(builder, sig.return_type, values)

        return sig, codegen

    return int8_dot
