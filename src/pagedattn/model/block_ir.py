"""LLVM IR pieces of the GGUF block formats, shared by the float and the int8 matmul kernels.

The 32-input block formats are ggml's ``block_q4_0``, ``block_q4_1``, ``block_q8_0``,
``block_q5_0`` and ``block_q5_1`` (``ggml-common.h``): a float16 scale, Q4_1's / Q5_1's float16
minimum, Q5's 32 high bits, then the codes (4-bit pairs, or int8). The kernels read them with
those header fields widened to float32 at load (:mod:`pagedattn.model.block_repack`; sizes in
:data:`SHAPES`, the file's in :data:`FILE_SHAPES`); Q5_K super-blocks become eight Q5_1
blocks there (:data:`READ_AS`), Q4_K's a compact layout of their own
(:mod:`pagedattn.model.q4_k`). The 256-input Q6_K super-block is
:mod:`pagedattn.model.block_decoders`', read as in the file. A kind is the runtime integer of
:data:`KINDS`; an intrinsic that serves several kinds emits one variant per kind behind one
switch on it (:func:`by_kind`), outside its loop over blocks, for the kinds a kernel is
compiled for: those a :func:`kind_set` argument names in its type, so a model's kernels hold
the variants of its own block types only (a kernel of every kind took four times as long to
compile as one of one kind). Nothing here names a host-specific instruction: the float16
fields the kernels still read (Q6_K's) widen through
:func:`pagedattn.kernels.half_ir.widen_half_bits`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import numpy as np
from llvmlite import ir
from numba.core import cgutils

from pagedattn.kernels.half_ir import widen_half_bits
from pagedattn.kernels.simd_ir import F32, I8, I32, Arr2D, fma, mask, splat

BLOCK = 32
LANES = 16  # float32 accumulator lanes per (output, input row): one zmm, or two ymm
STEPS = BLOCK // LANES  # accumulator steps per block

# GGUF type name -> kind (the runtime integer the kernels switch on)
KINDS = {"Q4_0": 0, "Q4_1": 1, "Q8_0": 2, "Q5_0": 3, "Q5_1": 4, "Q4_K": 5, "Q5_K": 6, "Q6_K": 7}
# kind -> (inputs per block, bytes per block) in the file, as ggml.h's type traits
FILE_SHAPES = {0: (32, 18), 1: (32, 20), 2: (32, 34), 3: (32, 22), 4: (32, 24)}
FILE_SHAPES |= {5: (256, 144), 6: (256, 176), 7: (256, 210)}
# kind -> float16 header fields (scale, minimum) that the kernels' layout holds as float32
WIDENED_FIELDS = {0: 1, 1: 2, 2: 1, 3: 1, 4: 2}
# Q5_K -> the kind whose blocks the kernels read it as: each 32-input sub-block is a Q5_1
# block with float32 fields d * sc and -(dmin * m) (repack_blocks), the same weights bit for bit
READ_AS = {6: 4}
Q4_K = 5  # in a compact layout of its own (pagedattn.model.q4_k)
# kind -> (inputs per block, bytes per block) as the kernels read them: the 32-input formats
# with their float16 header fields widened to float32 at load (repack_blocks), Q4_K as above
# (19 bytes per 32 inputs, where Q4_1 blocks of its sub-blocks took 24), Q6_K as in the file
# (its scales are decoded once per 256 inputs)
SHAPES = {
    kind: (inputs, size + 2 * WIDENED_FIELDS.get(kind, 0))
    for kind, (inputs, size) in FILE_SHAPES.items()
    if kind not in READ_AS
} | {Q4_K: (256, 152)}
NAMES = {kind: name for name, kind in KINDS.items()}
Q5_KINDS = (3, 4)  # Q5_0 / Q5_1: 32 fifth bits between the header fields and the codes
MINIMUM_KINDS = (1, 4)  # Q4_1 / Q5_1: a float32 minimum (the offset) after the scale
CENTRED = {0: -8.0, 3: -16.0}  # Q4_0 / Q5_0: offset = this * scale (codes stored + 8 / + 16)
# kind -> (bytes per block, bytes before the codes, 4-bit codes?) of the 32-input formats in
# the kernels' layout (Q5_0 / Q5_1: nibbles, their fifth bits in the 4 bytes before them)
LAYOUT = {
    kind: (SHAPES[kind][1], 4 * fields + (4 if kind in Q5_KINDS else 0), kind != KINDS["Q8_0"])
    for kind, fields in WIDENED_FIELDS.items()
}

# byte offsets of a Q6_K super-block's fields (ggml ``block_q6_K``): ql[128] (low four bits),
# qh[64] (two high bits), int8 scales[16] (one per 16 inputs), float16 d
Q6_K_FIELDS = (0, 128, 192, 208)

VF = ir.VectorType(F32, LANES)

# Rows interleaved by groups: in a matrix whose row count is a multiple of ROW_GROUP, block
# ``b`` of rows ``4g .. 4g + 3`` lie side by side (row ``4g``'s, then ``4g + 1``'s, ...), so a
# register tile of those rows reads one stream of bytes (repack_blocks lays them out). Rows of
# other row counts stay one after the other.
ROW_GROUP = 4


def interleaved(rows: int) -> bool:
    """Whether a matrix of ``rows`` rows is stored in groups of :data:`ROW_GROUP` rows."""
    return rows % ROW_GROUP == 0


class Place(NamedTuple):
    """Where a row's block lies: the block of its group's rows starts at ``base`` (i8*), the
    row is ``within`` of the group's ``group`` rows (ROW_GROUP, or 1 where the matrix is not
    stored in groups; i64 values)."""

    base: ir.Value
    within: ir.Value
    group: ir.Value


def _grouped(builder: ir.IRBuilder, blocks: Arr2D) -> ir.Value:
    """i1: whether ``blocks`` is stored in :data:`ROW_GROUP`-row groups (:func:`interleaved`)."""
    i64 = blocks.shape[0].type
    return builder.icmp_signed("==", builder.and_(blocks.shape[0], i64(ROW_GROUP - 1)), i64(0))


def row_group(builder: ir.IRBuilder, blocks: Arr2D) -> ir.Value:
    """The rows per group of ``blocks`` (i64): :data:`ROW_GROUP` where the row count allows
    (:func:`interleaved`), else 1."""
    i64 = blocks.shape[0].type
    return builder.select(_grouped(builder, blocks), i64(ROW_GROUP), i64(1))


def block_place(
    builder: ir.IRBuilder,
    blocks: Arr2D,
    row: ir.Value,
    block: ir.Value,
    size: int,
    group: int | None = None,
) -> Place:
    """The :class:`Place` of block ``block`` of row ``row`` in ``blocks`` (the kernels' layout:
    :data:`ROW_GROUP`-row groups where the row count allows, :func:`interleaved`); ``group``:
    the matrix's :func:`row_group` where the caller knows it."""
    i64 = row.type
    rows = row_group(builder, blocks) if group is None else i64(group)
    within = builder.and_(row, builder.sub(rows, i64(1)))
    base = blocks.ptr(
        builder, builder.sub(row, within), builder.mul(block, builder.mul(rows, i64(size)))
    )
    return Place(base, within, rows)


