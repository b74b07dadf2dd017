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
from typing import TYPE_CHECKING

import numpy as np

from pagedattn.config import ModelConfig
from pagedattn.kernels.attention_mass import decode_adding_page_mass
from pagedattn.kernels.kv_dtype import POOL_DTYPES, kernel_cache, logical_shape, pool_row_width
from pagedattn.kernels.paged_checks import CacheShape
from pagedattn.kernels.paged_plan import plan_slots, write_kv_planned
from pagedattn.kernels.rope import apply_rope_cos_sin, rope_cos_sin
from pagedattn.kernels.target import has_wide_registers
from pagedattn.model.attention_split import AttentionSplit
from pagedattn.model.block_dot import DECODE_COLS
from pagedattn.model.decode_layer import decode_layer
from pagedattn.model.forward_batch import ForwardBatch
from pagedattn.model.layer_weights import LayerWeights
from pagedattn.model.quantized import (
    BlockQuantized,
    Matrix,
    check_activations,
    dequantize_rows,
    qmatmul,
)
from pagedattn.model.row_ops import rms_norm, silu_mul
from pagedattn.model.weights import check_weights, expected_weight_shapes

if TYPE_CHECKING:
    from pagedattn.kernels.paged_checks import SlotPlan
    from pagedattn.kernels.paged_plan import DecodePlan
    from pagedattn.model.loader import LoadedModel

# Up to this many decode rows (sequences, or one sequence's verify rows), a step runs each layer
# as one compiled call (decode_layer), its projections decoding each weight block in registers
# once per DECODE_COLS rows (at most twice with 32 registers; once with 16, where a second
# register pass costs more than the general path's decoded scratch): bitwise the general
# path's results, without its per-operation calls.
FUSED_MAX_ROWS = (2 if has_wide_registers() else 1) * DECODE_COLS


