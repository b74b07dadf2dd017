"""Software prefetch of a page's tile from Numba code: the hardware prefetcher follows one
stream within a memory page and starts cold on each new one, and a paged KV pool hands the
attention kernel its tiles in the page table's order, each a few KiB, scattered over the pool."""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from pagedattn.kernels.simd_ir import I8, prefetch

LINE = 64  # bytes per cache line
# simd_ir.prefetch's locality 1: x86 ``prefetcht2``, into L2 / L3 but not L1: a block of pages
# ahead is tens of KiB, more than L1 holds beside the block being read. Decode attention over
# 30 layers' pools at context 512 (SmolLM2, one Zen 4 core, three runs each): none 3.3-3.9 ms,
# into L1 (``prefetcht0``) 3.2-3.8, ``prefetcht1`` 3.3-3.6, ``prefetcht2`` 2.3-2.8.
LOCALITY = 1
# How far ahead decode attention hints its pages: the first pages of a work item as it starts,
# then each page's tiles this many pages before it reads them, one page per page read. Thirty
# layers' pools of shuffled pages, evicted from L3 before each run, one Zen 4 core, old and new
# code alternated: the next block's four pages at each block's start (as before) 3.20-3.41 ms
# at context 512, 11.7-12.3 at 2048; two pages ahead 2.78-2.98 and 10.4-10.6 (one-at-a-time
# trials: 3 ahead 2.5, 4 ahead 2.5-2.6, 16 ahead 2.9, against 2.4-2.5 for 2). Scattered 4 KiB
# tiles stream at about 8.5 GB/s here, prefetched or not, against 14 GB/s in address order.
PREFETCH_PAGES = 2


@intrinsic  # type: ignore[misc]
def prefetch_tile(typingctx: Any, arr: Any, i0: Any, i1: Any) -> Any:
    """Hint into L2 every line of ``arr[i0, i1]`` (an array of three or more dimensions,
    C-contiguous: ``strides[1]`` bytes from that index); never faults, changes no value."""
    if not isinstance(arr, types.Array) or arr.ndim < 3:
        return None
    sig = types.none(arr, i0, i1)

    def codegen(context: Any, builder: ir.IRBuilder, sig: Any, args: Any) -> ir.Value:
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        strides = cgutils.unpack_tuple(builder, ary.strides, sig.args[0].ndim)
        i64 = strides[0].type
        first = context.cast(builder, args[1], sig.args[1], types.intp)
        second = context.cast(builder, args[2], sig.args[2], types.intp)
        offset = builder.add(builder.mul(first, strides[0]), builder.mul(second, strides[1]))
        base = builder.gep(builder.bitcast(ary.data, I8.as_pointer()), [offset])
        lines = builder.sdiv(builder.add(strides[1], i64(LINE - 1)), i64(LINE))
        with cgutils.for_range(builder, lines) as loop:
            prefetch(builder, builder.gep(base, [builder.mul(loop.index, i64(LINE))]), LOCALITY)
        return context.get_dummy_value()

    return sig, codegen
