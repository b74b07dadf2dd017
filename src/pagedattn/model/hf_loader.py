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
from pagedattn.kernels.rope import llama3_freq_factors
from pagedattn.model.weights import expected_weight_shapes

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
        ValueError: unsupported model type, biases, RoPE scaling other than default and
            ``llama3`` (whose frequency divisors go to ``rope_freq_factors``), partial RoPE, or a
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
    if rope_type not in ("default", None, "llama3"):
        raise ValueError(
            f"{folder}: RoPE scaling {rope_type!r} is not supported (default and llama3 only)"
        )
    partial = rope.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    if float(partial) != 1.0:
        raise ValueError(
            f"{folder}: partial RoPE (partial_rotary_factor {partial}) is not supported"
        )
    theta = rope.get("rope_theta", raw.get("rope_theta", 10000.0))
    try:
        hidden, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
        head_dim = int(raw.get("head_dim") or hidden // heads)
        factors = None
        if rope_type == "llama3":
            factors = llama3_freq_factors(
                head_dim,
                float(theta),
                factor=float(_rope_key(rope, "factor", folder)),
                low_freq_factor=float(_rope_key(rope, "low_freq_factor", folder)),
                high_freq_factor=float(_rope_key(rope, "high_freq_factor", folder)),
                original_max_position_embeddings=int(
                    _rope_key(rope, "original_max_position_embeddings", folder)
                ),
            )
        return ModelConfig(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            rope_theta=float(theta),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            bos_token_id=_first_int(raw.get("bos_token_id")),
            eos_token_id=_first_int(raw.get("eos_token_id")),
            architecture=str(model_type),
            name=str(raw.get("_name_or_path") or folder.name),
            rope_scaling="" if factors is None else "llama3",
            rope_freq_factors=None if factors is None else tuple(float(f) for f in factors),
        )
    except KeyError as exc:
        raise ValueError(f"{folder}/config.json: missing key {exc.args[0]!r}") from None


def _rope_key(rope: dict[str, Any], key: str, folder: Path) -> Any:
    if rope.get(key) is None:
        raise ValueError(f"{folder}/config.json: llama3 RoPE scaling without {key!r}")
    return rope[key]


def check_extra_tensors(config: ModelConfig, weights: dict[str, np.ndarray], source: str) -> None:
    """Refuse tensors a Llama forward would not use, rather than silently dropping them (a
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
            f"{source}: unexpected tensor {name!r} of shape {w.shape} (not used by a Llama "
            "forward with this config); refusing to run without it"
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
