"""One decoder layer's weights in their stored form, and their arguments to the fused decode
layer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pagedattn.model.quantized import BlockQuantized, Matrix


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer's weights: norms in float32, every linear (out, in) in its stored form
    (GGUF blocks, or float32 for float checkpoints), never copied or dequantized."""

    attn_norm: np.ndarray  # (H,)
    qkv: tuple[Matrix, Matrix, Matrix]  # q (nh * D, H), k (nkv * D, H), v (nkv * D, H)
    o: Matrix  # (H, nh * D)
    mlp_norm: np.ndarray  # (H,)
    gate_up: tuple[Matrix, Matrix]  # gate (I, H), up (I, H)
    down: Matrix  # (H, I)

    def fused_args(self) -> tuple[object, ...] | None:
        """The weights as :func:`~pagedattn.model.decode_layer.decode_layer` takes them after
        ``x`` and ``eps`` (norms, block rows and kinds), or None when a projection is not
        block-quantized."""
        q, k, v = self.qkv
        gate, up = self.gate_up
        mats = (q, k, v, self.o, gate, up, self.down)
        if not all(isinstance(m, BlockQuantized) for m in mats):
            return None
        bq, bk, bv, bo, bg, bu, bd = (m for m in mats if isinstance(m, BlockQuantized))
        return (
            self.attn_norm, self.mlp_norm, bq.blocks, bk.blocks, bv.blocks,
            (bq.kind, bk.kind, bv.kind), bo.blocks, bo.kind, bg.blocks, bu.blocks,
            (bg.kind, bu.kind), bd.blocks, bd.kind,
        )  # fmt: skip

    @classmethod
    def from_stored(
        cls,
        prefix: str,
        matrix: Callable[[str], Matrix],
        f32: Callable[[str], np.ndarray],
    ) -> LayerWeights:
        """Layer ``prefix`` (``"model.layers.{i}."``) from HF-named tensors: ``matrix`` gives
        a linear in its stored form, ``f32`` a norm's float32 weights."""
        return cls(
            attn_norm=f32(prefix + "input_layernorm.weight"),
            qkv=(
                matrix(prefix + "self_attn.q_proj.weight"),
                matrix(prefix + "self_attn.k_proj.weight"),
                matrix(prefix + "self_attn.v_proj.weight"),
            ),
            o=matrix(prefix + "self_attn.o_proj.weight"),
            mlp_norm=f32(prefix + "post_attention_layernorm.weight"),
            gate_up=(
                matrix(prefix + "mlp.gate_proj.weight"),
                matrix(prefix + "mlp.up_proj.weight"),
            ),
            down=matrix(prefix + "mlp.down_proj.weight"),
        )
