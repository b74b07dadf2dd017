"""Read a Hugging Face model folder: ``config.json`` + ``*.safetensors`` (local files only).

Tensors are read with ``safetensors.numpy``; bfloat16 tensors (which NumPy cannot hold) are
widened to float32 from their raw bits. Everything is returned as float32.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

from pagedattn.config import ModelConfig
from pagedattn.model.arch_config import hf_layer_numerics
from pagedattn.model.architecture import (
    HF_MODEL_TYPES,
    NORM_ROLES,
    architecture_of,
    expected_weight_shapes,
    role_shapes,
)

SUPPORTED_MODEL_TYPES = tuple(sorted(HF_MODEL_TYPES))
_ACTIVATIONS = {
    "silu": "silu",
    "swish": "silu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_tanh": "gelu_tanh",
}


def read_config_json(folder: Path) -> dict[str, Any]:
    """The parsed ``config.json`` of a model folder.

    Raises:
        ValueError: the file is missing or not valid JSON.
    """
    path = folder / "config.json"
    if not path.is_file():
        raise ValueError(f"{folder}: no config.json (expected a Hugging Face model folder)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: invalid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data


def _first_int(value: Any) -> int | None:
    if isinstance(value, list):
        value = value[0] if value else None
    return None if value is None else int(value)


def hf_config(raw: dict[str, Any], folder: Path) -> ModelConfig:
    """ModelConfig from a ``config.json`` dict (transformers 4.x ``rope_theta``/``rope_scaling`` or
    5.x ``rope_parameters``, per layer type for Gemma 3); a multimodal Gemma 3 config's
    ``text_config`` is read.

    Raises:
        ValueError: a model type not in :mod:`.architecture`, a bias or activation the family
            does not have, RoPE scaling other than default, linear and ``llama3``, partial RoPE,
            a bad sliding window or ``layer_types`` list, or a missing key.
    """
    if raw.get("model_type") == "gemma3" and isinstance(raw.get("text_config"), dict):
        raw = {"model_type": "gemma3_text", **raw["text_config"]}
    model_type = raw.get("model_type")
    arch = HF_MODEL_TYPES.get(str(model_type))
    if arch is None:
        raise ValueError(
            f"{folder}: unsupported architecture {model_type!r} "
            f"(architectures={raw.get('architectures')}); supported: {sorted(HF_MODEL_TYPES)}"
        )
    if raw.get("attention_bias") and not arch.qkv_bias:
        raise ValueError(f"{folder}: attention_bias=true is not supported for {model_type}")
    if raw.get("mlp_bias"):
        raise ValueError(f"{folder}: mlp_bias=true is not supported")
    act = raw.get("hidden_activation") or raw.get("hidden_act") or "silu"
    if _ACTIVATIONS.get(act) != arch.activation:
        raise ValueError(
            f"{folder}: hidden activation {act!r} is not supported for {model_type} "
            f"({arch.activation} only)"
        )
    try:
        hidden, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
        head_dim = int(raw.get("head_dim") or hidden // heads)
        num_layers = int(raw["num_hidden_layers"])
        context = int(raw.get("max_position_embeddings", 2048))
        numerics = hf_layer_numerics(arch, raw, num_layers, context, head_dim, folder)
        return ModelConfig(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=num_layers,
            num_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=context,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", arch.name == "gemma3")),
            bos_token_id=_first_int(raw.get("bos_token_id")),
            eos_token_id=_first_int(raw.get("eos_token_id")),
            architecture=arch.name,
            name=str(raw.get("_name_or_path") or folder.name),
            **numerics,
        )
    except KeyError as exc:
        raise ValueError(f"{folder}/config.json: missing key {exc.args[0]!r}") from None


def to_table_layout(config: ModelConfig, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A checkpoint's tensors as the forward reads them: fused tensors split by rows into
    their roles (Phi-3), and the family's norm offset added to every norm (Gemma's ``1 + w``).

    Raises:
        ValueError: a fused tensor whose rows do not match its parts.
    """
    arch = architecture_of(config)
    shapes = role_shapes(config)
    out = dict(weights)
    for i in range(config.num_layers):
        for suffix, roles in arch.hf_fused.items():
            name = f"model.layers.{i}.{suffix}"
            if name not in out:
                continue
            fused = out.pop(name)
            rows = [shapes[r][0] for r in roles]
            if fused.shape[0] != sum(rows):
                raise ValueError(
                    f"tensor {name!r} has shape {fused.shape}; expected {sum(rows)} rows"
                )
            start = 0
            for role, n in zip(roles, rows, strict=True):
                out[arch.hf_name(role, i)] = np.ascontiguousarray(fused[start : start + n])
                start += n
    if arch.hf_norm_offset:
        offset = np.float32(arch.hf_norm_offset)
        names = [arch.hf_name("final_norm")] + [
            arch.hf_name(r, i) for i in range(config.num_layers) for r in NORM_ROLES
            if r in arch.layer_roles
        ]  # fmt: skip
        for name in names:
            if name in out:
                out[name] = out[name] + offset
    return out


