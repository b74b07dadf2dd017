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

SUPPORTED_MODEL_TYPES = ("llama",)


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
    5.x ``rope_parameters``).

    Raises:
        ValueError: unsupported model type, biases, RoPE scaling other than default, or a
            missing key.
    """
    model_type = raw.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"{folder}: unsupported architecture {model_type!r} "
            f"(architectures={raw.get('architectures')}); supported: {list(SUPPORTED_MODEL_TYPES)}"
        )
    for flag in ("attention_bias", "mlp_bias"):
        if raw.get(flag):
            raise ValueError(f"{folder}: {flag}=true is not supported")
    if raw.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{folder}: hidden_act {raw['hidden_act']!r} is not supported (silu only)")
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", None):
        raise ValueError(f"{folder}: RoPE scaling {rope_type!r} is not supported (default only)")
    theta = rope.get("rope_theta", raw.get("rope_theta", 10000.0))
    try:
        hidden, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
        return ModelConfig(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or hidden // heads),
            rope_theta=float(theta),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            bos_token_id=_first_int(raw.get("bos_token_id")),
            eos_token_id=_first_int(raw.get("eos_token_id")),
            architecture=str(model_type),
            name=str(raw.get("_name_or_path") or folder.name),
        )
    except KeyError as exc:
        raise ValueError(f"{folder}/config.json: missing key {exc.args[0]!r}") from None


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
