"""Register tiles of the prefill kernel's two products over its transposed lanes.

The prefill kernel (``paged_prefill_numba.py``) keeps a block of query rows x heads as
``lanes``: ``qT[d, lane]``, scores ``st[j, lane]`` and the accumulator ``acc[d, lane]``, each a
(rows, lanes) float32 array. Its two products are small GEMMs over a page of keys:

* scores: ``st[j + i, l] = sum_d qT[d, l] * K[page, g, t + i, d]``, ``KEY_TILE`` keys by
  ``TILE_LANES`` lanes per tile, accumulated over ``d`` in registers and stored once;
* values: ``acc[d0 + k, l] += sum_i st[j + i, l] * V[page, g, t + i, d0 + k]``, ``DIM_TILE``
  dims by ``TILE_LANES`` lanes per tile, loaded once, accumulated over the page's keys in
  registers, stored once.

Each is written as LLVM vector IR (``kernels/simd_ir.py``): a tile's accumulators stay in
registers (8 ymm on AVX2) while each step loads one lane vector and broadcasts a few pool
elements, instead of reloading and storing ``st`` / ``acc`` rows for every few products. Every
output is one in-order chain of ``fma`` over ``d`` (scores) or keys (values), whatever the
tile shape: the result does not depend on how LLVM compiled it. Pools hold float32, or float16
as uint16 bits (``kernels/kv_dtype.py``), widened exactly on load, or int8 codes with a float32
scale per row (``kernels/kv_int8.py``): a key's scale multiplies its finished scores, a value
row's scale its score lanes before they weigh the codes.
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from pagedattn.kernels.half_ir import widen_half_bits
from pagedattn.kernels.kv_int8 import SCALE_BYTES
from pagedattn.kernels.simd_ir import (
    F32,
    Arr2D,
    carried_loop,
    fma,
    load_vector,
    splat,
    store_vector,
)

TILE_LANES = 16  # lanes per tile: one <16 x float>, two ymm on AVX2
KEY_TILE = 4  # keys per score tile
DIM_TILE = 4  # head dims per value tile


class _Pool:
    """Element pointers and float32 loads of a 4-D (num_pages, num_kv_heads, page_size,
    head_dim) pool of float32, uint16 (float16 bits) or int8 (codes, then a float32 scale)."""

    def __init__(self, context: Any, builder: ir.IRBuilder, ty: Any, value: ir.Value) -> None:
        arr = context.make_array(ty)(context, builder, value)
        self.data = arr.data
        self.half = ty.dtype == types.uint16
        self.int8 = ty.dtype == types.int8
        itemsize = context.get_abi_sizeof(context.get_data_type(ty.dtype))
        strides = cgutils.unpack_tuple(builder, arr.strides, 4)
        self.strides = [builder.sdiv(s, s.type(itemsize)) for s in strides]
        width = cgutils.unpack_tuple(builder, arr.shape, 4)[3]
        self.code_end = builder.sub(width, width.type(SCALE_BYTES))

    def row(self, builder: ir.IRBuilder, page: ir.Value, g: ir.Value, t: ir.Value) -> ir.Value:
        """Pointer to ``pool[page, g, t, 0]``."""
        s0, s1, s2, _ = self.strides
        offset = builder.add(
            builder.add(builder.mul(page, s0), builder.mul(g, s1)), builder.mul(t, s2)
        )
        return builder.gep(self.data, [offset])

    def load(self, builder: ir.IRBuilder, row: ir.Value, d: ir.Value) -> ir.Value:
        """float32 value of ``row[d]`` (``d`` in elements)."""
        value = builder.load(builder.gep(row, [builder.mul(d, self.strides[3])]))
        if self.int8:
            return builder.sitofp(value, F32)
        return widen_half_bits(builder, value) if self.half else value

    def scale(self, builder: ir.IRBuilder, row: ir.Value) -> ir.Value:
        """float32 scale of an int8 ``row`` (its last 4 bytes)."""
        at = builder.gep(row, [builder.mul(self.code_end, self.strides[3])])
        return builder.load(builder.bitcast(at, F32.as_pointer()), align=4)


def _is_pool(ty: Any) -> bool:
    return (
        isinstance(ty, types.Array)
        and ty.ndim == 4
        and ty.dtype in (types.float32, types.uint16, types.int8)
    )


def _is_rows(ty: Any) -> bool:
    return isinstance(ty, types.Array) and ty.ndim == 2 and ty.dtype == types.float32


def _index(context: Any, builder: ir.IRBuilder, value: ir.Value, ty: Any) -> ir.Value:
    return context.cast(builder, value, ty, types.intp)


def make_score_tile(keys: int) -> Any:
    """Intrinsic (qT, k_cache, page, g, t, lane0, st, j) -> None: for ``i < keys``,
    ``st[j + i, lane0 : lane0 + TILE_LANES] = sum_d qT[d, lane0 : ...] * K[page, g, t + i, d]``
    (``fma`` in increasing ``d`` from 0)."""

    @intrinsic  # type: ignore[misc]
    def score_tile(
        typingctx: Any,
        qT: Any,
        k_cache: Any,
        page: Any,
        g: Any,
        t: Any,
        lane0: Any,
        st: Any,
        j: Any,
    ) -> Any:
        if not (_is_rows(qT) and _is_pool(k_cache) and _is_rows(st)):
            return None
        sig = types.none(qT, k_cache, page, g, t, lane0, st, j)

        def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> ir.Value:
            q_arr = Arr2D(context, builder, sig.args[0], args[0])
            pool = _Pool(context, builder, sig.args[1], args[1])
            st_arr = Arr2D(context, builder, sig.args[6], args[6])
            page_i, g_i, t_i, lane_i, j_i = (
                _index(context, builder, args[i], sig.args[i]) for i in (2, 3, 4, 5, 7)
            )
            i64 = page_i.type
            rows = [pool.row(builder, page_i, g_i, builder.add(t_i, i64(i))) for i in range(keys)]
            zero = ir.Constant(ir.VectorType(F32, TILE_LANES), [0.0] * TILE_LANES)
            accs = [zero] * keys

            def body(d: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
                qv = load_vector(builder, q_arr.ptr(builder, d, lane_i), TILE_LANES)
                return [
                    fma(builder, qv, splat(builder, pool.load(builder, row, d), TILE_LANES), acc)
                    for row, acc in zip(rows, accs, strict=True)
                ]

            carried_loop(builder, q_arr.shape[0], accs, body)
            if pool.int8:  # s_i (q . c_i): the key's scale on its code product
                accs = [
                    builder.fmul(acc, splat(builder, pool.scale(builder, row), TILE_LANES))
                    for row, acc in zip(rows, accs, strict=True)
                ]
            for i, acc in enumerate(accs):
                store_vector(builder, acc, st_arr.ptr(builder, builder.add(j_i, i64(i)), lane_i))
            return context.get_dummy_value()

        return sig, codegen

    return score_tile


def make_value_tile(dims: int) -> Any:
    """Intrinsic (st, j, v_cache, page, g, t, n, acc, d0, lane0) -> None: for ``k < dims``,
    ``acc[d0 + k, lane0 : lane0 + TILE_LANES] += sum_i st[j + i, lane0 : ...] *
    V[page, g, t + i, d0 + k]`` over ``i < n`` (``fma`` in increasing ``i``)."""

    @intrinsic  # type: ignore[misc]
    def value_tile(
        typingctx: Any,
        st: Any,
        j: Any,
        v_cache: Any,
        page: Any,
        g: Any,
        t: Any,
        n: Any,
        acc: Any,
        d0: Any,
        lane0: Any,
    ) -> Any:
        if not (_is_rows(st) and _is_pool(v_cache) and _is_rows(acc)):
            return None
        sig = types.none(st, j, v_cache, page, g, t, n, acc, d0, lane0)

        def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> ir.Value:
            st_arr = Arr2D(context, builder, sig.args[0], args[0])
            pool = _Pool(context, builder, sig.args[2], args[2])
            acc_arr = Arr2D(context, builder, sig.args[7], args[7])
            j_i, page_i, g_i, t_i, n_i, d_i, lane_i = (
                _index(context, builder, args[i], sig.args[i]) for i in (1, 3, 4, 5, 6, 8, 9)
            )
            i64 = j_i.type
            ptrs = [acc_arr.ptr(builder, builder.add(d_i, i64(k)), lane_i) for k in range(dims)]
            accs = [load_vector(builder, p, TILE_LANES) for p in ptrs]

            def body(i: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
                st_row = st_arr.ptr(builder, builder.add(j_i, i), lane_i)
                sv = load_vector(builder, st_row, TILE_LANES)
                row = pool.row(builder, page_i, g_i, builder.add(t_i, i))
                if pool.int8:  # (p_i s_i) c_i: the row's scale on its weights
                    sv = builder.fmul(sv, splat(builder, pool.scale(builder, row), TILE_LANES))
                out = []
                for k, acc in enumerate(accs):
                    v = pool.load(builder, row, builder.add(d_i, i64(k)))
                    out.append(fma(builder, sv, splat(builder, v, TILE_LANES), acc))
                return out

            carried_loop(builder, n_i, accs, body)
            for p, acc in zip(ptrs, accs, strict=True):
                store_vector(builder, acc, p)
            return context.get_dummy_value()

        return sig, codegen

    return value_tile


score_tile_keys = make_score_tile(KEY_TILE)
score_tile_one = make_score_tile(1)
value_tile_dims = make_value_tile(DIM_TILE)
value_tile_one = make_value_tile(1)