def check_extra_tensors(config: ModelConfig, weights: dict[str, np.ndarray], source: str) -> None:
    """Refuse tensors the family's forward would not use, rather than silently dropping them (a
    bias, a LoRA delta, RoPE buffers of another scheme...). Tolerated: ``lm_head.weight`` equal
    to the tied embedding, and ``rotary_emb.inv_freq`` buffers equal to our frequencies.

    Raises:
        ValueError: naming the first such tensor.
    """
    expected = expected_weight_shapes(config)
    inv_freq = 1.0 / (
        config.rope_theta ** (np.arange(0, config.head_dim, 2, dtype=np.float64) / config.head_dim)
    )
    if config.rope_freq_factors is not None:
        inv_freq = inv_freq / np.asarray(config.rope_freq_factors, dtype=np.float64)
    for name in sorted(set(weights) - set(expected)):
        w = weights[name]
        if name == "lm_head.weight" and np.array_equal(w, weights["model.embed_tokens.weight"]):
            continue
        if name.endswith("rotary_emb.inv_freq") and np.allclose(w, inv_freq, rtol=1e-5, atol=0):
            continue
        raise ValueError(
            f"{source}: unexpected tensor {name!r} of shape {w.shape} (not used by a "
            f"{config.architecture} forward with this config); refusing to run without it"
        )


def safetensors_files(folder: Path) -> list[Path]:
    """The folder's ``*.safetensors`` files, sorted (sharded checkpoints included).

    Raises:
        ValueError: there are none.
    """
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{folder}: no *.safetensors files (pickled .bin checkpoints are refused)")
    return files


def _read_bf16(path: Path, names: list[str]) -> dict[str, np.ndarray]:
    """bfloat16 tensors of a safetensors file, widened to float32 (bits << 16)."""
    raw = path.read_bytes()
    (header_len,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + header_len])
    out = {}
    for name in names:
        start, end = header[name]["data_offsets"]
        bits = np.frombuffer(
            raw, dtype="<u2", count=(end - start) // 2, offset=8 + header_len + start
        )
        widened = bits.astype(np.uint32) << 16
        out[name] = widened.view(np.float32).reshape(header[name]["shape"])
    return out


def hf_weights(folder: Path) -> dict[str, np.ndarray]:
    """Every tensor of the folder's safetensors files, as contiguous float32 arrays.

    Raises:
        ValueError: a file is not valid safetensors (e.g. truncated).
    """
    from safetensors import safe_open

    weights: dict[str, np.ndarray] = {}
    for path in safetensors_files(folder):
        bf16: list[str] = []
        try:
            with safe_open(str(path), framework="numpy") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is not a Mapping)
                    if f.get_slice(name).get_dtype() == "BF16":
                        bf16.append(name)
                    else:
                        weights[name] = np.ascontiguousarray(f.get_tensor(name), dtype=np.float32)
        except Exception as exc:  # safetensors raises its own error type on corrupt files
            raise ValueError(f"{path}: not a readable safetensors file ({exc})") from exc
        weights |= _read_bf16(path, bf16)
    if "lm_head.weight" in weights and "model.embed_tokens.weight" not in weights:
        raise ValueError(f"{folder}: missing tensor 'model.embed_tokens.weight'")
    return weights
