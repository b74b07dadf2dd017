"""Read a llama.cpp GGUF file: metadata -> ModelConfig, tensors -> float32 in Hugging Face layout.

Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md, parsed by :mod:`.gguf_header`
(tensors other than F32 / F16 / F64 and the block forms of :data:`.quantized.SUPPORTED` are
dequantized with ``gguf.quants.dequantize`` when looked up). llama.cpp's converter permutes the
rows of ``attn_q`` / ``attn_k`` so that its interleaved ("GPT-J") RoPE matches the rotate-half
RoPE of the Hugging Face checkpoint; :func:`reverse_permute` undoes that exactly as transformers'
GGUF integration does, so our weights are in HF layout and we use HF's rotate-half RoPE.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from pagedattn.config import ModelConfig
from pagedattn.model.gguf_header import GGUFFile, GGUFTensorInfo, read_gguf
from pagedattn.model.quantized import SUPPORTED as QUANTIZED_TYPES
from pagedattn.model.quantized import BlockQuantized, from_gguf_blocks

SUPPORTED_ARCHITECTURES = ("llama",)

# GGUF tensor name (after "blk.{i}.") -> Hugging Face name (after "model.layers.{i}.").
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# Llama-3.1 RoPE frequency divisors (head_dim / 2,), written by llama.cpp's converter for
# ``rope_scaling: {rope_type: llama3}``; read into ModelConfig.rope_freq_factors.
ROPE_FREQS = "rope_freqs.weight"


def hf_tensor_name(gguf_name: str) -> str | None:
    """Hugging Face name of a GGUF tensor, or None for tensors a Llama forward does not use."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    return None


