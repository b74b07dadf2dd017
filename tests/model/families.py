"""Tiny random models of every family, built with transformers (the oracle) and written both as
an HF folder (safetensors) and as a GGUF the way llama.cpp's ``convert_hf_to_gguf.py`` writes
that family:

* llama, mistral: architecture ``llama`` (its converter reads Mistral checkpoints as Llama), q/k
  rows permuted (``LlamaModel.permute``), no sliding window (the converter writes none);
* qwen2: biases ``attn_{q,k,v}.bias``; qwen3: ``attn_{q,k}_norm``, ``attention.key_length``;
  neither permuted;
* phi3: ``attn_qkv`` and ``ffn_up`` (gate rows then up rows) fused as in the checkpoint,
  ``attention.sliding_window``;
* gemma3: every ``*norm.weight`` + 1 (``Gemma3Model.norm_shift``), ``post_attention_norm``,
  ``ffn_norm`` (the pre-feedforward norm), ``post_ffw_norm``, ``attention.sliding_window``,
  tied embeddings, the 5:1 sliding pattern implied; no ``query_pre_attn_scalar`` (llama.cpp
  scales by ``1 / sqrt(head_dim)``, which Gemma 3 checkpoints use but the 27B).

Needs torch and transformers; callers skip when they are missing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

from tests.model.tiny import (
    CHAT_TEMPLATE,
    add_matrix,
    add_tiny_vocab,
    llama_cpp_permute,
    tiny_tokens,
)

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3")
WINDOW = 8  # sliding window of the families that have one: prompts run well past it
VOCAB = len(tiny_tokens())
CONTEXT = 256


def hf_model(
    family: str, *, window: int | None = WINDOW, seed: int = 0, query_pre_attn_scalar: int = 24
) -> Any:
    """A random transformers CausalLM of ``family`` (hidden 64, 4 heads / 2 kv heads of 16;
    Gemma's attention scale ``query_pre_attn_scalar ** -0.5``, not the head_dim default)."""
    import torch
    import transformers

    common: dict[str, Any] = {
        "vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "max_position_embeddings": CONTEXT, "rms_norm_eps": 1e-5,
        "initializer_range": 0.3, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
        "tie_word_embeddings": False,
    }  # fmt: skip
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    if family == "llama":
        config = transformers.LlamaConfig(**common, rope_parameters=rope)
        cls = transformers.LlamaForCausalLM
    elif family == "mistral":
        config = transformers.MistralConfig(**common, rope_parameters=rope, sliding_window=window)
        cls = transformers.MistralForCausalLM
    elif family == "qwen2":
        config = transformers.Qwen2Config(**common, rope_parameters=rope)
        cls = transformers.Qwen2ForCausalLM
    elif family == "qwen3":
        config = transformers.Qwen3Config(**{**common, "head_dim": 24}, rope_parameters=rope)
        cls = transformers.Qwen3ForCausalLM
    elif family == "phi3":
        config = transformers.Phi3Config(**common, rope_parameters=rope, sliding_window=window)
        cls = transformers.Phi3ForCausalLM
    elif family == "gemma3":
        layer_types = [
            "full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(6)
        ]
        config = transformers.Gemma3TextConfig(
            **{**common, "num_hidden_layers": 6, "tie_word_embeddings": True},
            sliding_window=window, layer_types=layer_types,
            query_pre_attn_scalar=query_pre_attn_scalar,
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            },
        )  # fmt: skip
        cls = transformers.Gemma3ForCausalLM
    else:
        raise ValueError(family)
    torch.manual_seed(seed)
    model = cls(config).eval()
    with torch.no_grad():  # norms away from their init (ones / zeros) so a missed one shows
        gen = torch.Generator().manual_seed(seed + 1)
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                p.add_(0.2 * torch.randn(p.shape, generator=gen))
    return model


