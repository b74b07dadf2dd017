"""The Llama decoder forward pass in float32 NumPy, over a paged KV cache.

Architecture: Touvron et al. 2023, "LLaMA" (arXiv 2302.13971) as implemented by
``transformers.models.llama.modeling_llama``: token embeddings, then per layer
``x += o_proj(attention(rope(q), rope(k), v))`` after RMSNorm (Zhang & Sennrich 2019) and
``x += down(silu(gate(h)) * up(h))`` (SwiGLU, Shazeer 2020) after RMSNorm; a final RMSNorm and
the LM head (tied to the embeddings when the checkpoint says so). Attention is grouped-query
(Ainslie et al. 2023) and reads K/V from pages through :mod:`pagedattn.kernels.paged`.

No global state: everything a call needs is the ForwardBatch and the KV pool it is handed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pagedattn.config import ModelConfig
from pagedattn.kernels.attention_mass import page_attention_mass
from pagedattn.kernels.paged import paged_attention_decode, paged_attention_prefill, write_kv
from pagedattn.kernels.rope import apply_rope_cos_sin, rope_cos_sin
from pagedattn.model.forward_batch import ForwardBatch
from pagedattn.model.quantized import BlockQuantized, qmatmul
from pagedattn.model.weights import check_weights

if TYPE_CHECKING:
    from pagedattn.model.loader import LoadedModel

# Up to this many rows, a projection with block-quantized weights runs the int8 Numba kernel
# (reads 4x fewer bytes: decode is bandwidth-bound); more rows go to float32 BLAS GEMM.
QUANTIZED_MAX_ROWS = 4


@dataclass(frozen=True)
class _Layer:
    """One decoder layer's weights, packed once at load time for copy-free BLAS calls."""

    attn_norm: np.ndarray  # (H,)
    w_qkv_t: np.ndarray  # (H, (nh + 2 * nkv) * D): [q | k | v] columns, x @ w_qkv_t
    w_o_t: np.ndarray  # (nh * D, H)
    mlp_norm: np.ndarray  # (H,)
    w_gate_up_t: np.ndarray  # (H, 2 * I): [gate | up] columns
    w_down_t: np.ndarray  # (I, H)
    q_qkv: BlockQuantized | None  # ((nh + 2 nkv) * D, H) same matrix in exact block form
    q_o: BlockQuantized | None  # (H, nh * D)
    q_gate_up: BlockQuantized | None  # (2 I, H)
    q_down: BlockQuantized | None  # (H, I)