def block_ptr(
    builder: ir.IRBuilder, blocks: Arr2D, row: ir.Value, block: ir.Value, size: int
) -> ir.Value:
    """Address (i8*) of block ``block`` of row ``row`` in ``blocks``: its group's rows' blocks
    side by side (:func:`block_place`; Q4_K's fields lie apart,
    :func:`~pagedattn.model.q4_k.q4_k_at`). The same address as ``block_place``'s base plus
    ``within`` blocks, in the form LLVM's loop strength reduction turns into one pointer
    increment per block."""
    i64 = row.type
    grouped = _grouped(builder, blocks)
    within = builder.select(grouped, builder.and_(row, i64(ROW_GROUP - 1)), i64(0))
    per_block = builder.select(grouped, i64(ROW_GROUP), i64(1))
    slot = builder.add(builder.mul(block, per_block), within)
    return blocks.ptr(builder, builder.sub(row, within), builder.mul(slot, i64(size)))


def super_block(builder: ir.IRBuilder, b: ir.Value, subs: int) -> tuple[ir.Value, ir.Value]:
    """The super-block and the sub-block within it of 32-input block ``b`` (``subs`` per
    super-block, a power of two)."""
    assert subs & (subs - 1) == 0
    i64 = b.type
    return builder.lshr(b, i64(subs.bit_length() - 1)), builder.and_(b, i64(subs - 1))


#: with ``PAGEDATTN_ALL_BLOCK_KINDS=1`` every kind set is the set of all kinds: one compiled
#: kernel serves every model (the test suite's setting: it meets most kinds and combinations)
ALL_KINDS_ONLY = os.environ.get("PAGEDATTN_ALL_BLOCK_KINDS") == "1"


