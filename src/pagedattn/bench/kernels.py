"""Decode attention benchmark: paged Numba kernel vs memory-copy bandwidth and torch SDPA.

Every figure is measured in the same run, so the ratios (not the absolute times) are what
carry over between machines:

* ``paged``: :func:`pagedattn.kernels.paged_attention_decode` over a pool whose page ids are
  shuffled (a fragmented cache), in float32, float16 or int8 (``kv_cache_dtype``), median
  wall time of ``repeats`` calls after a warm-up;
* ``KV GB/s``: bytes of K and V the call must read (``batch * context * num_kv_heads *
  row * itemsize * 2``, row = head_dim, or head_dim + 4 for int8's codes and scale) divided
  by that time;
* ``read GB/s``: a read-only pass over the same K and V pages (a parallel Numba float32 sum of
  every 4 bytes, as many threads as the kernel), bytes read / time; ``% read`` is the paged
  kernel's KV GB/s over it (the "vs read pass" comparison);
* ``copy GB/s``: ``np.copyto`` between two buffers of the same size as that K+V, counting
  bytes read plus bytes written (``2 * size``, as STREAM's Copy does);
* ``torch``: ``torch.nn.functional.scaled_dot_product_attention(enable_gqa=True)`` on dense
  contiguous float32 ``(batch, heads, context, head_dim)`` K/V (the dtype HF runs the model
  in, whatever ``kv_cache_dtype`` is), with the same thread count;
* ``xp``: with ``backends`` (float32 only), the array-namespace kernel
  (:func:`pagedattn.backends.xp_kernels.paged_attention_decode`) over the same pages and page
  tables moved onto each backend (e.g. torch on the CPU), timed with the device synchronized
  after the others.

The paged kernel, the read pass, the copy and SDPA are timed in turn, one call each per round
(:func:`interleaved_median_ms`), so every ratio compares the same moments of the machine.
"""

from __future__ import annotations

import contextlib
import functools
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pagedattn.backends import BackendSpec

NUM_HEADS = 9
NUM_KV_HEADS = 3
HEAD_DIM = 64
PAGE_SIZE = 16
TORCH_HINT = "torch not installed (pip install torch==2.13.0)"


@dataclass(frozen=True)
class DecodeResult:
    """One (batch, context) row of the decode benchmark; times in ms, bandwidths in GB/s."""

    batch: int
    context: int
    paged_ms: float
    kv_gbps: float
    copy_gbps: float
    read_gbps: float
    torch_ms: float | None
    xp_ms: tuple[tuple[BackendSpec, float], ...] = ()  # the xp kernel on each backend asked for

    @property
    def pct_copy(self) -> float:
        return 100.0 * self.kv_gbps / self.copy_gbps

    @property
    def pct_read(self) -> float:
        return 100.0 * self.kv_gbps / self.read_gbps

    @property
    def speedup(self) -> float | None:
        return None if self.torch_ms is None else self.torch_ms / self.paged_ms


def median_ms(fn: Callable[[], object], repeats: int, warmup: int = 2) -> float:
    """Median wall time of ``fn()`` in milliseconds over ``repeats`` calls after ``warmup``."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def interleaved_median_ms(
    timers: Mapping[str, Callable[[], object]], rounds: int, warmup: int = 1
) -> dict[str, float]:
    """Median wall time in milliseconds of each of ``timers``, called in turn once per round
    for ``rounds`` rounds after ``warmup`` untimed calls each: every timer sees the same
    moments of the machine, the same-run comparison the benchmarks report as ratios."""
    for _ in range(warmup):
        for fn in timers.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in timers}
    for _ in range(rounds):
        for name, fn in timers.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: 1e3 * statistics.median(values) for name, values in times.items()}


def _copy_timer(num_bytes: int) -> Callable[[], object]:
    """One ``np.copyto`` between two buffers of ``num_bytes`` each (moves ``2 * num_bytes``)."""
    src = np.ones(max(num_bytes, 4) // 4, np.float32)
    dst = np.empty_like(src)
    return lambda: np.copyto(dst, src)


@functools.cache
def _read_kernel() -> Any:
    import numba

    @numba.njit(parallel=True, fastmath=True, nogil=True)
    def read_all(flat: np.ndarray, chunk: int) -> float:  # pragma: no cover - compiled
        total = 0.0
        for c in numba.prange((flat.shape[0] + chunk - 1) // chunk):
            s = np.float32(0.0)
            for i in range(c * chunk, min(flat.shape[0], (c + 1) * chunk)):
                s += flat[i]
            total += float(s)
        return total

    return read_all


def _read_timer(arrays: Sequence[np.ndarray]) -> Callable[[], object]:
    """A read-only pass over ``arrays`` (every 4 bytes summed as a float32, in parallel): the
    bytes a decode step must read, in the memory they sit in, without a write stream. A float16
    pool is read as float32 pairs, the same bytes; a float sum, because it reads faster here
    than an integer one (10.8 against 8.7 GB/s on 25 MB, same process)."""
    read_all = _read_kernel()
    flats = [a.reshape(-1).view(np.float32) for a in arrays]
    chunk = 1 << 14
    return lambda: [read_all(f, chunk) for f in flats]


def _torch_sdpa_timer(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, threads: int
) -> Callable[[], object] | None:
    """SDPA with GQA on dense ``(batch, kv_heads, context, head_dim)`` K/V; None without torch."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(threads)
    tq = torch.from_numpy(q).unsqueeze(2)  # (batch, heads, 1, head_dim)
    tk, tv = torch.from_numpy(k), torch.from_numpy(v)  # (batch, kv_heads, context, head_dim)
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def call() -> object:
        with torch.inference_mode():
            return sdpa(tq, tk, tv, enable_gqa=True)

    return call