def save_folder(model: Any, folder: Path, tokenizer_json: Path) -> Path:
    """The HF folder of ``model``: config.json, safetensors, the tiny tokenizer."""
    model.save_pretrained(folder, safe_serialization=True)
    (folder / "tokenizer.json").write_bytes(tokenizer_json.read_bytes())
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    return folder


def _state(model: Any) -> dict[str, np.ndarray]:
    import torch

    return {k: v.detach().to(torch.float32).numpy() for k, v in model.state_dict().items()}


_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.gate_up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_GEMMA = _LAYER | {
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}
_GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def write_gguf(
    family: str,
    model: Any,
    path: Path,
    *,
    permute: bool | None = None,
    qtype: GGMLQuantizationType = GGMLQuantizationType.F32,
    chat_template: str | None = None,
) -> Path:
    """``model`` as llama.cpp's converter writes ``family`` (see the module docstring);
    ``permute`` overrides whether q/k rows are permuted (to test the wrong convention);
    ``qtype``: the type of every matrix (``gguf``'s quantizer: Q8_0, Q4_0, ...; norms and
    biases stay float32); ``chat_template``: the file's template (none by default)."""
    c = model.config
    arch = "llama" if family in ("llama", "mistral") else family
    permute = family in ("llama", "mistral") if permute is None else permute
    writer = GGUFWriter(str(path), arch)
    add_tiny_vocab(writer, chat_template=chat_template)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_vocab_size(c.vocab_size)
    head_dim = c.head_dim
    writer.add_rope_dimension_count(head_dim)
    if family in ("qwen3", "gemma3"):
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    if family == "gemma3":
        writer.add_rope_freq_base(c.rope_parameters["full_attention"]["rope_theta"])
        writer.add_sliding_window(c.sliding_window)
    else:
        writer.add_rope_freq_base(c.rope_parameters["rope_theta"])
    if family == "phi3" and c.sliding_window is not None:
        writer.add_sliding_window(c.sliding_window)
    names = _GEMMA if family == "gemma3" else _LAYER
    for name, w in _state(model).items():
        if name in _GLOBAL:
            if name == "lm_head.weight" and c.tie_word_embeddings:
                continue
            out = _GLOBAL[name]
        else:
            layer, rest = name.removeprefix("model.layers.").split(".", 1)
            out = f"blk.{layer}.{names[rest]}"
        if permute and name.endswith("q_proj.weight"):
            w = llama_cpp_permute(w, c.num_attention_heads)
        elif permute and name.endswith("k_proj.weight"):
            w = llama_cpp_permute(w, c.num_key_value_heads)
        elif permute and name.endswith("qkv_proj.weight"):
            q_rows, kv_rows = c.num_attention_heads * head_dim, c.num_key_value_heads * head_dim
            q, k, v = np.split(w, [q_rows, q_rows + kv_rows])
            q = llama_cpp_permute(q, c.num_attention_heads)
            w = np.concatenate([q, llama_cpp_permute(k, c.num_key_value_heads), v])
        if family == "gemma3" and name.endswith("norm.weight"):
            w = w + np.float32(1.0)
        add_matrix(writer, out, w, qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def gguf_with_oracle(
    family: str,
    folder: Path,
    *,
    seed: int = 0,
    qtype: GGMLQuantizationType = GGMLQuantizationType.F32,
    chat_template: str | None = CHAT_TEMPLATE,
) -> tuple[Any, Path]:
    """A random model of ``family`` (qwen2, gemma3, ...) whose config is what its GGUF keeps
    (Gemma's attention scale ``1 / sqrt(head_dim)``, as llama.cpp applies it), and the GGUF:
    the transformers model is the file's oracle."""
    if family == "gemma3":
        hf = hf_model(family, seed=seed, query_pre_attn_scalar=16)
    else:
        hf = hf_model(family, seed=seed)
    path = write_gguf(family, hf, folder / f"{family}-{qtype.name}.gguf", qtype=qtype,
                      chat_template=chat_template)  # fmt: skip
    return hf, path
