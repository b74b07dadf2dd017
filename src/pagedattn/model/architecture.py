"""The decoder families this engine runs, described in one table.

Every loader, the NumPy and torch forwards and the weights fingerprint read a family from
here: which tensors a layer holds (by *role*: ``q``, ``k_norm``, ``post_mlp_norm``...), their
names in a Hugging Face checkpoint and in a llama.cpp GGUF, which of them are stored fused
(Phi-3's ``qkv_proj`` / ``gate_up_proj``, split at load), and the numerics that differ
between families (activation, q/k/v bias, per-head q/k RMSNorm, Gemma's extra norms, its
``(1 + w)`` norm weights in HF checkpoints, which llama.cpp's converter folds into the GGUF, and
whether that converter permuted the q/k rows). Per-model numbers (sliding windows, RoPE bases,
attention scale, embedding scale, soft cap) live in :class:`~pagedattn.config.ModelConfig`,
read from the file by :mod:`pagedattn.model.arch_config`.

A layer always computes, with the optional parts present where its family has them::

    h = norm(x, attn_norm); q, k, v = h @ q, k, v (+ q_bias, k_bias, v_bias)
    q, k = norm_per_head(q, q_norm), norm_per_head(k, k_norm); rotate q, k; attend (window)
    x += norm(h @ o, post_attn_norm)
    h = norm(x, mlp_norm); x += norm(act(h @ gate) * (h @ up) @ down, post_mlp_norm)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pagedattn.config import ModelConfig

# Every tensor role of a decoder layer, in the order the fingerprint hashes them.
LAYER_ROLES = (
    "attn_norm",
    "q",
    "k",
    "v",
    "q_bias",
    "k_bias",
    "v_bias",
    "q_norm",
    "k_norm",
    "o",
    "post_attn_norm",
    "mlp_norm",
    "gate",
    "up",
    "down",
    "post_mlp_norm",
)
GLOBAL_ROLES = ("embed", "final_norm", "lm_head")
NORM_ROLES = ("attn_norm", "q_norm", "k_norm", "post_attn_norm", "mlp_norm", "post_mlp_norm")
ACTIVATIONS = ("silu", "gelu_tanh")

_HF_GLOBAL = {
    "embed": "model.embed_tokens.weight",
    "final_norm": "model.norm.weight",
    "lm_head": "lm_head.weight",
}
_GGUF_GLOBAL = {
    "embed": "token_embd.weight",
    "final_norm": "output_norm.weight",
    "lm_head": "output.weight",
}
_HF_LAYER = {
    "attn_norm": "input_layernorm.weight",
    "q": "self_attn.q_proj.weight",
    "k": "self_attn.k_proj.weight",
    "v": "self_attn.v_proj.weight",
    "q_bias": "self_attn.q_proj.bias",
    "k_bias": "self_attn.k_proj.bias",
    "v_bias": "self_attn.v_proj.bias",
    "q_norm": "self_attn.q_norm.weight",
    "k_norm": "self_attn.k_norm.weight",
    "o": "self_attn.o_proj.weight",
    "mlp_norm": "post_attention_layernorm.weight",
    "gate": "mlp.gate_proj.weight",
    "up": "mlp.up_proj.weight",
    "down": "mlp.down_proj.weight",
}
_GGUF_LAYER = {
    "attn_norm": "attn_norm.weight",
    "q": "attn_q.weight",
    "k": "attn_k.weight",
    "v": "attn_v.weight",
    "q_bias": "attn_q.bias",
    "k_bias": "attn_k.bias",
    "v_bias": "attn_v.bias",
    "q_norm": "attn_q_norm.weight",
    "k_norm": "attn_k_norm.weight",
    "o": "attn_output.weight",
    "post_attn_norm": "post_attention_norm.weight",
    "mlp_norm": "ffn_norm.weight",
    "gate": "ffn_gate.weight",
    "up": "ffn_up.weight",
    "down": "ffn_down.weight",
    "post_mlp_norm": "post_ffw_norm.weight",
}
# Gemma's sandwich: "post_attention_layernorm" is the attention output's norm there, and the
# MLP's input norm is "pre_feedforward_layernorm".
_HF_GEMMA = _HF_LAYER | {
    "post_attn_norm": "post_attention_layernorm.weight",
    "mlp_norm": "pre_feedforward_layernorm.weight",
    "post_mlp_norm": "post_feedforward_layernorm.weight",
}


@dataclass(frozen=True)
class Architecture:
    """One decoder family.

    Attributes:
        name: the GGUF ``general.architecture`` value (and our ``ModelConfig.architecture``).
        hf_model_types: ``config.json`` ``model_type`` values of this family.
        qkv_bias: q, k and v projections have biases (Qwen2).
        qk_norm: per-head RMSNorm of q and k before RoPE (Qwen3, Gemma 3).
        sandwich_norms: norms of the attention and MLP outputs before each residual add
            (Gemma: ``post_attention_layernorm``, ``post_feedforward_layernorm``).
        activation: the GLU's gate activation, one of :data:`ACTIVATIONS`.
        hf_norm_offset: HF checkpoints store norm weights ``w`` applied as ``w + offset``
            (Gemma: 1); added at load. llama.cpp's converter already added it in a GGUF.
        scaled_embedding: embedding rows are multiplied by ``sqrt(hidden_size)`` (Gemma).
        gguf_permuted_qk: llama.cpp's converter permuted the q/k rows (its ``LlamaModel``
            for interleaved RoPE); the GGUF loader undoes it. Every other family is loaded as
            written.
        hf_fused / gguf_fused: a stored tensor (layer suffix) holding several roles' rows, in
            order; split at load (Phi-3).
        hf_names / gguf_names: role -> layer tensor suffix (after ``model.layers.{i}.`` /
            ``blk.{i}.``). ``hf_names`` are also the keys of ``LoadedModel.weights``.
    """

    name: str
    hf_model_types: tuple[str, ...]
    qkv_bias: bool = False
    qk_norm: bool = False
    sandwich_norms: bool = False
    activation: str = "silu"
    hf_norm_offset: float = 0.0
    scaled_embedding: bool = False
    gguf_permuted_qk: bool = False
    hf_fused: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    gguf_fused: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    hf_names: Mapping[str, str] = field(default_factory=lambda: dict(_HF_LAYER))
    gguf_names: Mapping[str, str] = field(default_factory=lambda: dict(_GGUF_LAYER))

    @property
    def layer_roles(self) -> tuple[str, ...]:
        """The roles every layer of this family holds, in :data:`LAYER_ROLES` order."""
        skip = set()
        if not self.qkv_bias:
            skip |= {"q_bias", "k_bias", "v_bias"}
        if not self.qk_norm:
            skip |= {"q_norm", "k_norm"}
        if not self.sandwich_norms:
            skip |= {"post_attn_norm", "post_mlp_norm"}
        return tuple(r for r in LAYER_ROLES if r not in skip)

    def hf_name(self, role: str, layer: int | None = None) -> str:
        """The HF name of a role's tensor (``layer`` None for the global roles)."""
        if layer is None:
            return _HF_GLOBAL[role]
        return f"model.layers.{layer}.{self.hf_names[role]}"

    def gguf_name(self, role: str, layer: int | None = None) -> str:
        """The GGUF name of a role's tensor (``layer`` None for the global roles)."""
        if layer is None:
            return _GGUF_GLOBAL[role]
        return f"blk.{layer}.{self.gguf_names[role]}"


