"""One decoder layer of a decode step (up to ``FUSED_MAX_ROWS`` one-token rows), one compiled call.

A decode step of a 135M model is ~12 short operations per layer; called one by one from Python,
each pays its wrapper's checks, a NumPy allocation and a Numba dispatch (~4-15 us each on a
2-core VM), which added up to several milliseconds per token. :func:`decode_layer` runs the
whole layer (RMSNorm, q|k|v, RoPE, write_kv, paged decode attention, o, RMSNorm, gate|up,
SwiGLU, down, both residual adds) in one call on arguments the caller validated once per step,
with the family's optional parts (:mod:`pagedattn.model.architecture`: q/k/v bias, per-head
q/k RMSNorm, the attention and MLP output norms, tanh-GELU) passed as arrays, empty where a
family has none, and a flag: a branch per layer picks them at run time, so one compiled layer
serves every family (a specialization per family would cost a compile of a minute each). The
layer's sliding window and attention scale come with its decode plan, its RoPE tables with
``cos`` / ``sin``.

It calls the very kernels the step-by-step path calls, in the same order, on the same values
(:func:`~pagedattn.model.block_dot.qmatmul_blocks` with the same parts and launch, or the
int8 path's ``project_int8``, the row ops' serial kernels, RoPE's product-then-difference
loop, ``scatter_kv``, ``decode_attention`` with the step's flash-decoding splits), so its results
are bitwise those of :meth:`pagedattn.model.decoder.DecoderModel.forward`'s general path; the
batch-invariance tests compare the two (a sequence alone takes this path, in a batch of three
the general one). Fusion in the sense of llama.cpp's one graph per step (``llama_decode``),
not of merged arithmetic.

The int8 path is chosen by the type of the ``int8`` argument (None: exact float32; True: int8
activations, which the int8 kernels take for every block type), so Numba compiles
:mod:`pagedattn.model.block_dot_int8`, and its x86 instructions, only into the specialisation
that asks for it.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from numba import types
from numba.extending import overload

from pagedattn.kernels.kv_int8 import cache_head_dim
from pagedattn.kernels.paged_decode_numba import decode_attention
from pagedattn.kernels.rope import rope_into
from pagedattn.kernels.write_kv_numba import scatter_kv
from pagedattn.model.block_dot import qmatmul_blocks
from pagedattn.model.gelu_ops import gelu_mul_serial
from pagedattn.model.row_ops import rms_norm_serial, silu_mul_serial


def _project(  # pragma: no cover - replaced by the overload in kernels
    x: Any,
    int8: Any,
    b0: Any,
    b1: Any,
    b2: Any,
    kinds: Any,
    kind_set: Any,
    num_parts: Any,
    out: Any,
) -> None:
    """``out = x @ concat(parts).T`` as :func:`pagedattn.model.quantized.qmatmul` does it for
    a decode step: the parts share one register-decode launch, exact (``int8`` None) or on int8
    inputs quantized on this thread (``int8`` True)."""
    raise NotImplementedError("_project is only callable from Numba kernels")


# The overload's parameters carry no annotations: Numba requires the typing function's
# signature to equal its implementations'.
@overload(_project, inline="always")
def _project_by_path(x, int8, b0, b1, b2, kinds, kind_set, num_parts, out):  # type: ignore[no-untyped-def]
    if isinstance(int8, types.NoneType):

        def exact(x, int8, b0, b1, b2, kinds, kind_set, num_parts, out):  # type: ignore[no-untyped-def]
            qmatmul_blocks(x, b0, b1, b2, kinds, kind_set, num_parts, out)

        return exact
    from pagedattn.model.block_dot_int8 import project_int8
    from pagedattn.model.int8_ir import require_int8

    require_int8()  # a Python error, never an LLVM abort, on a CPU without AVX2
    impl: Any = project_int8

    def on_int8(x, int8, b0, b1, b2, kinds, kind_set, num_parts, out):  # type: ignore[no-untyped-def]
        impl(x, b0, b1, b2, kinds, num_parts, out)

    return on_int8


@numba.njit(cache=True, nogil=True)
def decode_layer(  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    x,
    eps,
    attn_norm,
    mlp_norm,
    bq,
    bk,
    bv,
    qkv_kinds,
    bo,
    o_kind,
    bg,
    bu,
    gate_up_kinds,
    bd,
    down_kind,
    kind_set,
    int8,
    num_heads,
    cos,
    sin,
    keep,
    pages,
    offsets,
    k_cache,
    v_cache,
    tables,
    ctx,
    splits,
    num_splits,
    scale,
    window,
    num_sink,
    qkv_bias,
    q_norm,
    k_norm,
    post_attn_norm,
    post_mlp_norm,
    gelu,
):
    """``x += attention block; x += MLP block`` for the T decode rows of ``x``.

    x: (T, H) float32 residual stream, updated in place; eps: float32; attn_norm, mlp_norm:
    (H,) float32; bq, bk, bv, bo, bg, bu, bd: GGUF block rows (uint8) of q (nh*D, H), k, v
    (nkv*D, H), o (H, nh*D), gate, up (I, H), down (H, I), with their kinds (values of
    :data:`~pagedattn.model.block_ir.KINDS`) as tuples for the fused launches; kind_set: the
    :func:`~pagedattn.model.block_ir.kind_set` of the model's kinds (one compiled layer per
    model's set of block types, holding only their variants); int8: None
    (every projection exact float32) or True (every projection on int8 inputs, as
    :func:`~pagedattn.model.quantized.qmatmul` runs block matrices with int8 activations); cos, sin:
    (T, D/2) float32 RoPE tables; keep, pages, offsets: the step's slot plan; k_cache, v_cache:
    this layer's (num_pages, nkv, page_size, D) pool (float32, float16 bits, or int8 D + 4
    wide); tables, ctx, splits, num_splits, scale, window, num_sink: the step's validated
    decode plan (one sequence per row, no sink re-rotation); qkv_bias ((nh + 2 nkv) * D,),
    q_norm, k_norm (D,), post_attn_norm, post_mlp_norm (H,): float32, empty where the family
    has none (runtime branches, so one compiled layer serves every family); gelu: False
    (SwiGLU) or True (tanh-GELU GLU).
    """
    rows, hidden = x.shape
    num_kv = k_cache.shape[1]
    head_dim = cache_head_dim(k_cache)
    q_width = num_heads * head_dim
    kv_width = num_kv * head_dim
    h = np.empty((rows, hidden), np.float32)
    rms_norm_serial(x, attn_norm, eps, h)
    qkv = np.empty((rows, q_width + 2 * kv_width), np.float32)
    _project(h, int8, bq, bk, bv, qkv_kinds, kind_set, 3, qkv)
    if qkv_bias.shape[0] > 0:
        for r in range(rows):
            qkv[r] += qkv_bias
    q = np.ascontiguousarray(qkv[:, :q_width]).reshape((rows, num_heads, head_dim))
    k = np.ascontiguousarray(qkv[:, q_width : q_width + kv_width])
    v = np.ascontiguousarray(qkv[:, q_width + kv_width :]).reshape((rows, num_kv, head_dim))
    if q_norm.shape[0] > 0:
        qn = np.empty((rows * num_heads, head_dim), np.float32)
        rms_norm_serial(q.reshape((rows * num_heads, head_dim)), q_norm, eps, qn)
        q = qn.reshape((rows, num_heads, head_dim))
    if k_norm.shape[0] > 0:
        kn = np.empty((rows * num_kv, head_dim), np.float32)
        rms_norm_serial(k.reshape((rows * num_kv, head_dim)), k_norm, eps, kn)
        k = kn.reshape((rows, kv_width))
    q_rot = np.empty_like(q)
    k_rot = np.empty((rows, num_kv, head_dim), np.float32)
    rope_into(q, cos, sin, q_rot)
    rope_into(k.reshape((rows, num_kv, head_dim)), cos, sin, k_rot)
    scatter_kv(keep, pages, offsets, k_rot, v, k_cache, v_cache)
    attn, _ = decode_attention(
        q_rot, q_rot, k_cache, v_cache, tables, ctx, splits, scale, window, num_sink, num_splits
    )
    o = np.empty((rows, hidden), np.float32)
    o_kinds = (o_kind, o_kind, o_kind)
    _project(attn.reshape((rows, q_width)), int8, bo, bo, bo, o_kinds, kind_set, 1, o)
    if post_attn_norm.shape[0] > 0:
        on = np.empty((rows, hidden), np.float32)
        rms_norm_serial(o, post_attn_norm, eps, on)
        x += on
    else:
        x += o
    rms_norm_serial(x, mlp_norm, eps, h)
    inter = bg.shape[0]
    gate_up = np.empty((rows, 2 * inter), np.float32)
    kind3 = (gate_up_kinds[0], gate_up_kinds[1], gate_up_kinds[1])
    _project(h, int8, bg, bu, bu, kind3, kind_set, 2, gate_up)
    act = np.empty((rows, inter), np.float32)
    if gelu:
        gelu_mul_serial(gate_up, act)
    else:
        silu_mul_serial(gate_up, act)
    down = np.empty((rows, hidden), np.float32)
    d_kinds = (down_kind, down_kind, down_kind)
    _project(act, int8, bd, bd, bd, d_kinds, kind_set, 1, down)
    if post_mlp_norm.shape[0] > 0:
        dn = np.empty((rows, hidden), np.float32)
        rms_norm_serial(down, post_mlp_norm, eps, dn)
        x += dn
    else:
        x += down
