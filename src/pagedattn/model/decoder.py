"""The decoder forward pass in float32 NumPy, over a paged KV cache, for every family of
:mod:`pagedattn.model.architecture` (Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma 3).

Architecture: Touvron et al. 2023, "LLaMA" (arXiv 2302.13971) as implemented by
``transformers.models.llama.modeling_llama``, with the families' variations read from the
table: token embeddings (scaled by ``sqrt(hidden)`` for Gemma), then per layer
(:func:`pagedattn.model.layer_loop.run_layer`) RMSNorm, q/k/v projections (with biases for
Qwen2, per-head q/k RMSNorm for Qwen3 and Gemma 3), RoPE with the layer's base, grouped-query
attention (Ainslie et al. 2023) over the layer's window from pages
(:mod:`pagedattn.kernels.paged`), the output projection (normed again for Gemma), and the
gated MLP (SwiGLU, Shazeer 2020, or tanh-GELU for Gemma); a final RMSNorm, the LM head (tied
to the embeddings when the checkpoint says so) and, where a family has it, logit soft-capping.

No global state: everything a call needs is the ForwardBatch and the KV pool it is handed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from pagedattn.config import ModelConfig
from pagedattn.kernels.kv_dtype import POOL_DTYPES, kernel_cache, logical_shape, pool_row_width
from pagedattn.kernels.numba_runtime import install as install_numba_runtime
from pagedattn.kernels.paged_checks import CacheShape
from pagedattn.kernels.paged_plan import plan_slots
from pagedattn.kernels.rope import rope_cos_sin
from pagedattn.kernels.target import has_wide_registers
from pagedattn.model.architecture import architecture_of, expected_weight_shapes
from pagedattn.model.attention_split import AttentionSplit
from pagedattn.model.block_dot import DECODE_COLS
from pagedattn.model.decode_layer import decode_layer
from pagedattn.model.forward_batch import ForwardBatch
from pagedattn.model.layer_loop import (
    ACTIVATION_KERNELS,
    LayerStep,
    OpHook,
    RopeTables,
    direct,
    run_layer,
)
from pagedattn.model.layer_weights import LayerWeights
from pagedattn.model.quantized import (
    BlockQuantized,
    Matrix,
    check_activations,
    dequantize_rows,
    qmatmul,
)
from pagedattn.model.row_ops import rms_norm
from pagedattn.model.weights import check_weights

if TYPE_CHECKING:
    from pagedattn.kernels.paged_checks import SlotPlan
    from pagedattn.model.loader import LoadedModel

# Before the first kernel loads: Numba's per-process memory (parsed IR kept beside each cached
# kernel, its runtime compiled at every start, SciPy's BLAS probe), cut as
# kernels/numba_runtime.py describes.
install_numba_runtime()

# Up to this many decode rows (sequences, or one sequence's verify rows), a step runs each layer
# as one compiled call (decode_layer), its projections decoding each weight block in registers
# once per DECODE_COLS rows (at most twice with 32 registers; once with 16, where a second
# register pass costs more than the general path's decoded scratch): bitwise the general
# path's results, without its per-operation calls.
FUSED_MAX_ROWS = (2 if has_wide_registers() else 1) * DECODE_COLS


class DecoderModel:
    """A decoder of one of the table's families whose attention runs on the paged KV pool.

    Every linear layer, the LM head and the embedding lookup read the weights in the form the
    checkpoint stores them: GGUF blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K;
    ``quantized``) decoded one row at a time inside :func:`~pagedattn.model.quantized.qmatmul`,
    float32 arrays otherwise; no float32 copy of a quantized matrix is ever made.

    Batch invariance (the default NumPy backend): a token's logits are bitwise the same
    whether its sequence runs alone or in any batch, decode-only or mixed with prefill
    chunks. Every per-token operation goes through one code path whatever the batch: the
    projections are :func:`qmatmul` (one fixed dot product per (token, output)), RMSNorm and
    the gated activation loop per row, RoPE, biases and the residual adds are elementwise,
    decode rows (sequences with one new token) always use :func:`paged_attention_decode` with
    splits chosen from the sequence's own length, and prefill rows use
    :func:`paged_attention_prefill`, whose tiles hold rows of one sequence only; a decode step
    of up to ``FUSED_MAX_ROWS`` rows runs those same kernels, in the same order, one compiled
    call per layer (:mod:`pagedattn.model.decode_layer`). What does depend on scheduling: a
    prompt's results depend on how it is cut into chunks (rows of a chunk share prefill tiles of
    32 rows counted from the chunk's start), which the scheduler fixes from the prompt's own
    length.

    Args:
        config: model shape and numerics; ``config.architecture`` names the family.
        weights: float32 tensors by their ``LoadedModel.weights`` names (the family's HF names),
            (out, in) linears, q/k rows in HF (rotate-half) order, norms as applied (Gemma's
            ``1 + w`` already added); those present in ``quantized`` are not read (a lazy
            mapping, as :func:`pagedattn.model.loader.load_model` returns, never dequantizes
            them).
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
        ValueError: an architecture not in the table, a missing tensor or one whose shape
            disagrees with ``config``, or activations not ``float32`` / ``int8`` (int8 needs
            AVX2).
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
        self.arch = architecture_of(config)
        self.activations = activations
        # every block matrix's kernels compiled for the kinds of all of them: one compiled
        # kernel (and fused layer) per model, holding its own block types' variants only
        model_kinds = frozenset(b.kind for b in (quantized or {}).values())
        blocks = {n: replace(b, kernel_kinds=model_kinds) for n, b in (quantized or {}).items()}
        stored: dict[str, Matrix] = {
            n: blocks[n] if n in blocks else weights[n]
            for n in expected_weight_shapes(config)
            if n in blocks or n in weights
        }
        check_weights(config, stored, "model weights")
        self.config = config

        def matrix(name: str) -> Matrix:
            if name in blocks:
                return blocks[name]
            return np.ascontiguousarray(weights[name], dtype=np.float32)

        def f32(name: str) -> np.ndarray:
            return np.ascontiguousarray(weights[name], dtype=np.float32)

        arch = self.arch
        self.embed = matrix(arch.hf_name("embed"))  # (V, H)
        self.lm_head = (
            self.embed if config.tie_word_embeddings else matrix(arch.hf_name("lm_head"))
        )  # (V, H)
        self.final_norm = f32(arch.hf_name("final_norm"))  # (H,)
        self.layers = [
            LayerWeights.from_stored(arch, i, matrix, f32) for i in range(config.num_layers)
        ]
        self._glu = ACTIVATION_KERNELS[arch.activation]
        fused = [layer.fused_args() for layer in self.layers]
        self._fused: list[tuple[object, ...]] | None = None
        self._fused_extras: list[tuple[np.ndarray, ...]] = []
        if fused_decode and all(f is not None for f in fused):
            self._fused = [f for f in fused if f is not None]
            self._fused_extras = [layer.fused_extras() for layer in self.layers]
        # the fused layer's int8 argument: True with int8 activations (every block matrix on
        # the int8 path, as qmatmul runs it), None for its exact specialization
        self._int8 = True if activations == "int8" else None

    @classmethod
    def from_loaded(cls, loaded: LoadedModel, activations: str = "float32") -> DecoderModel:
        """The model of a :func:`pagedattn.model.loader.load_model` result, reading quantized
        matrices in block form (prefer this to ``DecoderModel(loaded.config, loaded.weights)``,
        which would dequantize them); ``activations`` as in the class."""
        return cls(loaded.config, loaded.weights, loaded.quantized, activations)

    def named_tensors(self) -> list[tuple[str, Matrix]]:
        """Every tensor the table loaded, by place (``embed``, ``lm_head`` unless tied,
        ``final_norm``, ``layers.{i}.{role}`` for each of the family's layer roles), in a fixed
        order: what the weights fingerprint hashes."""
        out: list[tuple[str, Matrix]] = [("embed", self.embed)]
        if self.lm_head is not self.embed:
            out.append(("lm_head", self.lm_head))
        out.append(("final_norm", self.final_norm))
        for i, layer in enumerate(self.layers):
            out += [(f"layers.{i}.{role}", t) for role, t in layer.roles()]
        return out

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
        """(T, H) float32 embedding rows of ``ids`` (times the family's embedding scale)."""
        if isinstance(self.embed, BlockQuantized):
            out = dequantize_rows(self.embed, ids)
        else:
            out = self.embed[ids]
        if self.config.embed_scale != 1.0:
            out = out * np.float32(self.config.embed_scale)
        return np.ascontiguousarray(out, dtype=np.float32)

    def _rope_tables(self, positions: np.ndarray) -> list[RopeTables]:
        """Each layer's (cos, sin) tables for ``positions`` (one computation per distinct base)."""
        c = self.config
        by_rope: dict[tuple[float, tuple[float, ...] | None], RopeTables] = {}
        out = []
        for li in range(c.num_layers):
            key = c.layer_rope(li)
            if key not in by_rope:
                by_rope[key] = rope_cos_sin(positions, c.head_dim, key[0], key[1])
            out.append(by_rope[key])
        return out

    def forward(
        self,
        batch: ForwardBatch,
        kv: np.ndarray,
        attention_mass: np.ndarray | None = None,
        hook: OpHook | None = None,
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
            hook: ``hook(kind, fn, *args)`` called for each operation of the general path
                instead of ``fn(*args)`` (the profiler's timers,
                :mod:`pagedattn.model.layer_loop`); a step with a hook never takes the fused
                decode path.

        Returns:
            (len(batch.logits_indices), vocab_size) float32 logits of the requested rows; each
            row bitwise independent of the rest of the batch (see the class docstring).

        Raises:
            ValueError: a KV pool of the wrong shape/dtype, token ids outside the vocabulary,
                any kernel argument error (the kernels name the expected shape), or
                ``attention_mass`` of the wrong shape, with a batch that is not a decode step
                or with a model whose attention scale is not ``1 / sqrt(head_dim)``.
        """
        c = self.config
        op = direct if hook is None else hook
        self._check_kv(kv)
        if attention_mass is not None and (
            batch.num_groups > 1
            or not batch.is_decode
            or attention_mass.shape != batch.page_tables.shape
            or c.attn_scale is not None
        ):
            raise ValueError(
                f"attention_mass: expected a decode batch and shape {batch.page_tables.shape} "
                f"on a model with the default attention scale and one layer group, got "
                f"is_decode={batch.is_decode}, groups={batch.num_groups}, "
                f"shape {attention_mass.shape}, attn_scale={c.attn_scale}"
            )
        T = batch.num_tokens
        ids = np.asarray(batch.input_ids)
        if T and (ids.min() < 0 or ids.max() >= c.vocab_size):
            raise ValueError(f"input_ids must be in [0, {c.vocab_size})")
        ropes = op("rope", self._rope_tables, batch.positions)  # per layer, (T, D/2) each
        sink_ropes = None
        if batch.sink_positions is not None:
            sink_ropes = op("rope", self._rope_tables, batch.sink_positions)
        groups = [batch.for_group(g) for g in range(batch.num_groups)]  # per layer group
        splits = [AttentionSplit(b) for b in groups]
        cache_shape: CacheShape = logical_shape(kv.shape[2:], kv.dtype)  # type: ignore[assignment]
        slots = [plan_slots(b.slot_mapping, T, cache_shape) for b in groups]  # validated once
        x = op("embedding", self._embed, ids)  # (T, H)
        if (
            hook is None
            and self._fused is not None
            and 0 < T <= FUSED_MAX_ROWS
            and splits[0].decode_only
            and sink_ropes is None
            and attention_mass is None
        ):
            self._decode_layers(x, kv, ropes, slots, splits, batch, cache_shape)
        else:
            steps = [
                LayerStep(
                    b,
                    split,
                    s,
                    kv,
                    ropes,
                    sink_ropes,
                    self.activations,
                    attention_mass,
                    self._glu,
                )
                for b, split, s in zip(groups, splits, slots, strict=True)
            ]
            for li, layer in enumerate(self.layers):
                op("layer", run_layer, c, li, layer, x, steps[batch.group_of(li)], op)
        rows = x[np.asarray(batch.logits_indices)]  # (num_outputs, H)
        rows = op("norm", rms_norm, rows, self.final_norm, c.rms_norm_eps)  # (num_outputs, H)
        logits: np.ndarray = op(
            "lm_head", qmatmul, rows, self.lm_head, activations=self.activations
        )  # (num_outputs, V)
        if c.final_logit_softcap is not None:
            cap = np.float32(c.final_logit_softcap)
            logits = np.tanh(logits / cap) * cap
        return logits

    def _decode_layers(
        self,
        x: np.ndarray,
        kv: np.ndarray,
        ropes: list[RopeTables],
        group_slots: list[SlotPlan],
        splits: list[AttentionSplit],
        batch: ForwardBatch,
        cache_shape: CacheShape,
    ) -> None:
        """Every layer of a decode step, one compiled call each (the same kernels, in the same
        order, as :func:`~pagedattn.model.layer_loop.run_layer`); each layer reads its layer
        group's slots and page tables."""
        c = self.config
        eps = np.float32(c.rms_norm_eps)
        gelu = self.arch.activation == "gelu_tanh"
        pool = kernel_cache(kv)  # float16 pools as their uint16 bits
        for li, weights in enumerate(self._fused or ()):
            g = batch.group_of(li)
            slots, split = group_slots[g], splits[g]
            plan = split.decode_plan(cache_shape, c.layer_window(li), c.attn_scale)
            cos, sin = ropes[li]
            decode_layer(  # type: ignore[call-arg]
                x, eps, *weights, self._int8, c.num_heads, cos, sin, slots.keep,
                slots.pages, slots.offsets, pool[li, 0], pool[li, 1], plan.tables, plan.ctx,
                plan.splits, plan.num_splits, plan.scale, plan.window, plan.num_sink_tokens,
                *self._fused_extras[li], gelu,
            )  # fmt: skip