def linear(x: np.ndarray, w_t: np.ndarray, w_q: BlockQuantized | None) -> np.ndarray:
    """``x @ w_t`` (x: (T, in), w_t: (in, out) float32), via the block-quantized copy ``w_q``
    of the same matrix when there is one and T <= QUANTIZED_MAX_ROWS. Returns (T, out) float32."""
    if w_q is not None and x.shape[0] <= QUANTIZED_MAX_ROWS:
        return qmatmul(x, w_q)
    out: np.ndarray = x @ w_t
    return out


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm: ``weight * x / sqrt(mean(x^2) + eps)`` over the last axis, float32.

    Args:
        x: (num_tokens, hidden) float32.
        weight: (hidden,) float32.
        eps: added to the mean square.

    Returns:
        A new (num_tokens, hidden) float32 array.
    """
    mean_sq = np.einsum("th,th->t", x, x)[:, None] / np.float32(x.shape[1])  # (T, 1)
    inv = 1.0 / np.sqrt(mean_sq + np.float32(eps))  # (T, 1)
    out: np.ndarray = (x * inv) * weight  # (T, H)
    return out


def silu_mul(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """``silu(gate) * up`` with ``silu(g) = g * sigmoid(g)``, sigmoid via tanh (no overflow)."""
    out = np.tanh(gate * np.float32(0.5))  # (T, I)
    out += np.float32(1.0)
    out *= np.float32(0.5)  # sigmoid(gate)
    out *= gate
    out *= up
    return out


class LlamaModel:
    """A Llama-architecture decoder whose attention runs on the paged KV pool.

    Args:
        config: model shape and numerics.
        weights: float32 tensors by Hugging Face name, (out, in) linears, q/k rows in HF
            (rotate-half) order, as returned by :func:`pagedattn.model.loader.load_model`.
        quantized: optional exact block forms of the same matrices (``LoadedModel.quantized``);
            used for steps of at most QUANTIZED_MAX_ROWS tokens, where they give the same
            logits to float32 rounding while reading 4x fewer bytes.

    Raises:
        ValueError: a missing tensor or one whose shape disagrees with ``config``.
    """

    def __init__(
        self,
        config: ModelConfig,
        weights: dict[str, np.ndarray],
        quantized: Mapping[str, BlockQuantized] | None = None,
    ) -> None:
        check_weights(config, weights, "LlamaModel weights")
        self.config = config
        quantized = quantized or {}

        def fused(*names: str) -> BlockQuantized | None:
            """Block form of the row-concatenation of ``names``, if every part has one."""
            if not all(n in quantized for n in names):
                return None
            return BlockQuantized.concat([quantized[n] for n in names])

        def f32(name: str) -> np.ndarray:
            return np.ascontiguousarray(weights[name], dtype=np.float32)

        self.embed = f32("model.embed_tokens.weight")  # (V, H)
        head = self.embed if config.tie_word_embeddings else f32("lm_head.weight")  # (V, H)
        self.lm_head_t = head.T  # (H, V) view: logits = h @ lm_head_t (BLAS transposes in place)
        head_name = "model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight"
        self.q_lm_head = fused(head_name)  # (V, H) block form, or None
        self.final_norm = f32("model.norm.weight")  # (H,)
        self.layers: list[_Layer] = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            qkv = np.concatenate(
                [
                    f32(p + "self_attn.q_proj.weight"),
                    f32(p + "self_attn.k_proj.weight"),
                    f32(p + "self_attn.v_proj.weight"),
                ]
            )  # ((nh + 2 nkv) * D, H)
            gate_up = np.concatenate(
                [f32(p + "mlp.gate_proj.weight"), f32(p + "mlp.up_proj.weight")]
            )  # (2 I, H)
            self.layers.append(
                _Layer(
                    attn_norm=f32(p + "input_layernorm.weight"),
                    w_qkv_t=np.ascontiguousarray(qkv.T),
                    w_o_t=np.ascontiguousarray(f32(p + "self_attn.o_proj.weight").T),
                    mlp_norm=f32(p + "post_attention_layernorm.weight"),
                    w_gate_up_t=np.ascontiguousarray(gate_up.T),
                    w_down_t=np.ascontiguousarray(f32(p + "mlp.down_proj.weight").T),
                    q_qkv=fused(*(p + f"self_attn.{n}_proj.weight" for n in "qkv")),
                    q_o=fused(p + "self_attn.o_proj.weight"),
                    q_gate_up=fused(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"),
                    q_down=fused(p + "mlp.down_proj.weight"),
                )
            )

    @classmethod
    def from_loaded(cls, loaded: LoadedModel) -> LlamaModel:
        """The model of a :func:`pagedattn.model.loader.load_model` result, block-quantized
        decode path included (prefer this to ``LlamaModel(loaded.config, loaded.weights)``)."""
        return cls(loaded.config, loaded.weights, loaded.quantized)

    def kv_shape(self, num_pages: int, page_size: int) -> tuple[int, int, int, int, int, int]:
        """Shape of the KV pool this model reads: (layers, 2, num_pages, kv_heads, page_size, D)."""
        c = self.config
        return (c.num_layers, 2, num_pages, c.num_kv_heads, page_size, c.head_dim)

    def _check_kv(self, kv: np.ndarray) -> None:
        c = self.config
        expected = (c.num_layers, 2, c.num_kv_heads, c.head_dim)
        got = (kv.shape[0], kv.shape[1], kv.shape[3], kv.shape[5]) if kv.ndim == 6 else None
        if got != expected or kv.dtype != np.float32 or not kv.flags.c_contiguous:
            raise ValueError(
                f"kv: expected C-contiguous float32 (num_layers={c.num_layers}, 2, num_pages, "
                f"num_kv_heads={c.num_kv_heads}, page_size, head_dim={c.head_dim}), "
                f"got {kv.dtype} {kv.shape}"
            )

    def forward(
        self, batch: ForwardBatch, kv: np.ndarray, attention_mass: np.ndarray | None = None
    ) -> np.ndarray:
        """Run the new tokens of ``batch`` through the model, writing their K/V into ``kv``.

        Args:
            batch: the flat batch (input_ids, positions, slot_mapping, page_tables, ...).
            kv: (num_layers, 2, num_pages, num_kv_heads, page_size, head_dim) float32 pool;
                updated in place at ``batch.slot_mapping``.
            attention_mass: opt-in (H2O eviction, :mod:`pagedattn.kernels.attention_mass`):
                float32 ``batch.page_tables.shape``, to which a decode step adds, per page, the
                softmax mass its keys received, summed over heads and layers. None (the
                default) leaves the attention path as it is.

        Returns:
            (len(batch.logits_indices), vocab_size) float32 logits of the requested rows.

        Raises:
            ValueError: a KV pool of the wrong shape/dtype, token ids outside the vocabulary,
                any kernel argument error (the kernels name the expected shape), or
                ``attention_mass`` of the wrong shape or with a batch that is not a decode step.
        """
        c = self.config
        self._check_kv(kv)
        if attention_mass is not None and (
            not batch.is_decode or attention_mass.shape != batch.page_tables.shape
        ):
            raise ValueError(
                f"attention_mass: expected a decode batch and shape {batch.page_tables.shape}, "
                f"got is_decode={batch.is_decode}, shape {attention_mass.shape}"
            )
        T, nh, nkv, D = batch.num_tokens, c.num_heads, c.num_kv_heads, c.head_dim
        ids = np.asarray(batch.input_ids)
        if T and (ids.min() < 0 or ids.max() >= c.vocab_size):
            raise ValueError(f"input_ids must be in [0, {c.vocab_size})")
        cos, sin = rope_cos_sin(batch.positions, D, c.rope_theta, c.rope_freq_factors)  # (T, D/2)
        sink_cos_sin = None
        if batch.sink_positions is not None:
            sink_cos_sin = rope_cos_sin(batch.sink_positions, D, c.rope_theta, c.rope_freq_factors)
        x = self.embed[ids]  # (T, H)
        for li, layer in enumerate(self.layers):
            h = rms_norm(x, layer.attn_norm, c.rms_norm_eps)  # (T, H)
            qkv = linear(h, layer.w_qkv_t, layer.q_qkv)  # (T, (nh + 2 nkv) * D)
            q = qkv[:, : nh * D].reshape(T, nh, D)  # (T, nh, D) un-rotated
            k = qkv[:, nh * D : (nh + nkv) * D].reshape(T, nkv, D)  # (T, nkv, D)
            v = np.ascontiguousarray(qkv[:, (nh + nkv) * D :]).reshape(T, nkv, D)  # (T, nkv, D)
            q_rot = apply_rope_cos_sin(q, cos, sin)  # (T, nh, D)
            k_rot = apply_rope_cos_sin(k, cos, sin)  # (T, nkv, D)
            q_sink = None if sink_cos_sin is None else apply_rope_cos_sin(q, *sink_cos_sin)
            k_cache, v_cache = kv[li, 0], kv[li, 1]  # (num_pages, nkv, page_size, D) each
            write_kv(k_cache, v_cache, k_rot, v, batch.slot_mapping)
            if batch.is_decode:
                attn = paged_attention_decode(
                    q_rot,
                    k_cache,
                    v_cache,
                    batch.page_tables,
                    batch.context_lens,
                    sliding_window=batch.sliding_window,
                    num_sink_tokens=batch.num_sink_tokens,
                    q_sink=q_sink,
                    return_lse=attention_mass is not None,
                )  # (num_seqs = T, nh, D) [, lse (T, nh)]
                if attention_mass is not None:
                    assert isinstance(attn, tuple)
                    attn, lse = attn
                    attention_mass += page_attention_mass(
                        q_rot,
                        k_cache,
                        batch.page_tables,
                        batch.context_lens,
                        lse,
                        sliding_window=batch.sliding_window,
                        num_sink_tokens=batch.num_sink_tokens,
                        q_sink=q_sink,
                    )  # (num_seqs, max_pages_per_seq)
            else:
                attn = paged_attention_prefill(
                    q_rot,
                    k_cache,
                    v_cache,
                    batch.page_tables,
                    batch.query_start_loc,
                    batch.context_lens,
                    sliding_window=batch.sliding_window,
                    num_sink_tokens=batch.num_sink_tokens,
                    q_sink=q_sink,
                )  # (T, nh, D)
            assert isinstance(attn, np.ndarray)
            x += linear(attn.reshape(T, nh * D), layer.w_o_t, layer.q_o)  # (T, H)
            h = rms_norm(x, layer.mlp_norm, c.rms_norm_eps)  # (T, H)
            gate_up = linear(h, layer.w_gate_up_t, layer.q_gate_up)  # (T, 2 I)
            inter = c.intermediate_size
            act = silu_mul(gate_up[:, :inter], gate_up[:, inter:])  # (T, I)
            x += linear(act, layer.w_down_t, layer.q_down)  # (T, H)
        rows = x[np.asarray(batch.logits_indices)]  # (num_outputs, H)
        rows = rms_norm(rows, self.final_norm, c.rms_norm_eps)  # (num_outputs, H)
        return linear(rows, self.lm_head_t, self.q_lm_head)  # (num_outputs, V)
