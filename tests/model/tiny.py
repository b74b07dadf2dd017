"""Tiny random Llama models and byte-level tokenizers written as GGUF files, for fast tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

from pagedattn.config import ModelConfig
from pagedattn.model.tokenizer import bytes_to_unicode
from pagedattn.model.weights import expected_weight_shapes

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = [
    "Ġ t",
    "h e",
    "Ġt he",
    "i n",
    "Ġ a",
    "e r",
    "o n",
    "Ġ s",
    "r e",
    "a t",
    "e n",
    "o r",
    "Ġ w",
]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tiny_tokens() -> list[str]:
    """3 control tokens, the 256 byte-level characters, then one token per merge."""
    merged = [m.replace(" ", "") for m in MERGES]
    return [*SPECIALS, *bytes_to_unicode().values(), *merged]


def tiny_config(**overrides: object) -> ModelConfig:
    """2 layers, hidden 64, 4 heads, 2 kv heads, head_dim 16, vocab = tiny tokenizer size."""
    fields: dict[str, object] = {
        "vocab_size": len(tiny_tokens()),
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_layers": 2,
        "num_heads": 4,
        "num_kv_heads": 2,
        "head_dim": 16,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 512,
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    fields.update(overrides)
    return ModelConfig(**fields)  # type: ignore[arg-type]


def _draw_order(item: tuple[str, tuple[int, ...]]) -> tuple[int, int]:
    """Each layer's norm weights drawn before its matrices (the order the tests' expected
    continuations were recorded with); otherwise the table's order."""
    name, shape = item
    layer = int(name.split(".")[2]) if name.startswith("model.layers.") else -1
    return layer, len(shape) != 1 if layer >= 0 else 0


def random_weights(config: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 weights in HF layout (norm weights around 1, linears scaled 1/sqrt(in))."""
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in sorted(expected_weight_shapes(config).items(), key=_draw_order):
        if len(shape) == 1:
            w = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            w = rng.standard_normal(shape) / np.sqrt(shape[1])
        weights[name] = w.astype(np.float32)
    return weights


def llama_cpp_permute(w: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py ``LlamaModel.permute`` (HF q/k rows -> GGUF order)."""
    return (
        w.reshape(num_heads, 2, w.shape[0] // num_heads // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _gguf_name(hf: str) -> str:
    table = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    if hf in table:
        return table[hf]
    layer, rest = hf.removeprefix("model.layers.").split(".", 1)
    short = {
        "input_layernorm.weight": "attn_norm.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.v_proj.weight": "attn_v.weight",
        "self_attn.o_proj.weight": "attn_output.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
    }[rest]
    return f"blk.{layer}.{short}"


def add_tiny_vocab(
    writer: GGUFWriter, *, pre: str = "smollm", chat_template: str | None = None
) -> None:
    """The tiny byte-level BPE vocabulary (``pre``-tokenizer ``pre``, bos 1, eos 2) and, unless
    None (a base model's file), ``chat_template``."""
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    tokens = tiny_tokens()
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    if chat_template is not None:
        writer.add_chat_template(chat_template)


def add_matrix(writer: GGUFWriter, name: str, w: np.ndarray, qtype: GGMLQuantizationType) -> None:
    """A tensor as llama.cpp's converter stores it: 2-D ones in ``qtype`` (``gguf``'s
    quantizer), the rest (norms, biases) float32."""
    if w.ndim == 2 and qtype != GGMLQuantizationType.F32:
        writer.add_tensor(name, quantize(np.asarray(w, np.float32), qtype), raw_dtype=qtype)
    else:
        writer.add_tensor(name, np.ascontiguousarray(w, dtype=np.float32))


def write_tiny_gguf(
    path: Path,
    config: ModelConfig,
    weights: dict[str, np.ndarray],
    *,
    arch: str = "llama",
    qtype: GGMLQuantizationType = GGMLQuantizationType.F32,
    drop: tuple[str, ...] = (),
    extra: dict[str, bool | int | float | str] | None = None,
    extra_tensors: dict[str, np.ndarray] | None = None,
    stored: dict[str, tuple[np.ndarray, GGMLQuantizationType]] | None = None,
    chat_template: str | None = CHAT_TEMPLATE,
) -> Path:
    """Write a GGUF the way llama.cpp's converter does (q/k rows permuted, 2-D tensors in qtype);
    ``extra_tensors`` (GGUF names, float32) are written too, e.g. ``rope_freqs.weight``;
    ``stored`` (HF names) replaces those weights with tensors already in the file's form and
    row order: raw blocks of the given type, or float32 arrays (type F32)."""
    writer = GGUFWriter(str(path), arch)
    add_tiny_vocab(writer, chat_template=chat_template)
    write_tensors(
        writer,
        config,
        weights,
        qtype=qtype,
        drop=drop,
        extra=extra,
        extra_tensors=extra_tensors,
        stored=stored,
    )
    return path


def write_tensors(
    writer: GGUFWriter,
    config: ModelConfig,
    weights: dict[str, np.ndarray],
    *,
    qtype: GGMLQuantizationType = GGMLQuantizationType.F32,
    drop: tuple[str, ...] = (),
    extra: dict[str, bool | int | float | str] | None = None,
    extra_tensors: dict[str, np.ndarray] | None = None,
    stored: dict[str, tuple[np.ndarray, GGMLQuantizationType]] | None = None,
) -> None:
    """Add the Llama hyperparameters, ``extra`` metadata, the weights (HF names, q/k rows
    permuted as llama.cpp's converter does; ``stored`` ones as given, see
    :func:`write_tiny_gguf`) and ``extra_tensors`` (GGUF names, float32) to ``writer``, then
    write and close the file."""
    writer.add_block_count(config.num_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_heads)
    writer.add_head_count_kv(config.num_kv_heads)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    extra = extra or {}
    if "llama.rope.dimension_count" not in extra:
        writer.add_rope_dimension_count(config.head_dim)
    for key, value in extra.items():  # extra metadata, e.g. RoPE scaling
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        else:
            writer.add_float32(key, value)
    for name, w in (extra_tensors or {}).items():
        writer.add_tensor(name, np.ascontiguousarray(w, dtype=np.float32))
    for name, w in weights.items():
        if name in drop:
            continue
        if stored and name in stored:
            data, data_type = stored[name]
            if data_type == GGMLQuantizationType.F32:
                writer.add_tensor(_gguf_name(name), np.ascontiguousarray(data, np.float32))
            else:
                writer.add_tensor(_gguf_name(name), data, raw_dtype=data_type)
            continue
        if name.endswith("q_proj.weight"):
            w = llama_cpp_permute(w, config.num_heads)
        elif name.endswith("k_proj.weight"):
            w = llama_cpp_permute(w, config.num_kv_heads)
        add_matrix(writer, _gguf_name(name), w, qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def random_hf_llama(*, tie_word_embeddings: bool, initializer_range: float) -> object:
    """A random transformers ``LlamaForCausalLM`` with :func:`tiny_config`'s shape (seed 0).

    Needs torch and transformers (test extra); callers skip when they are missing.
    """
    import torch
    import transformers

    c = tiny_config()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim,
        rope_theta=c.rope_theta,
        rms_norm_eps=c.rms_norm_eps,
        tie_word_embeddings=tie_word_embeddings,
        max_position_embeddings=c.max_position_embeddings,
        initializer_range=initializer_range,
    )
    return transformers.LlamaForCausalLM(config).eval()
