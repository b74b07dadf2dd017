"""Q4_K in the kernels' layout: its fields' addresses and its decoders.

Q4_K (ggml ``block_q4_K``) is most of a Q4_K_M file. The loader keeps its 256-input
super-blocks compact (:func:`~pagedattn.model.block_repack.repack_blocks`, 19 bytes per 32
inputs): float32 ``d`` and ``dmin``, the eight sub-blocks' 6-bit scales and minimums unpacked
to bytes, then each 32-input sub-block's codes in Q4_1's order (byte j: input j in the low
nibble, input 16 + j in the high). In a matrix stored in groups of four rows, a group's rows
lie field by field, element by element (:func:`q4_k_at`), so one sub-block's codes of the
four rows are 64 bytes side by side and a field of the group is one vector load. Sub-block g
of a row is then a Q4_1 block of scale ``d * sc[g]`` and offset ``-(dmin * m[g])``, both
products exact: ``fma(d * sc, q, -(dmin * m))`` rounds once, as ``dequantize_row_q4_K``'s
``(d * sc) * q - dmin * m`` does, the same weight.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

from pagedattn.kernels.simd_ir import F32, I8, I32, Arr2D, fma, mask, prefetch, splat
from pagedattn.kernels.target import has_wide_registers
from pagedattn.model.block_ir import (
    LANES,
    Q4_K,
    ROW_GROUP,
    SHAPES,
    Place,
    block_place,
    decoded_block,
)
from pagedattn.model.decoder_lanes import CODES16, Decoder, Lanes, hide, nibbles_looked_up

# field -> (byte offset in a row's 152 per super-block, bytes per sub-block element)
Q4_K_FIELDS = {"d": (0, 4), "dmin": (4, 4), "sc": (8, 1), "m": (16, 1), "codes": (24, 16)}
SIZE = SHAPES[Q4_K][1]  # bytes per row and super-block
SUBS = 8  # Q4_K's 32-input sub-blocks per super-block
FIELDS = 2 * SUBS * ROW_GROUP  # a group's scales and offsets of one super-block


def sub_block_fields(
    b: ir.IRBuilder, d: ir.Value, dmin: ir.Value, sc: ir.Value, m: ir.Value
) -> tuple[ir.Value, ir.Value]:
    """Sub-blocks' scales ``d * sc`` and offsets ``-(dmin * m)`` (float32 scalars or vectors of
    one shape; both products exact): the values every Q4_K reader here computes, in one order."""
    return b.fmul(d, sc), b.fneg(b.fmul(dmin, m))


def q4_k_at(builder: ir.IRBuilder, place: Place, field: str, j: int | ir.Value = 0) -> ir.Value:
    """Address (i8*) of element ``j`` (a sub-block; 0 for d and dmin) of a Q4_K ``field``
    (:data:`Q4_K_FIELDS`) of the row at ``place``: ``base + offset * group + (j * group +
    within) * element``."""
    offset, element = Q4_K_FIELDS[field]
    i64 = place.within.type
    index = builder.add(builder.mul(i64(j) if isinstance(j, int) else j, place.group), place.within)
    at = builder.add(builder.mul(place.group, i64(offset)), builder.mul(index, i64(element)))
    return builder.gep(place.base, [at])


class Q4KSuperBlock:
    """Q4_K in the kernels' layout (:data:`Q4_K_FIELDS`): sub-block g is a Q4_1
    block whose scale ``d * sc[g]`` and offset ``-(dmin * m[g])`` are computed here once per
    super-block, the float32 values ``dequantize_row_q4_K`` computes (both products exact)."""

    groups = 8

    def __init__(self, builder: ir.IRBuilder, place: Place) -> None:
        b = self._builder = builder
        self._place = place
        d, dmin = (
            b.load(b.bitcast(q4_k_at(b, place, f), F32.as_pointer()), align=1)
            for f in ("d", "dmin")
        )
        v8 = ir.VectorType(F32, 8)
        fields = []
        for name in ("sc", "m"):
            values = ir.Constant(ir.VectorType(I8, 8), [0] * 8)
            for g in range(8):
                values = b.insert_element(values, b.load(q4_k_at(b, place, name, g)), I32(g))
            fields.append(b.uitofp(values, v8))
        self._lanes = Lanes(
            b, list(sub_block_fields(b, splat(b, d, 8), splat(b, dmin, 8), *fields))
        )

    def group(self, g: int) -> list[ir.Value]:
        b, place = self._builder, self._place
        scale, offset = self._lanes.splat(g), self._lanes.splat(8 + g)
        return sub_block_weights(b, place.base, scale, offset, q4_k_at(b, place, "codes", g))


def sub_block_weights(
    b: ir.IRBuilder, base: ir.Value, scale: ir.Value, offset: ir.Value, codes: ir.Value
) -> list[ir.Value]:
    """The 32 weights of a Q4_K sub-block from its scale and offset (splatted to LANES) and
    its 16 code bytes at ``codes`` (i8*, Q4_1's order)."""
    if has_wide_registers():
        return nibbles_looked_up(b, fma(b, scale, CODES16, offset), codes)
    lane0 = b.extract_element(scale, I32(0)), b.extract_element(offset, I32(0))
    return decoded_block(b, 1, base, (lane0[0], lane0[1], codes))


class Q4KSub:
    """One 32-input sub-block of a Q4_K super-block (:class:`Q4KSuperBlock`'s group ``sub``,
    the same values) from its scale and offset (splatted to LANES) and i8* at its codes, for
    kernels that walk sub-blocks."""

    groups = 1

    def __init__(
        self, builder: ir.IRBuilder, base: ir.Value, fields: tuple[ir.Value, ir.Value, ir.Value]
    ) -> None:
        self._builder, self._base, self._fields = builder, base, fields

    def group(self, g: int) -> list[ir.Value]:
        return sub_block_weights(self._builder, self._base, *self._fields)


def q4_k_sub(builder: ir.IRBuilder, place: Place, sub: ir.Value) -> Q4KSub:
    b = builder
    d, dmin = (
        b.load(b.bitcast(q4_k_at(b, place, f), F32.as_pointer()), align=1) for f in ("d", "dmin")
    )
    sc, m = (b.uitofp(b.load(q4_k_at(b, place, f, sub)), F32) for f in ("sc", "m"))
    scale, offset = (splat(b, v, LANES) for v in sub_block_fields(b, d, dmin, sc, m))
    return Q4KSub(b, place.base, (scale, offset, q4_k_at(b, place, "codes", sub)))


class Q4KGroupTile:
    """A register tile of ``rows`` rows of one group of a grouped Q4_K matrix (its first row
    ``first``, a multiple of ``rows``), for a kernel that walks 32-input sub-blocks: the
    decoders of each step's sub-block (:meth:`step`).

    The group's scales and offsets of a super-block, all ROW_GROUP rows and eight sub-blocks,
    are a few vector operations (each field's values lie side by side, :func:`q4_k_at`), kept
    in a stack slot LLVM may not see into (as :class:`Lanes`), so that each splat after is a
    broadcast load. The slot holds two super-blocks': each is filled a super-block before its
    first use, so no load waits on the stores. The same float32 values as :func:`q4_k_sub`
    computes row by row."""

    def __init__(
        self, builder: ir.IRBuilder, blocks: Arr2D, first: ir.Value, rows: int, count: ir.Value
    ) -> None:
        """Made before the kernel's loop over the ``count`` super-blocks of a row: fills
        super-block 0's fields there."""
        self._builder, self._blocks, self._first, self._rows = builder, blocks, first, rows
        self._count = count
        self._slot = cgutils.alloca_once(builder, ir.ArrayType(F32, 2 * FIELDS))
        i64 = first.type
        self._fill(self._place(first, i64(0)), i64(0))

    def _place(self, row: ir.Value, super_block: ir.Value) -> Place:
        return block_place(self._builder, self._blocks, row, super_block, SIZE, ROW_GROUP)

    def _fill(self, place: Place, half: ir.Value) -> None:
        """The fields of the super-block at ``place`` (any row of its group) into half
        ``half`` (0 or 1, i64) of the slot."""
        b = self._builder
        first = place._replace(within=place.within.type(0))
        count = SUBS * ROW_GROUP
        floats = ir.VectorType(F32, count)
        spread = mask([r for _ in range(SUBS) for r in range(ROW_GROUP)])  # [sub][row]

        def loaded(field: str, ty: ir.Type, lanes: int) -> ir.Value:
            ptr = b.bitcast(q4_k_at(b, first, field), ir.VectorType(ty, lanes).as_pointer())
            return b.load(ptr, align=1)

        d, dmin = (loaded(f, F32, ROW_GROUP) for f in ("d", "dmin"))
        sc, m = (b.uitofp(loaded(f, I8, count), floats) for f in ("sc", "m"))
        spread_d, spread_dmin = (b.shuffle_vector(v, v, spread) for v in (d, dmin))
        at = b.mul(half, half.type(FIELDS))
        for i, value in enumerate(sub_block_fields(b, spread_d, spread_dmin, sc, m)):
            ptr = b.gep(self._slot, [I32(0), b.add(at, at.type(i * count))])
            b.store(value, b.bitcast(ptr, floats.as_pointer()), align=4)
        hide(b, self._slot)

    def step(self, super_block: ir.Value, sub: ir.Value) -> list[Decoder]:
        """The decoders of sub-block ``sub`` of super-block ``super_block`` of the tile's rows;
        on the way, the group two tiles ahead prefetched (an eighth of its super-block per
        step) and, at sub-block 0, the next super-block's fields filled."""
        b, i64 = self._builder, sub.type
        ahead = self._place(b.add(self._first, i64(2 * self._rows)), super_block).base
        share = b.mul(sub, i64(ROW_GROUP * SIZE // SUBS))
        for line in (0, 64):
            prefetch(b, b.gep(ahead, [b.add(share, i64(line))]))
        following = b.add(super_block, i64(1))
        now = b.and_(b.icmp_signed("==", sub, i64(0)), b.icmp_signed("<", following, self._count))
        with b.if_then(now, likely=False):
            self._fill(self._place(self._first, following), b.and_(following, i64(1)))
        place = self._place(self._first, super_block)
        half = b.mul(b.and_(super_block, i64(1)), i64(FIELDS))
        tile: list[Decoder] = []
        for r in range(self._rows):
            at = place._replace(within=b.add(place.within, i64(r)))
            index = b.add(half, b.add(b.mul(sub, i64(ROW_GROUP)), at.within))
            scale, offset = (
                splat(b, b.load(b.gep(self._slot, [I32(0), b.add(index, i64(skip))])), LANES)
                for skip in (0, SUBS * ROW_GROUP)
            )
            tile.append(Q4KSub(b, place.base, (scale, offset, q4_k_at(b, at, "codes", sub))))
        return tile
