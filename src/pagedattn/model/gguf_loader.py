"""Read a llama.cpp GGUF file: metadata -> ModelConfig, tensors -> float32 in Hugging Face layout.

Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md, parsed by :mod:`.gguf_header`
(tensors other than F32 / F16 / F64 and the block forms of :data:`.quantized.SUPPORTED` are
dequantized with ``gguf.quants.dequantize`` when looked up). Names, fused tensors and which
families' q/k rows were permuted come from :mod:`.architecture`. For Llama (and Mistral, which
it converts as Llama) llama.cpp's converter permutes the rows of ``attn_q`` / ``attn_k`` so that
its interleaved ("GPT-J") RoPE matches the rotate-half RoPE of the Hugging Face checkpoint;
:func:`reverse_permute` undoes that exactly as transformers' GGUF integration does. Its other
families (Qwen2, Qwen3, Phi-3, Gemma 3) use NeoX (rotate-half) RoPE and are written unpermuted.
Either way our weights are in HF layout and we use HF's rotate-half RoPE.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from pagedattn.config import ModelConfig
from pagedattn.model.arch_config import gguf_layer_numerics
from pagedattn.model.architecture import (
    ARCHITECTURES,
    GLOBAL_ROLES,
    architecture,
    architecture_of,
    role_shapes,
)
from pagedattn.model.gguf_header import GGUFFile, GGUFTensorInfo, read_gguf
from pagedattn.model.mapped_pages import file_array, release_pages
from pagedattn.model.quantized import SUPPORTED as QUANTIZED_TYPES
from pagedattn.model.quantized import BlockQuantized, from_gguf_blocks

SUPPORTED_ARCHITECTURES = tuple(sorted(ARCHITECTURES))

# Llama-3.1 RoPE frequency divisors (head_dim / 2,), written by llama.cpp's converter for
# ``rope_scaling: {rope_type: llama3}``; read into ModelConfig.rope_freq_factors.
ROPE_FREQS = "rope_freqs.weight"


def tensor_map(config: ModelConfig) -> dict[str, list[tuple[str, int, int, int | None]]]:
    """GGUF tensor name -> the tensors it holds under their ``LoadedModel.weights`` names:
    ``(name, first row, end row, heads to un-permute or None)`` (Phi-3's fused tensors give
    several; q/k of families llama.cpp permuted carry their head count), from the table."""
    arch = architecture_of(config)
    shapes = role_shapes(config)
    out: dict[str, list[tuple[str, int, int, int | None]]] = {
        arch.gguf_name(role): [(arch.hf_name(role), 0, config.vocab_size, None)]
        for role in GLOBAL_ROLES
    }
    permuted = {"q": config.num_heads, "k": config.num_kv_heads} if arch.gguf_permuted_qk else {}
    fused_roles = {r for roles in arch.gguf_fused.values() for r in roles}
    for i in range(config.num_layers):
        for role in arch.layer_roles:
            if role not in fused_roles:
                rows = shapes[role][0]
                entry = (arch.hf_name(role, i), 0, rows, permuted.get(role))
                out[arch.gguf_name(role, i)] = [entry]
        for suffix, roles in arch.gguf_fused.items():
            parts: list[tuple[str, int, int, int | None]] = []
            start = 0
            for role in roles:
                rows = shapes[role][0]
                parts.append((arch.hf_name(role, i), start, start + rows, None))
                start += rows
            out[f"blk.{i}.{suffix}"] = parts
    return out


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
        ValueError: an architecture not in :mod:`.architecture`, a missing required key,
            unsupported RoPE scaling (``rope.scaling.type`` yarn / longrope with a factor other
            than 1; linear runs), partial rotary dimension, a ``rope_freqs.weight`` not of
            shape (head_dim / 2,) with positive values, or a bad sliding window (0, beyond the
            context, a per-layer pattern of the wrong length).
    """
    arch = field_value(reader, "general.architecture")
    try:
        family = architecture(str(arch))
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None

    def req(key: str) -> Any:
        value = field_value(reader, f"{arch}.{key}")
        if value is None:
            raise ValueError(f"{path}: missing GGUF metadata key {arch}.{key!s}")
        return value

    scaling = field_value(reader, f"{arch}.rope.scaling.type", "none")
    factor = float(field_value(reader, f"{arch}.rope.scaling.factor", 1.0))
    if scaling not in ("none", "", "linear") and factor != 1.0:
        raise ValueError(f"{path}: RoPE scaling {scaling!r} (factor {factor}) is not supported")
    hidden, heads = int(req("embedding_length")), int(req("attention.head_count"))
    head_dim = int(field_value(reader, f"{arch}.attention.key_length", hidden // heads))
    value_dim = int(field_value(reader, f"{arch}.attention.value_length", head_dim))
    if value_dim != head_dim:
        raise ValueError(
            f"{path}: attention.value_length {value_dim} != key_length {head_dim} is not supported"
        )
    rot = int(field_value(reader, f"{arch}.rope.dimension_count", head_dim))
    if rot != head_dim:
        raise ValueError(
            f"{path}: partial RoPE (rope.dimension_count {rot} != head_dim {head_dim}) "
            "is not supported"
        )
    factors = _rope_freq_factors(reader, path, head_dim)
    rope_scaling = "" if factors is None else "rope_freqs"
    if scaling == "linear" and factor != 1.0:
        if factors is not None:
            raise ValueError(f"{path}: linear RoPE scaling and rope_freqs.weight together")
        factors, rope_scaling = (factor,) * (head_dim // 2), "linear"
    num_layers, context = int(req("block_count")), int(req("context_length"))
    prefix = f"{arch}."
    meta = {k.removeprefix(prefix): v for k, v in reader.metadata.items() if k.startswith(prefix)}
    numerics = gguf_layer_numerics(
        family, meta, num_layers, context, hidden, heads, head_dim, str(path)
    )
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
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=int(field_value(reader, f"{arch}.attention.head_count_kv", heads)),
        head_dim=head_dim,
        rope_theta=float(field_value(reader, f"{arch}.rope.freq_base", 10000.0)),
        rms_norm_eps=float(req("attention.layer_norm_rms_epsilon")),
        max_position_embeddings=context,
        tie_word_embeddings=not any(t.name == "output.weight" for t in reader.tensors),
        bos_token_id=None if bos is None else int(bos),
        eos_token_id=None if eos is None else int(eos),
        architecture=str(arch),
        name=str(field_value(reader, "general.name", path.stem)),
        rope_scaling=rope_scaling,
        rope_freq_factors=factors,
        **numerics,
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
    in block form, whose ``dequantize()`` equals the float32 weight bit for bit (see
    :mod:`.quantized`): copies in the kernels' layout (Q6_K in a row count that is not a
    multiple of four as a view of the memory-mapped file). The float32 mapping holds the other
    tensors (copies) and dequantizes a quantized one only when it is looked up. The file's
    pages of every copy are handed back (:mod:`.mapped_pages`).
    Handles every type ``gguf.quants.dequantize`` knows (F32, F16, BF16, Q2_K, IQ4_NL...).

    Tensor names, fused tensors (split by rows) and the q/k un-permutation (only for families
    llama.cpp's converter permuted) come from :func:`tensor_map`.

    Raises:
        ValueError: a tensor type the ``gguf`` package cannot dequantize, a fused tensor whose
            rows do not match its parts, or a tensor the family's forward does not use (named:
            a bias of a family without one, ``rope_factors_long``...; ``rope_freqs.weight`` is
            read by :func:`gguf_config`), which we refuse rather than silently ignore.
    """

    def to_float(
        tensor: GGUFTensorInfo, rows: tuple[int, int], num_heads: int | None
    ) -> np.ndarray:
        w = tensor_to_float32(tensor)  # GGUF lists dims fastest-first; numpy slowest-first
        if (rows[0], rows[1]) != (0, w.shape[0]):
            w = w[rows[0] : rows[1]]
        return np.ascontiguousarray(w if num_heads is None else reverse_permute(w, num_heads))

    arrays: dict[str, np.ndarray] = {}
    lazy: dict[str, Callable[[], np.ndarray]] = {}
    quantized: dict[str, BlockQuantized] = {}
    viewed: list[GGUFTensorInfo] = []  # tensors whose file pages the forward reads
    names = tensor_map(config)
    for tensor in reader.tensors:
        if tensor.name == ROPE_FREQS:
            continue
        parts = names.get(tensor.name)
        if parts is None:
            raise ValueError(
                f"unsupported GGUF tensor {tensor.name!r} (not part of a {config.architecture} "
                "forward this loader runs); refusing to ignore it"
            )
        shape = tuple(int(d) for d in tensor.shape[::-1])
        kind = tensor.type_name
        if len(parts) > 1 and parts[-1][2] != shape[0]:
            raise ValueError(
                f"tensor {tensor.name!r} has shape {shape}; its parts need {parts[-1][2]} rows"
            )
        blocks = kind in QUANTIZED_TYPES and len(shape) == 2
        for name, start, end, num_heads in parts:
            if blocks:
                rows: np.ndarray | None = None  # the file's rows, in order
                if num_heads is not None:  # q/k: rows reordered as they are copied
                    rows = reverse_permute(np.arange(shape[0])[:, None], num_heads)[:, 0]
                elif len(parts) > 1:  # one part of a fused tensor, copied
                    rows = np.arange(start, end)
                quantized[name] = from_gguf_blocks(tensor.data, kind, (shape[0], shape[1]), rows)
                lazy[name] = partial(to_float, tensor, (start, end), num_heads)
            else:  # the process's own copy (the file's pages are handed back below),
                # read-only as the file's view was (the flag is part of a kernel's signature)
                span = (start, end) if len(parts) > 1 else (0, shape[0])
                value = to_float(tensor, span, num_heads)  # a view of the file for F32
                if np.may_share_memory(value, tensor.data):
                    value = value.copy()
                value.flags.writeable = False
                arrays[name] = value
        copied = not blocks or not all(
            np.shares_memory(quantized[name].blocks, tensor.data) for name, *_ in parts
        )
        if copied:
            release_pages(tensor.data)  # what the forward reads is a copy
        else:
            viewed.append(tensor)
    _release_all_but(reader, viewed)
    return LazyWeights(arrays, lazy), quantized


def _release_all_but(reader: GGUFFile, viewed: list[GGUFTensorInfo]) -> None:
    """Hand back every page of the file's tensor data but those of the ``viewed`` tensors:
    the pages two copied tensors share too, which each tensor's own release keeps. A page left
    mapped beside data the forward reads would otherwise map back, on that read, every page of
    its page-cache folio: megabytes of matrices the forward never reads from the file."""
    whole = file_array(reader.tensors[0].data) if reader.tensors else None
    if whole is None:
        return
    start = reader.data_start
    for tensor in sorted(viewed, key=lambda t: t.data_offset):
        release_pages(whole[start : tensor.data_offset])
        start = max(start, tensor.data_offset + tensor.n_bytes)
    release_pages(whole[start:])


def gguf_tokenizer_metadata(reader: GGUFFile) -> dict[str, Any]:
    """Every ``tokenizer.*`` metadata value of the file (vocabulary, merges, types, template...)
    and ``general.architecture`` (which SentencePiece variant); numeric arrays (token types,
    scores) are numpy arrays, string arrays lists."""
    return {
        k: v
        for k, v in reader.metadata.items()
        if k.startswith("tokenizer.") or k == "general.architecture"
    }
