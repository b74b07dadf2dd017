"""A file's metadata -> ModelConfig, per family of :mod:`pagedattn.model.architecture`: GGUF
``{arch}.*`` keys as llama.cpp reads them, and ``config.json`` as transformers does.

The per-layer parts: sliding windows (Gemma 3: every sixth layer full, the others sliding, as
llama.cpp's ``set_swa_pattern(6)`` and transformers' ``layer_types``; Mistral and Phi-3: every
layer sliding when the checkpoint sets a window), the RoPE base of sliding layers (Gemma 3:
10000 while full layers use ``rope_theta``, their scaling applying to full layers only), the
attention scale (Gemma: ``query_pre_attn_scalar ** -0.5``) and the embedding scale.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pagedattn.kernels.rope import llama3_freq_factors
from pagedattn.model.architecture import Architecture

GEMMA3_SWA_PATTERN = 6  # llama.cpp hparams.set_swa_pattern(6); transformers' layer_types
GEMMA3_LOCAL_THETA = 10000.0


def windows_from_pattern(num_layers: int, window: int, pattern: int) -> tuple[int, ...]:
    """Layer i slides over ``window`` tokens unless ``(i + 1) % pattern == 0`` (full)."""
    return tuple(0 if (i + 1) % pattern == 0 else window for i in range(num_layers))


def check_window(window: Any, context: int, source: str) -> int:
    """A sliding window read from a file: a positive int no larger than the context.

    Raises:
        ValueError: 0, negative, not an int, or beyond ``context``, naming ``source``.
    """
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        raise ValueError(f"{source}: sliding window must be a positive int, got {window!r}")
    if window > context:
        raise ValueError(f"{source}: sliding window {window} exceeds the context length {context}")
    return window


def gguf_layer_numerics(
    arch: Architecture,
    meta: dict[str, Any],
    num_layers: int,
    context: int,
    hidden: int,
    heads: int,
    head_dim: int,
    source: str,
) -> dict[str, Any]:
    """The per-layer and scale fields of ModelConfig from GGUF metadata ``meta`` (keys with
    the ``{arch}.`` prefix removed)."""
    out: dict[str, Any] = {}
    window = meta.get("attention.sliding_window")
    if arch.name == "gemma3":
        if window is None:
            raise ValueError(f"{source}: missing GGUF metadata key gemma3.attention.sliding_window")
        w = check_window(int(window), context, f"{source}: gemma3.attention.sliding_window")
        pattern = meta.get("attention.sliding_window_pattern", GEMMA3_SWA_PATTERN)
        if isinstance(pattern, list | tuple):  # one bool per layer: True = sliding
            if len(pattern) != num_layers:
                raise ValueError(
                    f"{source}: gemma3.attention.sliding_window_pattern has {len(pattern)} "
                    f"entries for {num_layers} layers"
                )
            out["layer_windows"] = tuple(w if bool(p) else 0 for p in pattern)
        else:
            out["layer_windows"] = windows_from_pattern(num_layers, w, int(pattern))
        out["rope_theta_local"] = float(meta.get("rope.freq_base_swa", GEMMA3_LOCAL_THETA))
        # llama.cpp: 1 / sqrt(head_dim), but 1 / sqrt(hidden / heads) for the 62-layer 27B,
        # as query_pre_attn_scalar says in the HF config.
        scalar = hidden / heads if num_layers == 62 else head_dim
        out["attn_scale"] = float(meta.get("attention.scale", scalar**-0.5))
    elif arch.name in ("phi3", "mistral") and window is not None:
        w = check_window(int(window), context, f"{source}: {arch.name}.attention.sliding_window")
        out["layer_windows"] = (w,) * num_layers
    if arch.scaled_embedding:
        out["embed_scale"] = math.sqrt(hidden)
    softcap = meta.get("final_logit_softcapping")
    if softcap is not None:
        out["final_logit_softcap"] = float(softcap)
    return out


def hf_rope(
    rope: dict[str, Any], raw: dict[str, Any], head_dim: int, source: str
) -> tuple[float, str, tuple[float, ...] | None]:
    """(theta, scaling name, frequency divisors) of one RoPE parameter set of a config.json.

    Raises:
        ValueError: a scaling other than default, linear and llama3, a llama3 key missing, or
            a partial rotary factor.
    """
    rope_type = rope.get("rope_type", rope.get("type", "default")) or "default"
    if rope_type not in ("default", "llama3", "linear"):
        raise ValueError(
            f"{source}: RoPE scaling {rope_type!r} is not supported (default, linear and "
            "llama3 only)"
        )
    partial = rope.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    if float(partial if partial is not None else 1.0) != 1.0:
        raise ValueError(
            f"{source}: partial RoPE (partial_rotary_factor {partial}) is not supported"
        )
    theta = float(rope.get("rope_theta", raw.get("rope_theta", 10000.0)))

    def key(name: str) -> Any:
        if rope.get(name) is None:
            raise ValueError(f"{source}: {rope_type} RoPE scaling without {name!r}")
        return rope[name]

    if rope_type == "linear":
        return theta, "linear", (float(key("factor")),) * (head_dim // 2)
    if rope_type == "llama3":
        factors = llama3_freq_factors(
            head_dim,
            theta,
            factor=float(key("factor")),
            low_freq_factor=float(key("low_freq_factor")),
            high_freq_factor=float(key("high_freq_factor")),
            original_max_position_embeddings=int(key("original_max_position_embeddings")),
        )
        return theta, "llama3", tuple(float(f) for f in factors)
    return theta, "", None


def hf_layer_numerics(
    arch: Architecture, raw: dict[str, Any], num_layers: int, context: int, head_dim: int,
    source: Path,
) -> dict[str, Any]:  # fmt: skip
    """RoPE, per-layer windows and scales of ModelConfig from a config.json dict."""
    params = raw.get("rope_parameters") or {}
    by_type = isinstance(params.get("full_attention"), dict)
    full = params["full_attention"] if by_type else (params or raw.get("rope_scaling") or {})
    theta, scaling, factors = hf_rope(full, raw, head_dim, str(source))
    out: dict[str, Any] = {
        "rope_theta": theta, "rope_scaling": scaling, "rope_freq_factors": factors,
    }  # fmt: skip
    types = raw.get("layer_types")
    window = raw.get("sliding_window")
    if types is not None:
        if len(types) != num_layers:
            raise ValueError(
                f"{source}: layer_types has {len(types)} entries for {num_layers} layers"
            )
        unknown = sorted(set(types) - {"full_attention", "sliding_attention"})
        if unknown:
            raise ValueError(f"{source}: layer_types {unknown} are not supported")
        if "sliding_attention" in types:
            w = check_window(window, context, f"{source}: sliding_window")
            out["layer_windows"] = tuple(w if t == "sliding_attention" else 0 for t in types)
    elif window is not None and arch.name in ("mistral", "phi3"):
        out["layer_windows"] = (
            check_window(window, context, f"{source}: sliding_window"),
        ) * num_layers
    if arch.name == "gemma3":
        local = params.get("sliding_attention") if by_type else None
        if local is not None:
            local_theta, local_scaling, _ = hf_rope(local, {}, head_dim, str(source))
            if local_scaling:
                raise ValueError(f"{source}: RoPE scaling on sliding layers is not supported")
        else:
            local_theta = float(raw.get("rope_local_base_freq", GEMMA3_LOCAL_THETA))
        out["rope_theta_local"] = local_theta
        out["attn_scale"] = float(raw.get("query_pre_attn_scalar", head_dim)) ** -0.5
    if arch.scaled_embedding:
        out["embed_scale"] = math.sqrt(int(raw["hidden_size"]))
    if raw.get("attn_logit_softcapping") is not None:
        raise ValueError(f"{source}: attn_logit_softcapping is not supported")
    if raw.get("final_logit_softcapping") is not None:
        out["final_logit_softcap"] = float(raw["final_logit_softcapping"])
    return out
