"""Dense attention: the test oracle for every paged kernel.

Plain NumPy, written for clarity rather than speed. The masking and softmax
rules stated here are the contract every kernel in :mod:`pagedattn.kernels`
implements:

* bottom-right aligned masks: query row ``i`` of ``q_len`` new tokens over
  ``k_len`` keys sits at position ``p = k_len - q_len + i``;
* it sees key ``j`` iff ``j <= p`` (causal) and, with a sliding window ``W``,
  ``p - W < j`` or ``j < num_sink_tokens`` (StreamingLLM attention sinks,
  Xiao et al. 2023, arXiv 2309.17453);
* grouped-query attention (Ainslie et al. 2023, arXiv 2305.13245): query head
  ``h`` reads kv head ``h // (num_heads // num_kv_heads)``;
* softmax in float32 with max subtraction; a row that sees no key yields zeros
  and log-sum-exp ``-inf``, never NaN.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

F32Array = npt.NDArray[np.float32]


def visible_mask(
    q_len: int,
    k_len: int,
    *,
    causal: bool = True,
    sliding_window: int | None = None,
    num_sink_tokens: int = 0,
) -> npt.NDArray[np.bool_]:
    """Which keys each query row sees.

    Args:
        q_len: number of query rows (the newest ``q_len`` positions), ``0 <= q_len``.
        k_len: number of keys, ``q_len <= k_len`` when ``causal``.
        causal: when False every key is visible (the window and sinks still apply,
            measured from the row's position).
        sliding_window: ``W >= 1``: row at position ``p`` sees keys ``p - W < j``; None = unbounded.
        num_sink_tokens: ``S >= 0``: keys ``j < S`` stay visible whatever the window.

    Returns:
        bool array ``(q_len, k_len)``; ``mask[i, j]`` is True iff row ``i`` sees key ``j``.

    Raises:
        ValueError: negative lengths, ``q_len > k_len`` with ``causal``, ``sliding_window < 1``
            or ``num_sink_tokens < 0``.
    """
    if q_len < 0 or k_len < 0:
        raise ValueError(f"q_len, k_len: expected >= 0, got ({q_len}, {k_len})")
    if causal and q_len > k_len:
        raise ValueError(f"q_len: expected <= k_len = {k_len} for causal attention, got {q_len}")
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window: expected None or >= 1, got {sliding_window}")
    if num_sink_tokens < 0:
        raise ValueError(f"num_sink_tokens: expected >= 0, got {num_sink_tokens}")
    pos = (k_len - q_len + np.arange(q_len))[:, None]
    key = np.arange(k_len)[None, :]
    mask = key <= pos if causal else np.ones((q_len, k_len), dtype=bool)
    if sliding_window is not None:
        mask = mask & ((key > pos - sliding_window) | (key < num_sink_tokens))
    return np.asarray(mask, dtype=bool)


def _check(name: str, a: np.ndarray, expected: tuple[int | str, ...]) -> None:
    if a.dtype != np.float32:
        raise ValueError(f"{name}: expected float32 {expected}, got dtype {a.dtype}")
    if a.ndim != len(expected) or any(
        isinstance(e, int) and e != s for e, s in zip(expected, a.shape, strict=False)
    ):
        raise ValueError(f"{name}: expected {expected}, got {a.shape}")


def reference_attention(
    q: F32Array,
    k: F32Array,
    v: F32Array,
    *,
    scale: float | None = None,
    causal: bool = True,
    sliding_window: int | None = None,
    num_sink_tokens: int = 0,
    q_sink: F32Array | None = None,
    return_lse: bool = False,
) -> F32Array | tuple[F32Array, F32Array]:
    """Dense scaled-dot-product attention of one sequence (Vaswani et al. 2017).

    Args:
        q: float32 ``(q_len, num_heads, head_dim)``, the newest ``q_len`` positions.
        k: float32 ``(k_len, num_kv_heads, head_dim)``; ``num_heads % num_kv_heads == 0``.
        v: float32 ``(k_len, num_kv_heads, head_dim)``.
        scale: multiplier of ``q . k``; defaults to ``1 / sqrt(head_dim)``.
        causal, sliding_window, num_sink_tokens: the mask, see :func:`visible_mask`.
        q_sink: optional float32, same shape as ``q``: keys ``j < num_sink_tokens`` are scored
            with ``q_sink`` instead of ``q`` (StreamingLLM shifted positions: the caller passes
            the query rotated to its in-cache position).
        return_lse: also return the natural-log log-sum-exp of the scaled scores per row.

    Returns:
        ``out`` float32 ``(q_len, num_heads, head_dim)`` and, with ``return_lse``, ``lse``
        float32 ``(q_len, num_heads)`` (``-inf`` for a row that sees no key; its ``out`` is 0).

    Raises:
        ValueError: a dtype or shape that does not match the ones above, naming the expected shape.
    """
    if q.ndim != 3:
        raise ValueError(f"q: expected (q_len, num_heads, head_dim), got {q.shape}")
    q_len, num_heads, head_dim = q.shape
    _check("q", q, ("q_len", "num_heads", "head_dim"))
    if k.ndim != 3:
        raise ValueError(f"k: expected (k_len, num_kv_heads, head_dim), got {k.shape}")
    k_len, num_kv_heads = k.shape[0], k.shape[1]
    _check("k", k, (k_len, num_kv_heads, head_dim))
    _check("v", v, (k_len, num_kv_heads, head_dim))
    if num_kv_heads == 0 or num_heads % num_kv_heads != 0:
        raise ValueError(
            f"k: expected num_kv_heads dividing num_heads = {num_heads}, got {num_kv_heads}"
        )
    if q_sink is not None:
        _check("q_sink", q_sink, (q_len, num_heads, head_dim))
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    group = num_heads // num_kv_heads
    mask = visible_mask(
        q_len, k_len, causal=causal, sliding_window=sliding_window, num_sink_tokens=num_sink_tokens
    )

    kh = np.repeat(k, group, axis=1).transpose(1, 0, 2)  # (num_heads, k_len, head_dim)
    vh = np.repeat(v, group, axis=1).transpose(1, 0, 2)
    scores = np.einsum("qhd,hkd->hqk", q, kh).astype(np.float32) * np.float32(scale)
    if q_sink is not None and num_sink_tokens > 0:
        s = min(num_sink_tokens, k_len)
        sink_scores = np.einsum("qhd,hkd->hqk", q_sink, kh[:, :s]).astype(np.float32)
        scores[:, :, :s] = sink_scores * np.float32(scale)
    scores = np.where(mask[None], scores, np.float32(-np.inf))  # (num_heads, q_len, k_len)

    row_max = scores.max(axis=-1, initial=-np.inf)
    safe_max = np.where(np.isfinite(row_max), row_max, np.float32(0.0))
    p = np.exp(scores - safe_max[..., None]).astype(np.float32)  # exp(-inf) = 0 on masked keys
    denom = p.sum(axis=-1, dtype=np.float32)
    seen = denom > 0
    out = np.einsum("hqk,hkd->qhd", p, vh).astype(np.float32)
    out = out / np.where(seen, denom, np.float32(1.0)).T[:, :, None]
    if not return_lse:
        return np.ascontiguousarray(out, dtype=np.float32)
    with np.errstate(divide="ignore"):
        lse = np.where(seen, safe_max + np.log(denom), np.float32(-np.inf)).T
    return np.ascontiguousarray(out, dtype=np.float32), np.ascontiguousarray(lse, dtype=np.float32)
