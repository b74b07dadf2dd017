"""One decoder layer's weights in their stored form, and their arguments to the fused decode
layer."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from pagedattn.model.architecture import Architecture
from pagedattn.model.quantized import BlockQuantized, Matrix, kind_set_of

_NONE = np.zeros(0, np.float32)  # a family's absent optional tensor, to the fused layer


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer's weights: norms and biases in float32, every linear (out, in) in its
    stored form (GGUF blocks, or float32 for float checkpoints), never copied or dequantized.
    The optional ones are None where the family has no such tensor
    (:attr:`~pagedattn.model.architecture.Architecture.layer_roles`)."""

    attn_norm: np.ndarray  # (H,)
    qkv: tuple[Matrix, Matrix, Matrix]  # q (nh * D, H), k (nkv * D, H), v (nkv * D, H)
    o: Matrix  # (H, nh * D)
    mlp_norm: np.ndarray  # (H,)
    gate_up: tuple[Matrix, Matrix]  # gate (I, H), up (I, H)
    down: Matrix  # (H, I)
    qkv_bias: np.ndarray | None = None  # ((nh + 2 nkv) * D,): q, k, v biases end to end
    q_norm: np.ndarray | None = None  # (D,) per-head RMSNorm of q
    k_norm: np.ndarray | None = None  # (D,)
    post_attn_norm: np.ndarray | None = None  # (H,) norm of the attention output
    post_mlp_norm: np.ndarray | None = None  # (H,) norm of the MLP output
    by_role: Mapping[str, Matrix] = field(default_factory=dict, compare=False, repr=False)

    def roles(self) -> Iterator[tuple[str, Matrix]]:
        """(role, stored tensor) of every tensor the table loaded for this layer, in the table's
        role order: what the weights fingerprint hashes."""
        yield from self.by_role.items()

    def fused_args(self) -> tuple[object, ...] | None:
        """The weights as :func:`~pagedattn.model.decode_layer.decode_layer` takes them after
        ``x`` and ``eps`` (norms, block rows, kinds, and the kind set of every kind the
        matrices are compiled for: ``compiled_kinds``), or None when a projection is not
        block-quantized. The optional tensors are passed separately (:meth:`fused_extras`)."""
        q, k, v = self.qkv
        gate, up = self.gate_up
        mats = (q, k, v, self.o, gate, up, self.down)
        if not all(isinstance(m, BlockQuantized) for m in mats):
            return None
        bq, bk, bv, bo, bg, bu, bd = (m for m in mats if isinstance(m, BlockQuantized))
        return (
            self.attn_norm, self.mlp_norm, bq.blocks, bk.blocks, bv.blocks,
            (bq.kind, bk.kind, bv.kind), bo.blocks, bo.kind, bg.blocks, bu.blocks,
            (bg.kind, bu.kind), bd.blocks, bd.kind, kind_set_of((bq, bk, bv, bo, bg, bu, bd)),
        )  # fmt: skip

    def fused_extras(self) -> tuple[np.ndarray, ...]:
        """The family's optional tensors as the fused layer takes them: qkv bias, q/k norms,
        the two output norms, each a writable float32 vector, empty where the family has none
        (one compiled layer serves every family: a None would compile a layer per family)."""
        extras = (self.qkv_bias, self.q_norm, self.k_norm, self.post_attn_norm, self.post_mlp_norm)
        return tuple(_NONE if e is None else np.array(e, np.float32) for e in extras)

    @classmethod
    def from_stored(
        cls,
        arch: Architecture,
        layer: int,
        matrix: Callable[[str], Matrix],
        f32: Callable[[str], np.ndarray],
    ) -> LayerWeights:
        """Layer ``layer`` of a family: ``matrix`` gives a linear in its stored form by its
        ``LoadedModel.weights`` name, ``f32`` a norm's or bias's float32 values."""
        roles = arch.layer_roles

        def name(role: str) -> str:
            return arch.hf_name(role, layer)

        linear = {"q", "k", "v", "o", "gate", "up", "down"}
        t = {r: matrix(name(r)) if r in linear else f32(name(r)) for r in roles}

        def opt(role: str) -> np.ndarray | None:
            value = t.get(role)
            return value if isinstance(value, np.ndarray) else None

        bias = None
        if arch.qkv_bias:
            bias = np.concatenate([np.asarray(t[r]) for r in ("q_bias", "k_bias", "v_bias")])
        return cls(
            attn_norm=np.asarray(t["attn_norm"]),
            qkv=(t["q"], t["k"], t["v"]),
            o=t["o"],
            mlp_norm=np.asarray(t["mlp_norm"]),
            gate_up=(t["gate"], t["up"]),
            down=t["down"],
            qkv_bias=None if bias is None else np.ascontiguousarray(bias, dtype=np.float32),
            q_norm=opt("q_norm"),
            k_norm=opt("k_norm"),
            post_attn_norm=opt("post_attn_norm"),
            post_mlp_norm=opt("post_mlp_norm"),
            by_role=t,
        )