def reverse_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (interleaved RoPE pairs -> rotate-half halves).

    Args:
        weight: (num_heads * head_dim, in_features) float32 as stored in the GGUF.
        num_heads: heads of this projection (num_heads for q, num_kv_heads for k).

    Returns:
        (num_heads * head_dim, in_features) float32 in Hugging Face row order.
    """
    rows = weight.shape[0]
    if weight.ndim != 2 or rows % (2 * num_heads):
        raise ValueError(
            f"q/k projection of shape {weight.shape}: rows must be a multiple of 2 * {num_heads}"
        )
    half = rows // num_heads // 2
    w = weight.reshape(num_heads, half, 2, *weight.shape[1:])  # (heads, head_dim/2, 2, in)
    return np.ascontiguousarray(w.swapaxes(2, 1).reshape(weight.shape))  # (heads*head_dim, in)


def open_gguf(path: Path) -> GGUFFile:
    """Parse a GGUF header (:func:`.gguf_header.read_gguf`); every tensor lies inside the file.

    Raises:
        ValueError: the file is not a GGUF, is truncated or otherwise unparsable.
    """
    return read_gguf(path)


def field_value(reader: GGUFFile, key: str, default: Any = None) -> Any:
    """A GGUF metadata value (scalar, string, array), or ``default`` when the key is absent."""
    return reader.get(key, default)


def tensor_to_float32(tensor: GGUFTensorInfo) -> np.ndarray:
    """A tensor's values as float32 in numpy order (``tensor.shape[::-1]``); F32 is a view of
    the file, F16 / F64 are widened / narrowed, other types go through
    ``gguf.quants.dequantize`` (imported only then).

    Raises:
        ValueError: a type the ``gguf`` package cannot dequantize.
    """
    dims = tuple(int(d) for d in tensor.shape[::-1])
    if tensor.type_name in ("F32", "F16", "F64"):
        return np.asarray(tensor.data, dtype=np.float32).reshape(dims)
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize

    try:
        w = dequantize(tensor.data, GGMLQuantizationType[tensor.type_name])
    except NotImplementedError as exc:
        raise ValueError(
            f"tensor {tensor.name!r}: type {tensor.type_name} is not supported"
        ) from exc
    return np.asarray(w, dtype=np.float32).reshape(dims)


def gguf_config(reader: GGUFFile, path: Path) -> ModelConfig:
    """Build a ModelConfig from GGUF metadata (``{arch}.block_count`` etc.).

    Raises:
        ValueError: unsupported architecture, missing required key, unsupported RoPE scaling
            (``rope.scaling.type`` linear / yarn / longrope with a factor other than 1), partial
            rotary dimension, or a ``rope_freqs.weight`` not of shape (head_dim / 2,) with
            positive values.
    """
    arch = field_value(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"{path}: unsupported architecture {arch!r}; supported: {list(SUPPORTED_ARCHITECTURES)}"
        )

    def req(key: str) -> Any:
        value = field_value(reader, f"{arch}.{key}")
        if value is None:
            raise ValueError(f"{path}: missing GGUF metadata key {arch}.{key!s}")
        return value

    scaling = field_value(reader, f"{arch}.rope.scaling.type", "none")
    factor = float(field_value(reader, f"{arch}.rope.scaling.factor", 1.0))
    if scaling not in ("none", "") and factor != 1.0:
        raise ValueError(f"{path}: RoPE scaling {scaling!r} (factor {factor}) is not supported")
    hidden, heads = int(req("embedding_length")), int(req("attention.head_count"))
    head_dim = int(field_value(reader, f"{arch}.attention.key_length", hidden // heads))
    rot = int(field_value(reader, f"{arch}.rope.dimension_count", head_dim))
    if rot != head_dim:
        raise ValueError(
            f"{path}: partial RoPE (rope.dimension_count {rot} != head_dim {head_dim}) "
            "is not supported"
        )
    factors = _rope_freq_factors(reader, path, head_dim)
    tokens = reader.get("tokenizer.ggml.tokens")
    vocab = field_value(reader, f"{arch}.vocab_size")
    if vocab is None and tokens is not None:
        vocab = len(tokens)
    bos = field_value(reader, "tokenizer.ggml.bos_token_id")
    eos = field_value(reader, "tokenizer.ggml.eos_token_id")
    return ModelConfig(
        vocab_size=int(vocab) if vocab is not None else 0,
        hidden_size=hidden,
        intermediate_size=int(req("feed_forward_length")),
        num_layers=int(req("block_count")),
        num_heads=heads,
        num_kv_heads=int(field_value(reader, f"{arch}.attention.head_count_kv", heads)),
        head_dim=head_dim,
        rope_theta=float(field_value(reader, f"{arch}.rope.freq_base", 10000.0)),
        rms_norm_eps=float(req("attention.layer_norm_rms_epsilon")),
        max_position_embeddings=int(req("context_length")),
        tie_word_embeddings=not any(t.name == "output.weight" for t in reader.tensors),
        bos_token_id=None if bos is None else int(bos),
        eos_token_id=None if eos is None else int(eos),
        architecture=str(arch),
        name=str(field_value(reader, "general.name", path.stem)),
        rope_scaling="" if factors is None else "rope_freqs",
        rope_freq_factors=factors,
    )


def _rope_freq_factors(reader: GGUFFile, path: Path, head_dim: int) -> tuple[float, ...] | None:
    """The ``rope_freqs.weight`` divisors (llama.cpp ``ggml_rope_ext`` freq_factors), or None."""
    tensor = next((t for t in reader.tensors if t.name == ROPE_FREQS), None)
    if tensor is None:
        return None
    values = tensor_to_float32(tensor).ravel()
    if values.shape != (head_dim // 2,) or not np.all(np.isfinite(values) & (values > 0)):
        raise ValueError(
            f"{path}: tensor {ROPE_FREQS!r} must hold head_dim / 2 = {head_dim // 2} positive "
            f"values, got shape {tuple(int(d) for d in tensor.shape)}"
        )
    return tuple(float(v) for v in values)


class LazyWeights(Mapping[str, np.ndarray]):
    """Float32 tensors by HF name; quantized ones are dequantized only when looked up (each
    lookup returns a fresh array: nothing keeps a float32 copy of a quantized matrix alive)."""

    def __init__(self, arrays: dict[str, np.ndarray], lazy: dict[str, Callable[[], np.ndarray]]):
        self._arrays = arrays
        self._lazy = lazy

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self._arrays:
            return self._arrays[name]
        return self._lazy[name]()

    def __iter__(self) -> Iterator[str]:
        yield from self._arrays
        yield from self._lazy

    def __len__(self) -> int:
        return len(self._arrays) + len(self._lazy)


def gguf_weights(
    reader: GGUFFile, config: ModelConfig
) -> tuple[LazyWeights, dict[str, BlockQuantized]]:
    """Every used tensor, renamed to HF and with q/k rows un-permuted, without dequantizing.

    Matrices of :data:`.quantized.SUPPORTED` types (Q4_0 ... Q8_0, Q4_K, Q5_K, Q6_K) come back
    in block form (views of the memory-mapped file; q/k rows reordered into a copy), whose
    ``dequantize()`` equals the float32 weight bit for bit (see :mod:`.quantized`); the float32
    mapping holds the other tensors and dequantizes a quantized one only when it is looked up.
    Handles every type ``gguf.quants.dequantize`` knows (F32, F16, BF16, Q2_K, IQ4_NL...).

    Raises:
        ValueError: a tensor type the ``gguf`` package cannot dequantize, or a tensor a Llama
            forward does not use (named: a bias, ``rope_factors_long``...; ``rope_freqs.weight``
            is read by :func:`gguf_config`), which we refuse rather than silently ignore.
    """

    def to_float(tensor: GGUFTensorInfo, num_heads: int | None) -> np.ndarray:
        w = tensor_to_float32(tensor)  # GGUF lists dims fastest-first; numpy slowest-first
        return np.ascontiguousarray(w if num_heads is None else reverse_permute(w, num_heads))

    arrays: dict[str, np.ndarray] = {}
    lazy: dict[str, Callable[[], np.ndarray]] = {}
    quantized: dict[str, BlockQuantized] = {}
    heads = {"q_proj.weight": config.num_heads, "k_proj.weight": config.num_kv_heads}
    for tensor in reader.tensors:
        name = hf_tensor_name(tensor.name)
        if tensor.name == ROPE_FREQS:
            continue
        if name is None:
            raise ValueError(
                f"unsupported GGUF tensor {tensor.name!r} (not part of a {config.architecture} "
                "forward this loader runs); refusing to ignore it"
            )
        num_heads = next((h for suffix, h in heads.items() if name.endswith(suffix)), None)
        shape = tuple(int(d) for d in tensor.shape[::-1])
        kind = tensor.type_name
        if kind in QUANTIZED_TYPES and len(shape) == 2:
            block = from_gguf_blocks(tensor.data, kind, (shape[0], shape[1]))
            if num_heads is not None:
                rows = reverse_permute(np.arange(shape[0])[:, None], num_heads)[:, 0]
                block = block.take_rows(rows)
            quantized[name] = block
            lazy[name] = partial(to_float, tensor, num_heads)
        else:
            arrays[name] = to_float(tensor, num_heads)
    return LazyWeights(arrays, lazy), quantized


def gguf_tokenizer_metadata(reader: GGUFFile) -> dict[str, Any]:
    """Every ``tokenizer.*`` metadata value of the file (vocabulary, merges, types, template...)
    and ``general.architecture`` (which SentencePiece variant); numeric arrays (token types,
    scores) are numpy arrays, string arrays lists."""
    return {
        k: v
        for k, v in reader.metadata.items()
        if k.startswith("tokenizer.") or k == "general.architecture"
    }
