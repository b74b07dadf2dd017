"""One decoder layer of a decode step (one or two new tokens) in a single compiled call.

A decode step of a 135M model is ~12 short operations per layer; called one by one from Python,
each pays its wrapper's checks, a NumPy allocation and a Numba dispatch (~4-15 us each on a
2-core VM), which added up to several milliseconds per token. :func:`decode_layer` runs the
whole layer (RMSNorm, q|k|v, RoPE, write_kv, paged decode attention, o, RMSNorm, gate|up,
SwiGLU, down, both residual adds) in one call on arguments the caller validated once per step.

It calls the very kernels the step-by-step path calls, in the same order, on the same values
(:func:`~pagedattn.model.block_dot.qmatmul_blocks` with the same parts and launch,
``quantize_activations_serial``, the row ops' serial kernels, RoPE's product-then-difference
loop, ``scatter_kv``, ``decode_attention`` with the step's flash-decoding splits), so its results
are bitwise those of :meth:`pagedattn.model.llama.LlamaModel.forward`'s general path; the
batch-invariance tests compare the two (a sequence alone takes this path, in a batch of three
the general one). Fusion in the sense of llama.cpp's one graph per step (``llama_decode``),
not of merged arithmetic.
"""

from __future__ import annotations

import numba
import numpy as np

from pagedattn.kernels.paged_decode_numba import decode_attention
from pagedattn.kernels.rope import rope_into
from pagedattn.kernels.write_kv_numba import scatter_kv
from pagedattn.model.block_dot import (
    BLOCK,
    qmatmul_blocks,
    quantize_activations_serial,
)
from pagedattn.model.row_ops import rms_norm_serial, silu_mul_serial


@numba.njit(cache=True, nogil=True)
def _project(x, use_int8, b0, b1, b2, kinds, num_parts, out):  # type: ignore[no-untyped-def]  # pragma: no cover
    """``out = x @ concat(parts).T`` as :func:`pagedattn.model.quantized.qmatmul` does it for
    a decode step: int8 inputs quantized on this thread, one register-decode launch."""
    rows, k = x.shape
    if use_int8:
        xq = np.empty((rows, k), np.int8)
        xd = np.empty((rows, k // BLOCK), np.float32)
        xs = np.empty((rows, k // BLOCK), np.float32)
        quantize_activations_serial(x, xq, xd, xs)
    else:
        xq = np.empty((rows, 0), np.int8)
        xd = np.empty((rows, 0), np.float32)
        xs = np.empty((rows, 0), np.float32)
    qmatmul_blocks(x, xq, xd, xs, use_int8, b0, b1, b2, kinds, num_parts, out)


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
    use_int8,
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
):
    """``x += attention block; x += MLP block`` for the T (1 or 2) decode rows of ``x``.

    x: (T, H) float32 residual stream, updated in place; eps: float32; attn_norm, mlp_norm:
    (H,) float32; bq, bk, bv, bo, bg, bu, bd: GGUF block rows (uint8) of q (nh*D, H), k, v
    (nkv*D, H), o (H, nh*D), gate, up (I, H), down (H, I), with their kinds (Q4_0 = 0, Q4_1 = 1,
    Q8_0 = 2) as tuples for the fused launches; use_int8: int8 activations for 4-bit parts
    (every in_features a multiple of 32); cos, sin: (T, D/2) float32 RoPE tables; keep,
    pages, offsets: the step's slot plan; k_cache, v_cache: this layer's (num_pages, nkv,
    page_size, D) float32 pool; tables, ctx, splits, num_splits, scale, window, num_sink: the
    step's validated decode plan (one sequence per row, no sink re-rotation).
    """
    rows, hidden = x.shape
    num_kv = k_cache.shape[1]
    head_dim = k_cache.shape[3]
    q_width = num_heads * head_dim
    kv_width = num_kv * head_dim
    h = np.empty((rows, hidden), np.float32)
    rms_norm_serial(x, attn_norm, eps, h)
    qkv = np.empty((rows, q_width + 2 * kv_width), np.float32)
    _project(h, use_int8, bq, bk, bv, qkv_kinds, 3, qkv)
    q = np.ascontiguousarray(qkv[:, :q_width]).reshape((rows, num_heads, head_dim))
    k = np.ascontiguousarray(qkv[:, q_width : q_width + kv_width])
    v = np.ascontiguousarray(qkv[:, q_width + kv_width :]).reshape((rows, num_kv, head_dim))
    q_rot = np.empty_like(q)
    k_rot = np.empty((rows, num_kv, head_dim), np.float32)
    rope_into(q, cos, sin, q_rot)
    rope_into(k.reshape((rows, num_kv, head_dim)), cos, sin, k_rot)
    scatter_kv(keep, pages, offsets, k_rot, v, k_cache, v_cache)
    attn, _ = decode_attention(
        q_rot, q_rot, k_cache, v_cache, tables, ctx, splits, scale, window, num_sink, num_splits
    )
    o = np.empty((rows, hidden), np.float32)
    _project(attn.reshape((rows, q_width)), use_int8, bo, bo, bo, (o_kind, o_kind, o_kind), 1, o)
    x += o
    rms_norm_serial(x, mlp_norm, eps, h)
    inter = bg.shape[0]
    gate_up = np.empty((rows, 2 * inter), np.float32)
    kind3 = (gate_up_kinds[0], gate_up_kinds[1], gate_up_kinds[1])
    _project(h, use_int8, bg, bu, bu, kind3, 2, gate_up)
    act = np.empty((rows, inter), np.float32)
    silu_mul_serial(gate_up, act)
    down = np.empty((rows, hidden), np.float32)
    _project(act, use_int8, bd, bd, bd, (down_kind, down_kind, down_kind), 1, down)
    x += down
