"""Hugging Face weight names of a Llama decoder and the shape check every loader runs."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from pagedattn.config import ModelConfig
from pagedattn.model.quantized import BlockQuantized


def expected_weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a Llama decoder needs, by Hugging Face name, with its (out, in) shape.

    Linear weights are stored as in ``torch.nn.Linear``: (out_features, in_features).
    ``lm_head.weight`` is listed only when embeddings are not tied.
    """
    h, i, d = config.hidden_size, config.intermediate_size, config.head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (config.vocab_size, h),
        "model.norm.weight": (h,),
    }
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, h)
    for layer in range(config.num_layers):
        p = f"model.layers.{layer}."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (config.num_heads * d, h),
            p + "self_attn.k_proj.weight": (config.num_kv_heads * d, h),
            p + "self_attn.v_proj.weight": (config.num_kv_heads * d, h),
            p + "self_attn.o_proj.weight": (h, config.num_heads * d),
            p + "mlp.gate_proj.weight": (i, h),
            p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
        }
    return shapes


def check_weights(
    config: ModelConfig, weights: Mapping[str, np.ndarray | BlockQuantized], source: str
) -> None:
    """Check that ``weights`` holds every tensor ``config`` implies, with the right shape.

    Args:
        config: the model shape read from the file's metadata.
        weights: tensors by Hugging Face name (float32 arrays or GGUF block forms).
        source: the file or folder they came from, quoted in errors.

    Raises:
        ValueError: a tensor is missing, or its shape disagrees with the metadata; the message
            names the tensor, the expected and the actual shape.
    """
    for name, shape in expected_weight_shapes(config).items():
        if name not in weights:
            raise ValueError(f"{source}: missing tensor {name!r} (expected shape {shape})")
        if weights[name].shape != shape:
            raise ValueError(
                f"{source}: tensor {name!r} has shape {weights[name].shape}, but the metadata "
                f"implies {shape}"
            )
