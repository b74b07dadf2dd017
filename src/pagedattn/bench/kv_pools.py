"""Decode-benchmark pools of each KV dtype: float32, float16, and int8 pages (codes, then
each row's float32 scale: :mod:`pagedattn.kernels.kv_int8`) built from float32 values."""

from __future__ import annotations

import numpy as np


def quantize_pool(values: np.ndarray) -> np.ndarray:
    """An int8 pool of float32 ``values`` (..., head_dim): each row's codes ``rint(x / s)``,
    ``s = absmax / 127``, then ``s`` in its last 4 bytes (:mod:`pagedattn.kernels.kv_int8`)."""
    absmax = np.abs(values).max(axis=-1, keepdims=True)
    scale = (absmax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        codes = np.where(scale > 0, np.rint(values / scale), 0)
    pool = np.empty((*values.shape[:-1], values.shape[-1] + 4), np.int8)
    pool[..., :-4] = np.clip(codes, -127, 127)
    pool.view(np.float32)[..., -1] = scale[..., 0]
    return pool


def dequantize_pool(pool: np.ndarray) -> np.ndarray:
    """float32 values of a pool of any KV dtype (an int8 pool: codes times their row's scale)."""
    if pool.dtype != np.int8:
        return pool.astype(np.float32)
    return pool[..., :-4].astype(np.float32) * pool.view(np.float32)[..., -1:]


def random_pool(shape: tuple[int, ...], dtype: str, rng: np.random.Generator) -> np.ndarray:
    """A pool of ``dtype`` holding uniform values in [-0.5, 0.5), ``shape`` in head_dim."""
    values = rng.random(shape, dtype=np.float32) - np.float32(0.5)
    return quantize_pool(values) if dtype == "int8" else values.astype(dtype)