def kind_set(kinds: Iterable[int]) -> np.ndarray:
    """The kind set ``kinds`` as a kernel argument: a zero-length read-only array whose record
    dtype has one field per kind, named by its GGUF type (``Q4_K``, ``Q6_K``). Its Numba type
    is what varies, so a kernel is compiled once per set, with a variant for each kind in it
    (:func:`kinds_of`); the kinds a call reads must be in the set. Every kind's variant is the
    same code in every set, so a set changes what is compiled, never a result's bits."""
    chosen = frozenset(kinds)
    if not chosen or not chosen <= set(SHAPES):
        raise ValueError(f"a kind set names block kinds of {sorted(SHAPES)}, got {sorted(chosen)}")
    return _kind_set(frozenset(SHAPES) if ALL_KINDS_ONLY else chosen)


@functools.cache
def _kind_set(kinds: frozenset[int]) -> np.ndarray:
    names = np.dtype([(NAMES[k], np.uint8) for k in sorted(kinds)])
    marker = np.zeros(0, names)
    marker.flags.writeable = False
    return marker


def kinds_of(kind_set_type: Any) -> tuple[int, ...]:
    """The kinds (ascending) named by the Numba type of a :func:`kind_set` argument."""
    return tuple(sorted(KINDS[name] for name in kind_set_type.dtype.fields))


_I16 = ir.IntType(16)
_I64 = ir.IntType(64)


def half_at(builder: ir.IRBuilder, block: ir.Value, offset: int) -> ir.Value:
    """The float16 at byte ``offset`` of ``block`` (i8*), exactly widened to float32."""
    ptr = builder.gep(block, [ir.Constant(_I64, offset)])
    return widen_half_bits(builder, builder.load(builder.bitcast(ptr, _I16.as_pointer()), align=1))


def float_at(builder: ir.IRBuilder, block: ir.Value, offset: int) -> ir.Value:
    """The float32 at byte ``offset`` of ``block`` (i8*): a widened header field."""
    ptr = builder.gep(block, [ir.Constant(_I64, offset)])
    return builder.load(builder.bitcast(ptr, F32.as_pointer()), align=1)


def scale_offset(builder: ir.IRBuilder, kind: int, block: ir.Value) -> tuple[ir.Value, ir.Value]:
    """A 32-input block's float32 scale and offset, read from its own bytes (``block``: i8* at
    its first byte, the kernels' layout): the scale, then Q4_1's / Q5_1's minimum, Q4_0's
    ``-8 * scale`` or Q5_0's ``-16 * scale`` (codes stored + 8 / + 16; exact) or Q8_0's 0."""
    d = float_at(builder, block, 0)
    if kind in MINIMUM_KINDS:
        return d, float_at(builder, block, 4)
    if kind in CENTRED:
        return d, builder.fmul(d, F32(CENTRED[kind]))
    return d, F32(0.0)


def _part(builder: ir.IRBuilder, v: ir.Value, i: int) -> ir.Value:
    """Elements ``[i * LANES, (i + 1) * LANES)`` of vector ``v``."""
    return builder.shuffle_vector(v, v, mask(range(i * LANES, (i + 1) * LANES)))


def decoded_block(
    builder: ir.IRBuilder,
    kind: int,
    block: ir.Value,
    fields: tuple[ir.Value, ir.Value, ir.Value] | None = None,
) -> list[ir.Value]:
    """The 32 weights of the block at ``block`` (i8*) as STEPS <LANES x float>:
    fma(scale, code, offset) per input (the values of :func:`scale_offset`, splatted; or
    ``fields``' scale, offset and i8* at the 16 code bytes of a Q4_K sub-block, read as
    Q4_1's)."""
    if kind in (3, 4):
        return _decoded_q5(builder, kind, block)
    if fields is None:
        d_scalar, m_scalar = scale_offset(builder, kind, block)
        codes = builder.gep(block, [ir.Constant(_I64, LAYOUT[kind][1])])
    else:
        d_scalar, m_scalar, codes = fields
    d = splat(builder, d_scalar, LANES)
    m = splat(builder, m_scalar, LANES)
    if LAYOUT[kind][2]:
        # bytes j and 8 + j hold inputs j, 8 + j (low nibbles) and 16 + j, 24 + j (high): widen
        # each 8-byte half to int32 lanes (vpmovzxbd from memory), then mask and shift there
        i32x8 = ir.VectorType(I32, 8)
        halves = []
        for half in range(2):
            ptr = builder.gep(codes, [ir.Constant(_I64, 8 * half)])
            raw = builder.load(builder.bitcast(ptr, ir.VectorType(I8, 8).as_pointer()), align=1)
            halves.append(builder.zext(raw, i32x8))
        low = [builder.and_(h, ir.Constant(i32x8, [15] * 8)) for h in halves]
        high = [builder.lshr(h, ir.Constant(i32x8, [4] * 8)) for h in halves]
        steps = [builder.shuffle_vector(a, b, mask(range(LANES))) for a, b in (low, high)]
    else:
        raw = builder.load(builder.bitcast(codes, ir.VectorType(I8, 32).as_pointer()), align=1)
        steps = [
            builder.sext(_part(builder, raw, i), ir.VectorType(I32, LANES)) for i in range(STEPS)
        ]
    # codes are at most 255 in magnitude: the signed conversion is exact
    return [fma(builder, d, builder.sitofp(c, VF), m) for c in steps]


