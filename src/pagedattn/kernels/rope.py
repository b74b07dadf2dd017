"""Rotary position embedding (RoPE), Hugging Face "rotate-half" layout.

Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding" (arXiv 2104.09864);
layout as ``transformers.models.llama.modeling_llama.apply_rotary_pos_emb``: dimension ``i`` of the
first half pairs with dimension ``i + head_dim/2``, rotated by angle
``position * theta^(-2i/head_dim)``.

Rotations compose, R(p + d) = R(d) R(p), so re-rotating a key cached at position p to p + d is
``apply_rope(k, d_positions, theta)`` (StreamingLLM-style position shifts, llama.cpp context shift).

Frequency scaling: Llama-3.1/3.2 divide each frequency by a per-pair factor
(:func:`llama3_freq_factors`); llama.cpp stores those factors as the ``rope_freqs.weight`` tensor
and divides by them (``freq_factors`` of ``ggml_rope_ext``), transformers computes the scaled
frequencies from ``rope_scaling: {rope_type: llama3}``. Both are the same numbers.
"""

from __future__ import annotations

import math

import numba
import numpy as np


def llama3_freq_factors(
    head_dim: int,
    theta: float,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_max_position_embeddings: int,
) -> np.ndarray:
    """Llama-3.1 RoPE frequency divisors (Meta's ``apply_scaling``; transformers
    ``_compute_llama3_parameters``; llama.cpp ``convert_hf_to_gguf.py`` ``rope_freqs``).

    With wavelength ``w_i = 2 pi / freq_i`` and ``L = original_max_position_embeddings``:
    ``w_i < L / high_freq_factor`` keeps the frequency (divisor 1), ``w_i > L / low_freq_factor``
    divides it by ``factor``, and in between the divisor is ``1 / ((1 - s) / factor + s)`` with
    ``s = (L / w_i - low_freq_factor) / (high_freq_factor - low_freq_factor)``.

    Returns:
        (head_dim // 2,) float32 divisors, each in [1, factor].

    Raises:
        ValueError: non-positive factors or context, or ``high_freq_factor <= low_freq_factor``.
    """
    if factor <= 0 or low_freq_factor <= 0 or original_max_position_embeddings <= 0:
        raise ValueError(
            "llama3 RoPE: factor, low_freq_factor and original_max_position_embeddings must be "
            f"positive, got {factor}, {low_freq_factor}, {original_max_position_embeddings}"
        )
    if high_freq_factor <= low_freq_factor:
        raise ValueError(
            f"llama3 RoPE: high_freq_factor ({high_freq_factor}) must exceed "
            f"low_freq_factor ({low_freq_factor})"
        )
    ctx = float(original_max_position_embeddings)
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    out = []
    for freq in inv_freq:
        wavelen = 2 * math.pi / freq
        if wavelen < ctx / high_freq_factor:
            out.append(1.0)
        elif wavelen > ctx / low_freq_factor:
            out.append(factor)
        else:
            smooth = (ctx / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def rope_cos_sin(
    positions: np.ndarray,
    head_dim: int,
    theta: float,
    freq_factors: np.ndarray | tuple[float, ...] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Cosine and sine tables for ``positions``.

    Angles are computed in float64 (positions may be large in long streams) and cast to float32.

    Args:
        positions: (num_tokens,) integer positions (may be negative for re-rotation deltas).
        head_dim: even head dimension D.
        theta: RoPE base (e.g. 10000.0; SmolLM2 uses 100000.0).
        freq_factors: None, or (D/2,) positive divisors of the frequencies
            ``theta^(-2i/D)`` (llama.cpp ``rope_freqs``; see :func:`llama3_freq_factors`).

    Returns:
        ``(cos, sin)``, each (num_tokens, head_dim // 2) float32: the half-width table (the HF
        full-width table is this one concatenated with itself).

    Raises:
        ValueError: positions not 1-D, odd or non-positive head_dim, non-positive theta,
            freq_factors not of shape (D/2,) or not all positive.
    """
    positions = np.asarray(positions)
    if positions.ndim != 1:
        raise ValueError(f"positions: expected shape (num_tokens,), got {positions.shape}")
    if head_dim <= 0 or head_dim % 2:
        raise ValueError(f"head_dim must be a positive even int, got {head_dim}")
    if theta <= 0:
        raise ValueError(f"theta must be positive, got {theta}")
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))  # (D/2,)
    if freq_factors is not None:
        factors = np.asarray(freq_factors, dtype=np.float64)
        if factors.shape != inv_freq.shape or not np.all(factors > 0):
            raise ValueError(
                f"freq_factors: expected {inv_freq.shape[0]} positive values, got {factors.shape}"
            )
        inv_freq = inv_freq / factors
    angles = positions.astype(np.float64)[:, None] * inv_freq[None, :]  # (T, D/2)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def apply_rope_cos_sin(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate ``x`` with precomputed half-width tables (see :func:`rope_cos_sin`).

    Args:
        x: (num_tokens, num_heads, head_dim) float32.
        cos, sin: (num_tokens, head_dim // 2) float32.

    Returns:
        A new (num_tokens, num_heads, head_dim) float32 array; ``x`` is not modified.

    Raises:
        ValueError: shapes that do not match.
    """
    if x.ndim != 3 or x.shape[2] % 2:
        raise ValueError(f"x: expected (num_tokens, num_heads, even head_dim), got {x.shape}")
    half = x.shape[2] // 2
    if cos.shape != (x.shape[0], half) or sin.shape != cos.shape:
        raise ValueError(
            f"cos/sin: expected shape ({x.shape[0]}, {half}), got {cos.shape} and {sin.shape}"
        )
    out = np.empty(x.shape, dtype=np.float32)  # (T, H, D)
    rope_into(
        np.ascontiguousarray(x, dtype=np.float32),
        np.ascontiguousarray(cos, dtype=np.float32),
        np.ascontiguousarray(sin, dtype=np.float32),
        out,
    )
    return out


@numba.njit(cache=True, nogil=True)  # no fastmath: a product and a difference, each rounded
def rope_into(
    x: np.ndarray, cos: np.ndarray, sin: np.ndarray, out: np.ndarray
) -> None:  # pragma: no cover - compiled
    """out = [x1 cos - x2 sin, x2 cos + x1 sin] per (token, head): each product rounded, then
    the sum (no fused multiply-add), as NumPy's elementwise ``x1 * c - x2 * s`` does."""
    half = cos.shape[1]
    for t in range(x.shape[0]):
        for h in range(x.shape[1]):
            for i in range(half):
                x1, x2, c, s = x[t, h, i], x[t, h, half + i], cos[t, i], sin[t, i]
                out[t, h, i] = x1 * c - x2 * s
                out[t, h, half + i] = x2 * c + x1 * s


def apply_rope(x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    """Rotate queries or keys to their positions (HF rotate-half RoPE); a pure function.

    Args:
        x: (num_tokens, num_heads, head_dim) float32 (un-rotated q or k, or already-rotated keys
            when ``positions`` are deltas).
        positions: (num_tokens,) integer position (or position delta) of each token.
        theta: RoPE base.

    Returns:
        A new (num_tokens, num_heads, head_dim) float32 array.

    Raises:
        ValueError: shape mismatch between ``x`` and ``positions``, or odd head_dim.
    """
    if x.ndim != 3:
        raise ValueError(f"x: expected (num_tokens, num_heads, head_dim), got {x.shape}")
    positions = np.asarray(positions)
    if positions.shape != (x.shape[0],):
        raise ValueError(f"positions: expected shape ({x.shape[0]},), got {positions.shape}")
    cos, sin = rope_cos_sin(positions, x.shape[2], theta)
    return apply_rope_cos_sin(np.asarray(x, dtype=np.float32), cos, sin)
