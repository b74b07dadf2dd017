"""The decoder layer, one operation at a time: the general path of every family's forward.

:func:`run_layer` is the only copy of the layer in the NumPy backend's general path; the
fused decode layer (:mod:`pagedattn.model.decode_layer`) runs the same kernels in the same
order. Each operation goes through a hook ``op(kind, fn, *args)`` (:func:`direct` by default):
the profiler passes a timing hook instead of keeping its own copy of the loop. Kinds:
``norm``, ``matmul``, ``rope``, ``attention``, ``activation``, and ``layer`` around a whole layer
(its first argument is the layer index).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pagedattn.config import ModelConfig
from pagedattn.kernels.attention_mass import decode_adding_page_mass
from pagedattn.kernels.paged_checks import SlotPlan
from pagedattn.kernels.paged_plan import write_kv_planned
from pagedattn.kernels.rope import apply_rope_cos_sin
from pagedattn.model.attention_split import AttentionSplit
from pagedattn.model.forward_batch import ForwardBatch
from pagedattn.model.gelu_ops import gelu_mul
from pagedattn.model.layer_weights import LayerWeights
from pagedattn.model.quantized import qmatmul
from pagedattn.model.row_ops import rms_norm, silu_mul

OpHook = Callable[..., Any]
RopeTables = tuple[np.ndarray, np.ndarray]
# The table's activations (Architecture.activation) -> their GLU kernels.
ACTIVATION_KERNELS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "silu": silu_mul,
    "gelu_tanh": gelu_mul,
}


def direct(kind: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The default hook: call ``fn``."""
    return fn(*args, **kwargs)


@dataclass(frozen=True)
class LayerStep:
    """What every layer of one forward shares: the batch, its attention split and slot plan,
    the KV pool, the RoPE tables of each layer (and of sink re-rotation), the activation mode
    and the opt-in attention-mass accumulator."""

    batch: ForwardBatch
    split: AttentionSplit
    slots: SlotPlan
    kv: np.ndarray
    ropes: list[RopeTables]  # per layer
    sink_ropes: list[RopeTables] | None  # per layer, or None
    activations: str
    attention_mass: np.ndarray | None
    glu: Callable[[np.ndarray], np.ndarray]  # the family's gated activation (ACTIVATION_KERNELS)


def run_layer(
    config: ModelConfig,
    li: int,
    layer: LayerWeights,
    x: np.ndarray,
    step: LayerStep,
    op: OpHook = direct,
) -> None:
    """Layer ``li`` on the residual stream ``x`` (T, H), updated in place; writes the layer's
    K/V at the step's slots (see :mod:`pagedattn.model.architecture` for the layer's form)."""
    c, b = config, step.batch
    T, nh, nkv, D = b.num_tokens, c.num_heads, c.num_kv_heads, c.head_dim
    eps, mode = c.rms_norm_eps, step.activations
    h = op("norm", rms_norm, x, layer.attn_norm, eps)  # (T, H)
    qkv = op("matmul", qmatmul, h, *layer.qkv, activations=mode)  # (T, (nh + 2 nkv) * D)
    if layer.qkv_bias is not None:
        qkv += layer.qkv_bias
    q = qkv[:, : nh * D].reshape(T, nh, D)  # (T, nh, D) un-rotated
    k = qkv[:, nh * D : (nh + nkv) * D].reshape(T, nkv, D)  # (T, nkv, D)
    v = np.ascontiguousarray(qkv[:, (nh + nkv) * D :]).reshape(T, nkv, D)  # (T, nkv, D)
    if layer.q_norm is not None and layer.k_norm is not None:
        q = op("norm", rms_norm, q.reshape(T * nh, D), layer.q_norm, eps).reshape(T, nh, D)
        k = op("norm", rms_norm, k.reshape(T * nkv, D), layer.k_norm, eps).reshape(T, nkv, D)
    cos, sin = step.ropes[li]
    q_rot = op("rope", apply_rope_cos_sin, q, cos, sin)  # (T, nh, D)
    k_rot = op("rope", apply_rope_cos_sin, k, cos, sin)  # (T, nkv, D)
    q_sink = None
    if step.sink_ropes is not None:
        q_sink = op("rope", apply_rope_cos_sin, q, *step.sink_ropes[li])
    k_cache, v_cache = step.kv[li, 0], step.kv[li, 1]  # (num_pages, nkv, page_size, D) each
    op("attention", write_kv_planned, step.slots, k_cache, v_cache, k_rot, v)
    window = c.layer_window(li)
    if step.attention_mass is None:
        attn = op(
            "attention", step.split.attention, q_rot, q_sink, k_cache, v_cache, window,
            c.attn_scale,
        )  # fmt: skip
    else:  # opt-in (eval lab): a decode step that also reports the mass per page
        attn = decode_adding_page_mass(
            q_rot, k_cache, v_cache, b.page_tables, b.context_lens,
            sliding_window=step.split.window(window), num_sink_tokens=b.num_sink_tokens,
            q_sink=q_sink, attention_mass=step.attention_mass,
        )  # fmt: skip
    o = op("matmul", qmatmul, attn.reshape(T, nh * D), layer.o, activations=mode)  # (T, H)
    if layer.post_attn_norm is not None:
        o = op("norm", rms_norm, o, layer.post_attn_norm, eps)
    x += o
    h = op("norm", rms_norm, x, layer.mlp_norm, eps)  # (T, H)
    gate_up = op("matmul", qmatmul, h, *layer.gate_up, activations=mode)  # (T, 2 I)
    act = op("activation", step.glu, gate_up)  # (T, I)
    down = op("matmul", qmatmul, act, layer.down, activations=mode)  # (T, H)
    if layer.post_mlp_norm is not None:
        down = op("norm", rms_norm, down, layer.post_mlp_norm, eps)
    x += down
