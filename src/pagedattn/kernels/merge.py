"""Merge two partial attention states with their log-sum-exp.

Attention over a key set split into two disjoint parts ``A`` and ``B`` equals the
log-sum-exp weighted mix of the two partial results (the identity behind
FlashAttention's online softmax, Dao 2023 arXiv 2307.08691, and FlashInfer's
``merge_state``, Ye et al. 2025 arXiv 2501.01005). Here ``lse`` is in natural log.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

F32Array = npt.NDArray[np.float32]


def merge_states(
    out_a: F32Array, lse_a: F32Array, out_b: F32Array, lse_b: F32Array
) -> tuple[F32Array, F32Array]:
    """Combine two attention states over disjoint key sets into the state over their union.

    Args:
        out_a: float32 ``(..., num_heads, head_dim)``, attention output over key set A.
        lse_a: float32 ``(..., num_heads)``, natural-log log-sum-exp of A's scaled scores;
            ``-inf`` means the row saw no key of A (its ``out_a`` is ignored).
        out_b: float32, same shape as ``out_a``, over key set B.
        lse_b: float32, same shape as ``lse_a``.

    Returns:
        ``(out, lse)`` with the shapes of ``out_a`` and ``lse_a``:
        ``lse = log(exp(lse_a) + exp(lse_b))`` and
        ``out = (exp(lse_a - lse) * out_a + exp(lse_b - lse) * out_b)``; a row that saw
        nothing in either part yields zeros and ``-inf``.

    Raises:
        ValueError: a dtype other than float32 or a shape mismatch, naming the expected shape.
    """
    for name, a in (("out_a", out_a), ("lse_a", lse_a), ("out_b", out_b), ("lse_b", lse_b)):
        if not isinstance(a, np.ndarray) or a.dtype != np.float32:
            raise ValueError(f"{name}: expected a float32 array, got {getattr(a, 'dtype', a)!r}")
    if out_a.ndim < 2:
        raise ValueError(f"out_a: expected (..., num_heads, head_dim), got {out_a.shape}")
    if lse_a.shape != out_a.shape[:-1]:
        raise ValueError(f"lse_a: expected {out_a.shape[:-1]} (..., num_heads), got {lse_a.shape}")
    if out_b.shape != out_a.shape:
        raise ValueError(f"out_b: expected {out_a.shape}, got {out_b.shape}")
    if lse_b.shape != lse_a.shape:
        raise ValueError(f"lse_b: expected {lse_a.shape}, got {lse_b.shape}")

    m = np.maximum(lse_a, lse_b)
    seen = np.isfinite(m)
    safe_m = np.where(seen, m, np.float32(0.0))
    wa = np.where(np.isfinite(lse_a), np.exp(lse_a - safe_m), np.float32(0.0))
    wb = np.where(np.isfinite(lse_b), np.exp(lse_b - safe_m), np.float32(0.0))
    total = wa + wb
    denom = np.where(seen, total, np.float32(1.0))
    # A part that saw nothing may carry garbage in out: drop it, do not multiply it by 0.
    part_a = np.where((wa > 0)[..., None], out_a * (wa / denom)[..., None], np.float32(0.0))
    part_b = np.where((wb > 0)[..., None], out_b * (wb / denom)[..., None], np.float32(0.0))
    out = (part_a + part_b).astype(np.float32)
    with np.errstate(divide="ignore"):
        lse = np.where(seen, safe_m + np.log(denom), np.float32(-np.inf)).astype(np.float32)
    return out, lse