ARCHITECTURES: dict[str, Architecture] = {
    a.name: a
    for a in (
        Architecture("llama", ("llama",), gguf_permuted_qk=True),
        # llama.cpp converts Mistral checkpoints as "llama" (permuted); a "mistral" GGUF is
        # read the same way.
        Architecture("mistral", ("mistral",), gguf_permuted_qk=True),
        Architecture("qwen2", ("qwen2",), qkv_bias=True),
        Architecture("qwen3", ("qwen3",), qk_norm=True),
        Architecture(
            "phi3",
            ("phi3",),
            hf_fused={
                "self_attn.qkv_proj.weight": ("q", "k", "v"),
                "mlp.gate_up_proj.weight": ("gate", "up"),
            },
            gguf_fused={"attn_qkv.weight": ("q", "k", "v"), "ffn_up.weight": ("gate", "up")},
        ),
        Architecture(
            "gemma3",
            ("gemma3_text", "gemma3"),
            qk_norm=True,
            sandwich_norms=True,
            activation="gelu_tanh",
            hf_norm_offset=1.0,
            scaled_embedding=True,
            hf_names=_HF_GEMMA,
        ),
    )
}
HF_MODEL_TYPES = {t: a for a in ARCHITECTURES.values() for t in a.hf_model_types}


def architecture(name: str) -> Architecture:
    """The family called ``name`` (a GGUF ``general.architecture`` value).

    Raises:
        ValueError: an architecture not in the table, naming the supported ones.
    """
    arch = ARCHITECTURES.get(name)
    if arch is None:
        raise ValueError(f"unsupported architecture {name!r}; supported: {sorted(ARCHITECTURES)}")
    return arch


def architecture_of(config: ModelConfig) -> Architecture:
    """The family of a config (``config.architecture``)."""
    return architecture(config.architecture)


def role_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Each layer role's (out, in) or (n,) shape under ``config`` (every role of the table)."""
    h, i, d = config.hidden_size, config.intermediate_size, config.head_dim
    q, kv = config.num_heads * d, config.num_kv_heads * d
    return {
        "attn_norm": (h,), "q": (q, h), "k": (kv, h), "v": (kv, h), "q_bias": (q,),
        "k_bias": (kv,), "v_bias": (kv,), "q_norm": (d,), "k_norm": (d,), "o": (h, q),
        "post_attn_norm": (h,), "mlp_norm": (h,), "gate": (i, h), "up": (i, h), "down": (h, i),
        "post_mlp_norm": (h,),
    }  # fmt: skip


def expected_weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the family of ``config`` needs, by its name in ``LoadedModel.weights`` (the
    family's HF names; Phi-3's fused tensors by their split roles' names), with its shape.
    ``lm_head.weight`` is listed only when embeddings are not tied."""
    arch = architecture_of(config)
    shapes: dict[str, tuple[int, ...]] = {
        arch.hf_name("embed"): (config.vocab_size, config.hidden_size),
        arch.hf_name("final_norm"): (config.hidden_size,),
    }
    if not config.tie_word_embeddings:
        shapes[arch.hf_name("lm_head")] = (config.vocab_size, config.hidden_size)
    roles = role_shapes(config)
    for layer in range(config.num_layers):
        for role in arch.layer_roles:
            shapes[arch.hf_name(role, layer)] = roles[role]
    return shapes
