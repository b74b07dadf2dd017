"""Rotary position embedding (RoPE), Hugging Face "rotate-half" layout.

Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding" (arXiv 2104.09864);
layout as ``transformers.models.llama.modeling_llama.apply_rotary_pos_emb``: dimension ``i`` of the
first half pairs with dimension ``i + head_dim/2``, rotated by angle
``position * theta^(-2i/head_dim)``.

Rotations compose, R(p + d) = R(d) R(p), so re-rotating a key cached at position p to p + d is
``apply_rope(k, d_positions, theta)`` (StreamingLLM-style position shifts, llama.cpp context shift).
"""

from __future__ import annotations

import numpy as np


def rope_cos_sin(
    positions: np.ndarray, head_dim: int, theta: float
) -> tuple[np.ndarray, np.ndarray]:
    """Cosine and sine tables for ``positions``.

    Angles are computed in float64 (positions may be large in long streams) and cast to float32.

    Args:
        positions: (num_tokens,) integer positions (may be negative for re-rotation deltas).
        head_dim: even head dimension D.
        theta: RoPE base (e.g. 10000.0; SmolLM2 uses 100000.0).

    Returns:
        ``(cos, sin)``, each (num_tokens, head_dim // 2) float32: the half-width table (the HF
        full-width table is this one concatenated with itself).

    Raises:
        ValueError: positions not 1-D, odd or non-positive head_dim, non-positive theta.
    """
    positions = np.asarray(positions)
    if positions.ndim != 1:
        raise ValueError(f"positions: expected shape (num_tokens,), got {positions.shape}")
    if head_dim <= 0 or head_dim % 2:
        raise ValueError(f"head_dim must be a positive even int, got {head_dim}")
    if theta <= 0:
        raise ValueError(f"theta must be positive, got {theta}")
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))  # (D/2,)
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
    c = cos[:, None, :]  # (T, 1, D/2) broadcast over heads
    s = sin[:, None, :]  # (T, 1, D/2)
    x1, x2 = x[..., :half], x[..., half:]  # (T, H, D/2) each
    out = np.empty(x.shape, dtype=np.float32)  # (T, H, D)
    np.multiply(x1, c, out=out[..., :half])
    out[..., :half] -= x2 * s  # x1 cos - x2 sin
    np.multiply(x2, c, out=out[..., half:])
    out[..., half:] += x1 * s  # x2 cos + x1 sin
    return out


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
