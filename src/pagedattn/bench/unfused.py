"""Opt-in unfused profiling forward: LlamaModel.forward's exact operations, each one timed.

The fast path (:meth:`pagedattn.model.llama.LlamaModel.forward`) runs each layer as one loop
with no timers. For ``pagedattn profile --unfused`` this module runs the same functions in the
same order (so the logits are identical; a test checks it) with a ``perf_counter`` pair around
each, adding seconds per layer and per kind of op: ``matmul`` (projections, LM head),
``attention`` (write_kv + paged kernel), ``rope``, ``norm``, ``activation`` (SwiGLU),
``embedding``. Timers cost a few microseconds per op, which is why this mode is labelled.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

from pagedattn.kernels.paged import write_kv
from pagedattn.kernels.rope import apply_rope_cos_sin, rope_cos_sin
from pagedattn.model.attention_split import AttentionSplit
from pagedattn.model.forward_batch import ForwardBatch
from pagedattn.model.llama import LlamaModel
from pagedattn.model.quantized import qmatmul
from pagedattn.model.row_ops import rms_norm, silu_mul


class UnfusedProfiler:
    """Wraps a :class:`LlamaModel`; ``forward`` gives the same logits and fills ``by_op`` /
    ``by_layer`` (seconds, accumulated over calls)."""

    def __init__(self, model: LlamaModel) -> None:
        self.model = model
        self.config = model.config
        self.by_op: defaultdict[str, float] = defaultdict(float)
        self.by_layer: defaultdict[int, float] = defaultdict(float)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def _t(self, kind: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        out = fn(*args, **kwargs)
        self.by_op[kind] += time.perf_counter() - began
        return out

    def forward(self, batch: ForwardBatch, kv: np.ndarray) -> np.ndarray:
        """As :meth:`LlamaModel.forward` (same arguments, result and errors)."""
        m, c, t = self.model, self.model.config, self._t
        m._check_kv(kv)
        T, nh, nkv, D = batch.num_tokens, c.num_heads, c.num_kv_heads, c.head_dim
        ids = np.asarray(batch.input_ids)
        if T and (ids.min() < 0 or ids.max() >= c.vocab_size):
            raise ValueError(f"input_ids must be in [0, {c.vocab_size})")
        freqs = c.rope_freq_factors
        cos, sin = t("rope", rope_cos_sin, batch.positions, D, c.rope_theta, freqs)
        sink = None
        if batch.sink_positions is not None:
            sink = t("rope", rope_cos_sin, batch.sink_positions, D, c.rope_theta, freqs)
        split = AttentionSplit(batch)
        x = t("embedding", m._embed, ids)
        for li, layer in enumerate(m.layers):
            began = time.perf_counter()
            h = t("norm", rms_norm, x, layer.attn_norm, c.rms_norm_eps)
            qkv = t("matmul", qmatmul, h, *layer.qkv)
            q = qkv[:, : nh * D].reshape(T, nh, D)
            k = qkv[:, nh * D : (nh + nkv) * D].reshape(T, nkv, D)
            v = np.ascontiguousarray(qkv[:, (nh + nkv) * D :]).reshape(T, nkv, D)
            q_rot = t("rope", apply_rope_cos_sin, q, cos, sin)
            k_rot = t("rope", apply_rope_cos_sin, k, cos, sin)
            q_sink = None if sink is None else t("rope", apply_rope_cos_sin, q, *sink)
            k_cache, v_cache = kv[li, 0], kv[li, 1]
            t("attention", write_kv, k_cache, v_cache, k_rot, v, batch.slot_mapping)
            attn = t("attention", split.attention, q_rot, q_sink, k_cache, v_cache)
            x += t("matmul", qmatmul, attn.reshape(T, nh * D), layer.o)
            h = t("norm", rms_norm, x, layer.mlp_norm, c.rms_norm_eps)
            gate_up = t("matmul", qmatmul, h, *layer.gate_up)
            act = t("activation", silu_mul, gate_up)
            x += t("matmul", qmatmul, act, layer.down)
            self.by_layer[li] += time.perf_counter() - began
        rows = x[np.asarray(batch.logits_indices)]
        rows = t("norm", rms_norm, rows, m.final_norm, c.rms_norm_eps)
        out: np.ndarray = t("matmul", qmatmul, rows, m.lm_head)
        return out