def q5_fields(builder: ir.IRBuilder, kind: int, block: ir.Value) -> tuple[ir.Value, ir.Value]:
    """A Q5_0 / Q5_1 block's (kernels' layout) high bits ``qh`` (little-endian uint32) in every
    lane of a <16 x i32>, and its 16 code bytes zero-extended to <16 x i32> (byte j: input j's
    low nibble, input 16 + j's high one)."""
    codes = LAYOUT[kind][1]
    qh_ptr = builder.bitcast(builder.gep(block, [ir.Constant(_I64, codes - 4)]), I32.as_pointer())
    one = ir.Constant(ir.VectorType(I32, 1), ir.Undefined)
    qh = builder.insert_element(one, builder.load(qh_ptr, align=1), I32(0))
    qh_v = builder.shuffle_vector(qh, one, mask([0] * LANES))
    ptr = builder.gep(block, [ir.Constant(_I64, codes)])
    raw = builder.load(builder.bitcast(ptr, ir.VectorType(I8, LANES).as_pointer()), align=1)
    return qh_v, builder.zext(raw, ir.VectorType(I32, LANES))


def _decoded_q5(builder: ir.IRBuilder, kind: int, block: ir.Value) -> list[ir.Value]:
    """Q5_0 (``d * (code - 16)``) or Q5_1 (``fma(d, code, m)``): the code of input j is the
    low (j < 16) or high nibble of byte ``j % 16`` of the codes, plus bit j of the
    little-endian uint32 ``qh`` as its fifth bit (ggml ``dequantize_row_q5_0`` / ``_q5_1``;
    ``d * code`` is exact, so both match ``gguf``'s float32 operations)."""
    i32x16 = ir.VectorType(I32, LANES)
    qh_v, wide = q5_fields(builder, kind, block)
    nibbles = (
        builder.and_(wide, ir.Constant(i32x16, [15] * LANES)),
        builder.lshr(wide, ir.Constant(i32x16, [4] * LANES)),
    )
    d_scalar = float_at(builder, block, 0)
    d = splat(builder, d_scalar, LANES)
    out = []
    for step, low in enumerate(nibbles):
        # bit j of qh to bit 4: (qh >> j) << 4 & 16, for the inputs j of this step
        bits = builder.lshr(qh_v, ir.Constant(i32x16, list(range(16 * step, 16 * step + 16))))
        high = builder.and_(
            builder.shl(bits, ir.Constant(i32x16, [4] * LANES)), ir.Constant(i32x16, [16] * LANES)
        )
        code = builder.or_(low, high)
        if kind == 3:
            centred = builder.sub(code, ir.Constant(i32x16, [16] * LANES))
            out.append(builder.fmul(d, builder.sitofp(centred, VF)))
        else:
            m = splat(builder, float_at(builder, block, 4), LANES)
            out.append(fma(builder, d, builder.sitofp(code, VF), m))
    return out


def by_kind(
    builder: ir.IRBuilder,
    kind: ir.Value,
    emit: Callable[[int], list[ir.Value]],
    kinds: tuple[int, ...] = tuple(SHAPES),
) -> list[ir.Value]:
    """``emit(k)`` for the block kind held by the runtime integer ``kind``, one branch per
    entry of ``kinds`` (the last one also takes any other value), the results merged through
    stack slots (which LLVM turns into phis). ``emit`` returns the same types for every kind;
    any other run-time integer with a known set of values dispatches the same way."""
    slots: list[ir.Value] = []

    def run(k: int) -> None:
        values = emit(k)
        if not slots:
            slots.extend(cgutils.alloca_once(builder, v.type) for v in values)
        for slot, value in zip(slots, values, strict=True):
            builder.store(value, slot)

    def chain(rest: tuple[int, ...]) -> None:
        if len(rest) == 1:
            run(rest[0])
            return
        with builder.if_else(builder.icmp_signed("==", kind, kind.type(rest[0]))) as (this, other):
            with this:
                run(rest[0])
            with other:
                chain(rest[1:])

    chain(kinds)
    return [builder.load(s) for s in slots]
