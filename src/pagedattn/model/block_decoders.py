"""Block decoders in LLVM IR: every GGUF block format the kernels read, 32 inputs at a time.

A decoder is made once per block (one row's block at the kernels' loop position) and hands out
the block's inputs in groups of 32, as ``STEPS`` vectors of ``LANES`` float32 each, in input
order, so the matmul kernels meet every format in the same lane order
(:mod:`pagedattn.model.block_dot`). The 32-input formats (Q4_0, Q4_1, Q8_0, Q5_0, Q5_1, and the
Q5_K sub-blocks the loader turns into Q5_1 blocks, :mod:`pagedattn.model.block_repack`) are one
group, :func:`pagedattn.model.block_ir.decoded_block`. A Q4_K super-block in the kernels' layout
is eight groups, each a Q4_1 block of its scale ``d * sc`` and offset ``-(dmin * m)``; kernels
that walk its 32-input sub-blocks take one (:class:`~.q4_k.Q4KGroupTile` for a tile of a group's
rows).
Q6_K is a 256-input super-block (ggml ``ggml-common.h`` ``block_q6_K``; ``ggml-quants.c``
``dequantize_row_q6_K``; ``gguf.quants``' numpy code), eight groups whose scales are decoded
once per super-block, all sixteen at once in vector registers: 6-bit codes (low nibbles and 2
high bits) less 32, an int8 scale per 16 inputs and a trailing float16 ``d``:
``w = (d * scale) * q``, both products exact.

With AVX-512 (:func:`~pagedattn.kernels.target.has_wide_registers`), the only host-specific
code here: a Q4_0 / Q4_1 block's 16 possible weights are computed once, by the same ``fma``
(a Q5_0 / Q5_1 block's 32, as two tables of 16), and each input's weight is looked up by its
code (``vpermps``), and Q6_K's per-sub-block scales are splatted from a stack slot (broadcast
loads) rather than shuffled out of registers. The values are the same on every path; only the
instruction count differs.
"""

from __future__ import annotations

from llvmlite import ir

from pagedattn.kernels.simd_ir import I8, Arr2D, fma, mask, splat
from pagedattn.kernels.target import has_wide_registers
from pagedattn.model.block_ir import (
    LANES,
    LAYOUT,
    Q4_K,
    Q6_K_FIELDS,
    SHAPES,
    VF,
    block_place,
    block_ptr,
    decoded_block,
    float_at,
    half_at,
    q5_fields,
    scale_offset,
)
from pagedattn.model.decoder_lanes import (
    CODES16,
    V16I32,
    Decoder,
    Lanes,
    ints,
    looked_up,
    nibbles_looked_up,
)
from pagedattn.model.q4_k import Q4KSuperBlock, q4_k_sub

GROUP = 32  # inputs per group
_I64 = ir.IntType(64)


def decoder(
    builder: ir.IRBuilder,
    kind: int,
    blocks: Arr2D,
    row: ir.Value,
    block: ir.Value,
    sub: ir.Value | None = None,
    group: int | None = None,
) -> Decoder:
    """The decoder of block ``block`` of row ``row`` of ``blocks`` (the kernels' layout); of a
    Q4_K super-block's 32-input sub-block ``sub`` alone where given (``group``: the matrix's
    rows per group where the caller knows it, :func:`~.block_ir.block_place`)."""
    size = SHAPES[kind][1]
    if kind == Q4_K:
        place = block_place(builder, blocks, row, block, size, group)
        return Q4KSuperBlock(builder, place) if sub is None else q4_k_sub(builder, place, sub)
    at = block_ptr(builder, blocks, row, block, size)
    if kind == 7:
        return _Q6K(builder, at)
    return _Simple(builder, kind, at)


def prefetch_offsets(kind: int) -> range:
    """Byte offsets within a block worth one prefetch each (one per 64-byte line)."""
    return range(0, SHAPES[kind][1], 64)


class _Simple:
    groups = 1

    def __init__(self, builder: ir.IRBuilder, kind: int, block: ir.Value) -> None:
        self._builder, self._kind, self._block = builder, kind, block

    def group(self, g: int) -> list[ir.Value]:
        if self._kind in (0, 1) and has_wide_registers():
            return _looked_up_nibbles(self._builder, self._kind, self._block)
        if self._kind in (3, 4) and has_wide_registers():
            return _looked_up_q5(self._builder, self._kind, self._block)
        return decoded_block(self._builder, self._kind, self._block)


class _Bytes:
    """16-byte runs of a block as <16 x i8> or widened to <16 x i32>, each loaded once."""

    def __init__(self, builder: ir.IRBuilder, block: ir.Value) -> None:
        self._builder, self._block = builder, block
        self._raw: dict[tuple[int, int], ir.Value] = {}  # (offset, count) -> <count x i8>
        self._widened: dict[tuple[int, bool], ir.Value] = {}  # (offset, signed) -> <16 x i32>

    def raw(self, offset: int, count: int = LANES) -> ir.Value:
        """``count`` bytes from ``offset`` as <count x i8>."""
        key = (offset, count)
        if key not in self._raw:
            b = self._builder
            ptr = b.gep(self._block, [ir.Constant(_I64, offset)])
            ty = ir.VectorType(I8, count)
            self._raw[key] = b.load(b.bitcast(ptr, ty.as_pointer()), align=1)
        return self._raw[key]

    def at(self, offset: int, signed: bool = False) -> ir.Value:
        """Bytes ``offset ..`` widened (sign- or zero-extended) to <16 x i32>."""
        key = (offset, signed)
        if key not in self._widened:
            b = self._builder
            raw = self.raw(offset)
            self._widened[key] = b.sext(raw, V16I32) if signed else b.zext(raw, V16I32)
        return self._widened[key]