class LlamaModel:
    """A Llama-architecture decoder whose attention runs on the paged KV pool.

    Every linear layer, the LM head and the embedding lookup read the weights in the form the
    checkpoint stores them: GGUF blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K;
    ``quantized``) decoded one row at a time inside :func:`~pagedattn.model.quantized.qmatmul`,
    float32 arrays otherwise; no float32 copy of a quantized matrix is ever made.

    Batch invariance (the default NumPy backend): a token's logits are bitwise the same
    whether its sequence runs alone or in any batch, decode-only or mixed with prefill
    chunks. Every per-token operation goes through one code path whatever the batch: the
    projections are :func:`qmatmul` (one fixed dot product per (token, output)), RMSNorm and
    SwiGLU loop per row, RoPE and the residual adds are elementwise, decode rows (sequences
    with one new token) always use :func:`paged_attention_decode` with splits chosen from the
    sequence's own length, and prefill rows use :func:`paged_attention_prefill`, whose tiles
    hold rows of one sequence only; a decode step of up to ``FUSED_MAX_ROWS`` rows runs
    those same kernels, in the same order, one compiled call per layer
    (:mod:`pagedattn.model.decode_layer`). What does depend on scheduling: a prompt's results depend
    on how it is cut into chunks (rows of a chunk share prefill tiles of 32 rows counted from
    the chunk's start), which the scheduler fixes from the prompt's own length.

    Args:
        config: model shape and numerics.
        weights: float32 tensors by Hugging Face name, (out, in) linears, q/k rows in HF
            (rotate-half) order; those present in ``quantized`` are not read (a lazy mapping,
            as :func:`pagedattn.model.loader.load_model` returns, never dequantizes them).
        quantized: exact block forms (``LoadedModel.quantized``), used instead of ``weights``.
        activations: ``"float32"`` (default, exact) or ``"int8"``: the block-quantized
            projections and LM head quantize their input per 32-input block to int8, as
            llama.cpp does
            (:func:`~pagedattn.model.quantized.qmatmul`): faster decoding, logits no longer
            within 1e-3 of HF (``pagedattn bench generate --activations int8`` prints the
            deviation). Still batch-invariant.
        fused_decode: run each layer of a decode step of up to ``FUSED_MAX_ROWS`` rows as one
            compiled call (:mod:`pagedattn.model.decode_layer`; bitwise the same results,
            less per-operation overhead). False always takes the step-by-step path.

    Raises:
        ValueError: a missing tensor or one whose shape disagrees with ``config``, or
            activations not ``float32`` / ``int8`` (int8 needs AVX2).
    """

    def __init__(
        self,
        config: ModelConfig,
        weights: Mapping[str, np.ndarray],
        quantized: Mapping[str, BlockQuantized] | None = None,
        activations: str = "float32",
        fused_decode: bool = True,
    ) -> None:
        check_activations(activations)
        self.activations = activations
        blocks = dict(quantized or {})
        stored: dict[str, Matrix] = {
            n: blocks[n] if n in blocks else weights[n]
            for n in expected_weight_shapes(config)
            if n in blocks or n in weights
        }
        check_weights(config, stored, "LlamaModel weights")
        self.config = config

        def matrix(name: str) -> Matrix:
            if name in blocks:
                return blocks[name]
            return np.ascontiguousarray(weights[name], dtype=np.float32)

        def f32(name: str) -> np.ndarray:
            return np.ascontiguousarray(weights[name], dtype=np.float32)

        self.embed = matrix("model.embed_tokens.weight")  # (V, H)
        self.lm_head = (
            self.embed if config.tie_word_embeddings else matrix("lm_head.weight")
        )  # (V, H)
        self.final_norm = f32("model.norm.weight")  # (H,)
        self.layers = [
            LayerWeights.from_stored(f"model.layers.{i}.", matrix, f32)
            for i in range(config.num_layers)
        ]
        fused = [layer.fused_args() for layer in self.layers]
        self._fused: list[tuple[object, ...]] | None = None
        int8_ready = activations != "int8" or all(
            m.int8_capable for m in blocks.values()
        )  # the fused int8 step reads Q4_0 / Q4_1 / Q8_0 only; other types take the general path
        if fused_decode and int8_ready and all(f is not None for f in fused):
            self._fused = [f for f in fused if f is not None]

    @classmethod
    def from_loaded(cls, loaded: LoadedModel, activations: str = "float32") -> LlamaModel:
        """The model of a :func:`pagedattn.model.loader.load_model` result, reading quantized
        matrices in block form (prefer this to ``LlamaModel(loaded.config, loaded.weights)``,
        which would dequantize them); ``activations`` as in the class."""
        return cls(loaded.config, loaded.weights, loaded.quantized, activations)

    def kv_shape(
        self, num_pages: int, page_size: int, dtype: str = "float32"
    ) -> tuple[int, int, int, int, int, int]:
        """Shape of the KV pool this model reads: (layers, 2, num_pages, kv_heads, page_size, D),
        D + 4 for an int8 pool (:func:`~pagedattn.kernels.kv_dtype.pool_row_width`)."""
        c = self.config
        width = pool_row_width(dtype, c.head_dim)
        return (c.num_layers, 2, num_pages, c.num_kv_heads, page_size, width)

    def _check_kv(self, kv: np.ndarray) -> None:
        c = self.config
        expected = (c.num_layers, 2, c.num_kv_heads, c.head_dim)
        ok = kv.ndim == 6 and kv.dtype in POOL_DTYPES and kv.flags.c_contiguous
        shape = logical_shape(kv.shape, kv.dtype) if ok else ()
        got = (shape[0], shape[1], shape[3], shape[5]) if ok else None
        if got != expected or (kv.dtype == np.int8 and c.head_dim % 4):
            raise ValueError(
                f"kv: expected C-contiguous float32, float16 or int8 (num_layers={c.num_layers}, "
                f"2, num_pages, num_kv_heads={c.num_kv_heads}, page_size, head_dim={c.head_dim}; "
                f"int8 rows hold head_dim + 4), got {kv.dtype} {kv.shape}"
            )

    def _embed(self, ids: np.ndarray) -> np.ndarray:
        """(T, H) float32 embedding rows of ``ids``."""
        if isinstance(self.embed, BlockQuantized):
            return dequantize_rows(self.embed, ids)
        out: np.ndarray = self.embed[ids]
        return out

    def forward(
        self, batch: ForwardBatch, kv: np.ndarray, attention_mass: np.ndarray | None = None
    ) -> np.ndarray:
        """Run the new tokens of ``batch`` through the model, writing their K/V into ``kv``.

        Args:
            batch: the flat batch (input_ids, positions, slot_mapping, page_tables, ...).
            kv: (num_layers, 2, num_pages, num_kv_heads, page_size, head_dim) float32, float16
                or int8 (rows head_dim + 4 wide: codes and a scale) pool; updated in place at
                ``batch.slot_mapping``.
            attention_mass: opt-in (H2O eviction, :mod:`pagedattn.kernels.attention_mass`):
                float32 ``batch.page_tables.shape``, to which a decode step adds, per page, the
                softmax mass its keys received, summed over heads and layers. None (the
                default) leaves the attention path as it is.

        Returns:
            (len(batch.logits_indices), vocab_size) float32 logits of the requested rows; each
            row bitwise independent of the rest of the batch (see the class docstring).

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
        T, D = batch.num_tokens, c.head_dim
        ids = np.asarray(batch.input_ids)
        if T and (ids.min() < 0 or ids.max() >= c.vocab_size):
            raise ValueError(f"input_ids must be in [0, {c.vocab_size})")
        cos, sin = rope_cos_sin(batch.positions, D, c.rope_theta, c.rope_freq_factors)  # (T, D/2)
        sink_cos_sin = None
        if batch.sink_positions is not None:
            sink_cos_sin = rope_cos_sin(batch.sink_positions, D, c.rope_theta, c.rope_freq_factors)
        split = AttentionSplit(batch)
        cache_shape: CacheShape = logical_shape(kv.shape[2:], kv.dtype)  # type: ignore[assignment]
        slots = plan_slots(batch.slot_mapping, T, cache_shape)  # validated once, every layer
        x = self._embed(ids)  # (T, H)
        if (
            self._fused is not None
            and 0 < T <= FUSED_MAX_ROWS
            and split.decode_only
            and sink_cos_sin is None
            and attention_mass is None
        ):
            self._decode_layers(x, kv, cos, sin, slots, split.decode_plan(cache_shape))
        else:
            self._layers(x, kv, batch, split, slots, cos, sin, sink_cos_sin, attention_mass)
        rows = x[np.asarray(batch.logits_indices)]  # (num_outputs, H)
        rows = rms_norm(rows, self.final_norm, c.rms_norm_eps)  # (num_outputs, H)
        return qmatmul(rows, self.lm_head, activations=self.activations)  # (num_outputs, V)

    def _decode_layers(
        self,
        x: np.ndarray,
        kv: np.ndarray,
        cos: np.ndarray,
        sin: np.ndarray,
        slots: SlotPlan,
        plan: DecodePlan,
    ) -> None:
        """Every layer of a decode step, one compiled call each (see :meth:`_layers`)."""
        c = self.config
        eps = np.float32(c.rms_norm_eps)
        int8 = True if self.activations == "int8" else None  # the compiled path: see decode_layer
        pool = kernel_cache(kv)  # float16 pools as their uint16 bits
        for li, weights in enumerate(self._fused or ()):
            decode_layer(  # type: ignore[call-arg]
                x, eps, *weights, int8, c.num_heads, cos, sin, slots.keep,
                slots.pages, slots.offsets, pool[li, 0], pool[li, 1], plan.tables, plan.ctx,
                plan.splits, plan.num_splits, plan.scale, plan.window, plan.num_sink_tokens,
            )  # fmt: skip

    def _layers(
        self,
        x: np.ndarray,
        kv: np.ndarray,
        batch: ForwardBatch,
        split: AttentionSplit,
        slots: SlotPlan,
        cos: np.ndarray,
        sin: np.ndarray,
        sink_cos_sin: tuple[np.ndarray, np.ndarray] | None,
        attention_mass: np.ndarray | None,
    ) -> None:
        """Every layer, one operation at a time (any batch), updating ``x`` (T, H) in place."""
        c = self.config
        T, nh, nkv, D = batch.num_tokens, c.num_heads, c.num_kv_heads, c.head_dim
        act_mode = self.activations
        for li, layer in enumerate(self.layers):
            h = rms_norm(x, layer.attn_norm, c.rms_norm_eps)  # (T, H)
            qkv = qmatmul(h, *layer.qkv, activations=act_mode)  # (T, (nh + 2 nkv) * D)
            q = qkv[:, : nh * D].reshape(T, nh, D)  # (T, nh, D) un-rotated
            k = qkv[:, nh * D : (nh + nkv) * D].reshape(T, nkv, D)  # (T, nkv, D)
            v = np.ascontiguousarray(qkv[:, (nh + nkv) * D :]).reshape(T, nkv, D)  # (T, nkv, D)
            q_rot = apply_rope_cos_sin(q, cos, sin)  # (T, nh, D)
            k_rot = apply_rope_cos_sin(k, cos, sin)  # (T, nkv, D)
            q_sink = None if sink_cos_sin is None else apply_rope_cos_sin(q, *sink_cos_sin)
            k_cache, v_cache = kv[li, 0], kv[li, 1]  # (num_pages, nkv, page_size, D) each
            write_kv_planned(slots, k_cache, v_cache, k_rot, v)
            if attention_mass is None:
                attn = split.attention(q_rot, q_sink, k_cache, v_cache)  # (T, nh, D)
            else:  # opt-in (eval lab): a decode step that also reports the mass per page
                attn = decode_adding_page_mass(
                    q_rot, k_cache, v_cache, batch.page_tables, batch.context_lens,
                    sliding_window=batch.sliding_window, num_sink_tokens=batch.num_sink_tokens,
                    q_sink=q_sink, attention_mass=attention_mass,
                )  # fmt: skip
            x += qmatmul(attn.reshape(T, nh * D), layer.o, activations=act_mode)  # (T, H)
            h = rms_norm(x, layer.mlp_norm, c.rms_norm_eps)  # (T, H)
            gate_up = qmatmul(h, *layer.gate_up, activations=act_mode)  # (T, 2 I)
            act = silu_mul(gate_up)  # (T, I)
            x += qmatmul(act, layer.down, activations=act_mode)  # (T, H)
