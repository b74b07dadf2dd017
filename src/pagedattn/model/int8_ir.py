"""The integer block sums of the int8-activation matmuls, one per x86 instruction set.

A register tile of ``rows`` output rows is held as vectors of ``4 * rows`` int32 lanes, lane
``4 r + g`` for row ``r`` and lane group ``g`` (0-3): a 32-input block's codes are two byte
vectors (:func:`pagedattn.model.int8_blocks.tile_codes`), ``lo`` with row ``r``'s inputs
``4g .. 4g + 3`` in lane ``4r + g`` and ``hi`` with its inputs ``16 + 4g .. 16 + 4g + 3``, so
each row fills one 128-bit lane and the block's 16 + 16 activation bytes meet it broadcast to
every row
(:func:`repeated`). The unsigned-by-signed byte products of a lane are summed four at a time
into its int32 (:func:`quads`); each instruction set computes exactly these sums, so the float
accumulation after them, and every result bit, is the same on all of them:

* ``avx2``: ``vpmaddubsw`` (byte pairs into int16, below saturation for these operands) and
  ``vpmaddwd`` by ones (int16 pairs into int32), on ymm;
* ``vnni-ymm``: ``vpdpbusd`` (AVX512_VNNI with AVX512VL, or AVX-VNNI) on ymm;
* ``zmm``: ``vpmaddubsw`` + ``vpmaddwd`` on zmm (AVX512BW), four rows per register;
* ``vnni-zmm``: ``vpdpbusd`` on zmm (AVX512_VNNI), four rows per register.

The path is chosen from the CPU Numba compiles for (:mod:`pagedattn.kernels.target`, which
asks LLVM), when the kernel is compiled: no other path's instructions are emitted, so a target
never meets an instruction it lacks (``NUMBA_CPU_NAME=haswell`` compiles the ``avx2`` path).
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

from pagedattn.kernels.simd_ir import I8, I32, mask
from pagedattn.kernels.target import (
    has_avx2,
    has_avx512bw,
    has_vnni_256,
    has_vnni_512,
    target_cpu,
)
from pagedattn.model.block_ir import KINDS

I16 = ir.IntType(16)
GROUPS = 4  # int32 lanes per row of a tile

# what each path computes a block's products with (README, bench output)
INSTRUCTIONS = {
    "avx2": "AVX2 vpmaddubsw + vpmaddwd on ymm",
    "vnni-ymm": "VNNI vpdpbusd on ymm",
    "zmm": "AVX512BW vpmaddubsw + vpmaddwd on zmm",
    "vnni-zmm": "AVX512_VNNI vpdpbusd on zmm",
}


def int8_path() -> str:
    """The path the target gets (a key of :data:`INSTRUCTIONS`); the target has AVX2."""
    if has_avx512bw():
        return "vnni-zmm" if has_vnni_512() else "zmm"
    return "vnni-ymm" if has_vnni_256() else "avx2"


def as_type(builder: ir.IRBuilder, value: ir.Value, element: ir.Type) -> ir.Value:
    """``value`` reinterpreted as a vector of ``element`` (same bytes)."""
    bits = value.type.count * _width(value.type.element)
    return builder.bitcast(value, ir.VectorType(element, bits // _width(element)))


def _width(element: ir.Type) -> int:
    return 32 if isinstance(element, ir.FloatType) else int(element.width)


def block_sums(builder: ir.IRBuilder, lane_sums: list[ir.Value]) -> ir.Value:
    """<rows * cols x i32>, lane ``r * cols + c``: the sum of the four lanes of row ``r`` in
    ``lane_sums[c]`` (cols = 1, 2 or a multiple of 4 vectors of <4 * rows x i32>), added within
    128-bit lanes (``vpunpck[lh]dq`` / ``[lh]qdq``, ``vpaddd``): integers, exact in any order."""
    rows = lane_sums[0].type.count // GROUPS

    def pick(a: ir.Value, b: ir.Value, at: list[int]) -> ir.Value:
        # per row r, lanes of a (0-3) and b (4-7) within its four
        n = a.type.count
        return builder.shuffle_vector(
            a, b, mask([(j // 4) * n + 4 * r + j % 4 for r in range(rows) for j in at])
        )

    def fold(a: ir.Value, b: ir.Value) -> ir.Value:  # [a0+a2, b0+b2, a1+a3, b1+b3] per row
        return builder.add(pick(a, b, [0, 4, 1, 5]), pick(a, b, [2, 6, 3, 7]))

    if len(lane_sums) > 4:  # fours of activation rows side by side: lane r * cols + c
        fours = [block_sums(builder, lane_sums[i : i + 4]) for i in range(0, len(lane_sums), 4)]
        joined = concat(builder, fours)
        cols = len(lane_sums)
        return builder.shuffle_vector(
            joined,
            joined,
            mask([(c // 4) * 4 * rows + 4 * r + c % 4 for r in range(rows) for c in range(cols)]),
        )
    if len(lane_sums) == 4:
        low, high = fold(*lane_sums[:2]), fold(*lane_sums[2:])
        return builder.add(pick(low, high, [0, 1, 4, 5]), pick(low, high, [2, 3, 6, 7]))
    if len(lane_sums) == 2:
        both = fold(*lane_sums)
        return builder.shuffle_vector(
            builder.add(both, builder.shuffle_vector(both, both, mask(_swap_halves(rows)))),
            both,
            mask([4 * r + j for r in range(rows) for j in range(2)]),
        )
    (one,) = lane_sums
    two = builder.add(one, builder.shuffle_vector(one, one, mask(_swap_halves(rows))))
    pairs = builder.add(two, builder.shuffle_vector(two, two, mask(_swap_neighbours(rows))))
    return builder.shuffle_vector(pairs, pairs, mask([4 * r for r in range(rows)]))


def _swap_halves(rows: int) -> list[int]:
    return [4 * r + (j + 2) % 4 for r in range(rows) for j in range(4)]


def _swap_neighbours(rows: int) -> list[int]:
    return [4 * r + (j ^ 1) for r in range(rows) for j in range(4)]


def repeated(builder: ir.IRBuilder, sixteen: ir.Value, rows: int) -> ir.Value:
    """<16 * rows x i8>: the 16 activation bytes ``sixteen`` once per row (vbroadcasti32x4)."""
    return builder.shuffle_vector(
        sixteen, sixteen, mask([j for _ in range(rows) for j in range(16)])
    )


def _x86(builder: ir.IRBuilder, name: str, ret: ir.Type, args: list[ir.Value]) -> ir.Value:
    fnty = ir.FunctionType(ret, [a.type for a in args])
    return builder.call(cgutils.get_or_insert_function(builder.module, fnty, name), args)


def abs_bytes(builder: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """|v| of a byte vector (``vpabsb``)."""
    name = f"llvm.abs.v{v.type.count}i8"
    return _x86(builder, name, v.type, [v, ir.IntType(1)(0)])


def signed_like(builder: ir.IRBuilder, codes: ir.Value, xq: ir.Value) -> ir.Value:
    """``codes`` negated where ``xq`` is negative (where ``xq`` is 0 the product with
    ``|xq|`` is 0 either way): ``vpsignb`` per ymm without AVX512BW (which has no ``vpsignb``
    on zmm), a masked negate with it."""
    count = codes.type.count
    if not has_avx512bw() and count % 32 == 0:
        v32 = ir.VectorType(I8, 32)
        parts = [
            _x86(
                builder,
                "llvm.x86.avx2.psign.b",
                v32,
                [builder.shuffle_vector(v, v, mask(range(i, i + 32))) for v in (codes, xq)],
            )
            for i in range(0, count, 32)
        ]
        return concat(builder, parts)
    zero = ir.Constant(codes.type, [0] * count)
    negative = builder.icmp_signed("<", xq, zero)
    return builder.select(negative, builder.sub(zero, codes), codes)


def concat(builder: ir.IRBuilder, parts: list[ir.Value]) -> ir.Value:
    """The vectors ``parts`` (one type, a power-of-two count of them) one after another."""
    while len(parts) > 1:
        n = parts[0].type.count
        parts = [
            builder.shuffle_vector(parts[i], parts[i + 1], mask(range(2 * n)))
            for i in range(0, len(parts), 2)
        ]
    return parts[0]


def _quads_register(builder: ir.IRBuilder, u: ir.Value, s: ir.Value, acc: ir.Value) -> ir.Value:
    """``acc`` + the lane sums of one register (32 or 64 bytes) of ``u`` times ``s``."""
    wide = u.type.count == 64
    lanes = acc.type
    if has_vnni_512() if wide else has_vnni_256():
        name = "llvm.x86.avx512.vpdpbusd." + ("512" if wide else "256")
        return _x86(builder, name, lanes, [acc, as_type(builder, u, I32), as_type(builder, s, I32)])
    words = ir.VectorType(I16, lanes.count * 2)
    if wide:
        pairs = _x86(builder, "llvm.x86.avx512.pmaddubs.w.512", words, [u, s])
        ones = ir.Constant(words, [1] * words.count)
        sums = _x86(builder, "llvm.x86.avx512.pmaddw.d.512", lanes, [pairs, ones])
    else:
        pairs = _x86(builder, "llvm.x86.avx2.pmadd.ub.sw", words, [u, s])
        ones = ir.Constant(words, [1] * words.count)
        sums = _x86(builder, "llvm.x86.avx2.pmadd.wd", lanes, [pairs, ones])
    return builder.add(acc, sums)


def _register_bytes(count: int) -> int:
    """The register width (bytes) :func:`quads` sums ``count`` bytes in: 64 on the zmm paths
    where ``count`` fills whole zmm, else 32 (fewer than 32 bytes are widened to one ymm)."""
    return 64 if has_avx512bw() and count % 64 == 0 else 32


def vnni_bytes(count: int) -> bool:
    """Whether :func:`quads` sums ``count`` bytes with ``vpdpbusd`` (whose int32 sums take any
    unsigned byte, where ``vpmaddubsw``'s int16 pairs would saturate above 2 * 128 * 127)."""
    return has_vnni_512() if _register_bytes(count) == 64 else has_vnni_256()


def biased_q8(kind: int, count: int) -> bool:
    """Whether a tile of ``count`` code bytes of ``kind`` holds Q8_0's signed codes as the
    unsigned ``code + 128`` (:func:`tile_codes`; the caller takes ``128 * sum(x)`` off each
    integer sum): where :func:`quads` uses ``vpdpbusd``. Elsewhere Q8_0's codes meet ``|x|``
    with ``x``'s sign (:func:`operands`)."""
    return kind == KINDS["Q8_0"] and vnni_bytes(count)


def code_plus_128(builder: ir.IRBuilder, codes: ir.Value) -> ir.Value:
    """Signed code bytes as the unsigned ``code + 128`` (:func:`biased_q8`)."""
    return builder.xor(codes, ir.Constant(codes.type, [128] * codes.type.count))


def operands(
    builder: ir.IRBuilder, kind: int, biased: bool, codes: ir.Value, x: ir.Value
) -> tuple[ir.Value, ir.Value]:
    """The unsigned and signed operands of :func:`quads` for ``codes`` (from
    :func:`tile_codes`) and activation bytes ``x``: as they are, or for unbiased Q8_0 codes
    ``|x|`` and the codes with ``x``'s sign (a product pair at most 2 * 127 * 127)."""
    if kind == KINDS["Q8_0"] and not biased:
        return abs_bytes(builder, x), signed_like(builder, codes, x)
    return codes, x


def quads(builder: ir.IRBuilder, unsigned: ir.Value, signed: ir.Value, acc: ir.Value) -> ir.Value:
    """``acc`` (<n / 4 x i32>) plus, in lane ``j``, the sum over bytes ``4j .. 4j + 3`` of
    ``unsigned * signed`` (unsigned bytes times signed bytes, no pair above int16's range), on
    any multiple of 16 bytes: in registers of 64 bytes on the zmm paths, 32 on the others."""
    count = unsigned.type.count
    if count < 32:  # one row: widen to a ymm with zero bytes
        zero = ir.Constant(unsigned.type, [0] * count)
        grow = mask(range(32))
        wide_acc = builder.shuffle_vector(
            acc, ir.Constant(acc.type, [0] * acc.type.count), mask(range(8))
        )
        out = _quads_register(
            builder,
            builder.shuffle_vector(unsigned, zero, grow),
            builder.shuffle_vector(signed, zero, grow),
            wide_acc,
        )
        return builder.shuffle_vector(out, out, mask(range(count // 4)))
    step = _register_bytes(count)
    parts = []
    for i in range(0, count, step):
        pick = mask(range(i, i + step))
        lanes = mask(range(i // 4, (i + step) // 4))
        parts.append(
            _quads_register(
                builder,
                builder.shuffle_vector(unsigned, unsigned, pick),
                builder.shuffle_vector(signed, signed, pick),
                builder.shuffle_vector(acc, acc, lanes),
            )
        )
    return concat(builder, parts)


def int8_unsupported() -> str | None:
    """Why int8 activations cannot run on the CPU Numba compiles for (one line), or None."""
    if has_avx2():
        return None
    return f"activations: int8 needs a CPU with AVX2, and {target_cpu()[0]} has none; use float32"


def require_int8() -> None:
    """Raise ValueError (:func:`int8_unsupported`'s line) unless the target has AVX2."""
    reason = int8_unsupported()
    if reason is not None:
        raise ValueError(reason)