def _byte_splat(value: int) -> ir.Constant:
    return ir.Constant(ir.VectorType(I8, GROUP), [value] * GROUP)


_CODES16_LESS_8 = ir.Constant(VF, [float(q - 8) for q in range(LANES)])


def _looked_up_nibbles(builder: ir.IRBuilder, kind: int, block: ir.Value) -> list[ir.Value]:
    """A Q4_0 / Q4_1 block's 32 weights with AVX-512: its 16 possible weights computed once,
    by the fma :func:`~pagedattn.model.block_ir.decoded_block` applies to each input, then
    each input's looked up by its code (:func:`~.decoder_lanes.nibbles_looked_up`)."""
    d, m = scale_offset(builder, kind, block)
    if kind == 0:  # d * (code - 8): the same correctly rounded value as fma(d, code, -8 * d)
        table = builder.fmul(splat(builder, d, LANES), _CODES16_LESS_8)
    else:
        table = fma(builder, splat(builder, d, LANES), CODES16, splat(builder, m, LANES))
    return nibbles_looked_up(
        builder, table, builder.gep(block, [ir.Constant(_I64, LAYOUT[kind][1])])
    )


_CODES16_LESS_16 = ir.Constant(VF, [float(q - 16) for q in range(LANES)])
_CODES16_PLUS_16 = ir.Constant(VF, [float(q + 16) for q in range(LANES)])


def _looked_up_q5(builder: ir.IRBuilder, kind: int, block: ir.Value) -> list[ir.Value]:
    """A Q5_0 / Q5_1 block's 32 weights with AVX-512: the 16 weights of the codes without
    their fifth bit and the 16 with it, computed once by the operations
    :func:`~pagedattn.model.block_ir.decoded_block` applies to each input (Q5_0's
    ``d * (code - 16)``, Q5_1's ``fma(d, code, m)``), then each input's looked up in one table
    or the other by its low nibble, as its bit of ``qh`` says (byte j of the codes holds input
    j's low nibble and input 16 + j's; bit j of ``qh`` is input j's fifth bit)."""
    d = splat(builder, float_at(builder, block, 0), LANES)
    if kind == 3:
        tables = (builder.fmul(d, _CODES16_LESS_16), builder.fmul(d, CODES16))
    else:
        m = splat(builder, float_at(builder, block, 4), LANES)
        tables = (fma(builder, d, CODES16, m), fma(builder, d, _CODES16_PLUS_16, m))
    qh_v, codes = q5_fields(builder, kind, block)
    out = []
    for step, index in enumerate((codes, builder.lshr(codes, ints([4] * LANES)))):
        bits = ints(
            [(1 << j) - (1 << 32 if j == 31 else 0) for j in range(16 * step, 16 * step + 16)]
        )
        fifth = builder.icmp_unsigned("!=", builder.and_(qh_v, bits), ints([0] * LANES))
        low, high = (looked_up(builder, table, index) for table in tables)
        out.append(builder.select(fifth, high, low))
    return out


class _Q6K:
    """Q6_K: ql[128], qh[64], int8 scales[16], then float16 d."""

    groups = 8

    def __init__(self, builder: ir.IRBuilder, block: ir.Value) -> None:
        b = self._builder = builder
        self._bytes = _Bytes(builder, block)
        _, _, scales_at, d_at = Q6_K_FIELDS
        d = splat(b, half_at(b, block, d_at), LANES)
        scale = b.fmul(d, b.sitofp(self._bytes.at(scales_at, signed=True), VF))  # d * scale
        self._lanes = Lanes(b, [scale])

    def group(self, g: int) -> list[ir.Value]:
        # group g = 32 * g.. of the super-block: half h = g // 4 of 128 inputs, quarter s = g % 4:
        # low (s < 2) or high nibble of ql[64 h + 32 (s % 2) + l], bits 2 s of qh[32 h + l]
        b = self._builder
        h, s = divmod(g, 4)
        out = []
        # the group's 32 codes assembled in bytes (one op per 32, where i32 lanes take two
        # per 16 on AVX2), then widened: the same integers
        low = self._bytes.raw(64 * h + 32 * (s % 2), GROUP)
        nib = b.lshr(low, _byte_splat(4)) if s >= 2 else b.and_(low, _byte_splat(15))
        qh = self._bytes.raw(Q6_K_FIELDS[1] + 32 * h, GROUP)
        top = b.shl(b.and_(b.lshr(qh, _byte_splat(2 * s)), _byte_splat(3)), _byte_splat(4))
        codes = b.sub(b.or_(nib, top), _byte_splat(32))  # in [-32, 31]
        for half in range(GROUP // LANES):
            code = b.shuffle_vector(codes, codes, mask(range(LANES * half, LANES * (half + 1))))
            out.append(b.fmul(self._lanes.splat(2 * g + half), b.sitofp(code, VF)))
        return out