def _synchronize(spec: BackendSpec) -> Callable[[], None]:
    """A function waiting for the backend's device to finish queued work (CUDA is async)."""
    if spec.device != "cuda":
        return lambda: None
    from pagedattn.backends import array_module

    xp = array_module(spec)
    if spec.name == "torch":
        return lambda: xp.cuda.synchronize()
    return lambda: xp.cuda.Device().synchronize()


def xp_decode_ms(
    spec: BackendSpec, arrays: tuple[np.ndarray, ...], repeats: int, threads: int
) -> float:
    """Median ms of the array-namespace decode kernel on ``spec``.

    Args:
        arrays: host ``(q, k_cache, v_cache, page_tables, context_lens)``; the float arrays
            are moved onto the backend once, the integer tables stay on the host (the kernel
            moves them per call, as a caller would).
        threads: torch's intra-op threads on the CPU (the same count the Numba kernel uses).
    """
    from pagedattn.backends.arrays import to_backend
    from pagedattn.backends.xp_kernels import paged_attention_decode

    q, k_cache, v_cache, page_tables, context_lens = arrays
    dq, dk, dv = (to_backend(a, spec) for a in (q, k_cache, v_cache))
    sync = _synchronize(spec)
    context: Any = contextlib.nullcontext()
    if spec.name == "torch":
        import torch

        torch.set_num_threads(threads)
        context = torch.inference_mode()

    def call() -> None:
        paged_attention_decode(dq, dk, dv, page_tables, context_lens)
        sync()

    with context:
        return median_ms(call, repeats)


def check_decode_options(kv_cache_dtype: str, backends: Sequence[BackendSpec]) -> None:
    """Raise ValueError for a ``kv_cache_dtype`` other than float32 / float16 / int8, or for
    ``backends`` with another than float32 (the xp kernel reads float32 pools)."""
    from pagedattn.config import KV_CACHE_DTYPES

    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(
            f"--kv-cache-dtype: expected one of {KV_CACHE_DTYPES}, got {kv_cache_dtype!r}"
        )
    if backends and kv_cache_dtype != "float32":
        raise ValueError("--backend times the xp kernel on float32 pools only")


def bench_decode(
    batch: int,
    context: int,
    repeats: int,
    *,
    seed: int = 0,
    backends: Sequence[BackendSpec] = (),
    kv_cache_dtype: str = "float32",
) -> DecodeResult:
    """Time one decode configuration (9 query heads, 3 kv heads, head_dim 64, page_size 16):
    the Numba kernel over a ``kv_cache_dtype`` pool (``"float32"``, ``"float16"``, ``"int8"``), a
    read-only pass over that pool, a copy of as many bytes and torch SDPA on the same keys and
    values in dense float32, interleaved; then the xp kernel on each of ``backends``.

    Raises:
        ValueError: an unknown ``kv_cache_dtype``, or ``backends`` with float16 (the xp kernel
            reads float32 pools).
    """
    import numba

    from pagedattn.bench.kv_pools import dequantize_pool, random_pool
    from pagedattn.kernels import paged_attention_decode

    check_decode_options(kv_cache_dtype, backends)
    rng = np.random.default_rng(seed)
    pages_per_seq = math.ceil(context / PAGE_SIZE)
    num_pages = batch * pages_per_seq
    shape = (num_pages, NUM_KV_HEADS, PAGE_SIZE, HEAD_DIM)
    dtype = np.dtype(kv_cache_dtype)
    k_cache = random_pool(shape, kv_cache_dtype, rng)
    v_cache = random_pool(shape, kv_cache_dtype, rng)
    page_tables = rng.permutation(num_pages).astype(np.int32).reshape(batch, pages_per_seq)
    context_lens = np.full(batch, context, np.int32)
    q = rng.standard_normal((batch, NUM_HEADS, HEAD_DIM), dtype=np.float32)
    threads = numba.get_num_threads()
    kv_bytes = 2 * batch * context * NUM_KV_HEADS * k_cache.shape[-1] * dtype.itemsize

    # The same keys, gathered into dense float32 (batch, kv_heads, context, head_dim) for torch.
    def dense(cache: np.ndarray) -> np.ndarray:
        tiles = dequantize_pool(cache[page_tables])  # (batch, pages, kv_heads, page_size, D)
        flat = tiles.transpose(0, 2, 1, 3, 4).reshape(batch, NUM_KV_HEADS, -1, HEAD_DIM)
        return np.ascontiguousarray(flat[:, :, :context], dtype=np.float32)

    timers: dict[str, Callable[[], object]] = {
        "paged": lambda: paged_attention_decode(q, k_cache, v_cache, page_tables, context_lens),
        "read": _read_timer((k_cache, v_cache)),
        "copy": _copy_timer(kv_bytes),
    }
    sdpa = _torch_sdpa_timer(q, dense(k_cache), dense(v_cache), threads)
    if sdpa is not None:
        timers["torch"] = sdpa
    ms = interleaved_median_ms(timers, repeats, warmup=2)
    arrays = (q, k_cache, v_cache, page_tables, context_lens)
    xp_ms = tuple((spec, xp_decode_ms(spec, arrays, repeats, threads)) for spec in backends)
    return DecodeResult(
        batch,
        context,
        paged_ms=ms["paged"],
        kv_gbps=kv_bytes / (ms["paged"] * 1e6),
        copy_gbps=2 * kv_bytes / (ms["copy"] * 1e6),  # read + written
        read_gbps=kv_bytes / (ms["read"] * 1e6),
        torch_ms=ms.get("torch"),
        xp_ms=xp_ms,
    )
