"""The `pagedattn demo` run: a random token stream through KVStream, checked at every step.

The demo keeps its own record of every token's K/V. After each step it reads back every resident
page from the pool and compares it with that record (so a wrong slot or an aliased page shows
up), then recomputes the step's output with the dense oracle ``reference_attention`` over exactly
the resident positions the query may see (``p - W < j <= p`` or ``j < S``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pagedattn.cache.manager import EvictionPolicy
from pagedattn.stream.kv_stream import KVStream


@dataclass
class DemoReport:
    """What a demo run measured.

    Attributes:
        tokens: steps run. max_pages: the pool size.
        max_pages_resident / final_pages_resident: pages held (peak, at the end).
        pages_evicted: pages dropped (window + lossy LRU); evictions: counts by reason.
        attended_min / attended_mean / attended_max: tokens attended per step.
        max_abs_error: largest |paged - dense reference| over all steps and outputs.
        latency_p50_us / latency_p99_us: per-token ``step`` wall time, microseconds.
        failures: human-readable descriptions of every failed check (empty when all passed).
    """

    tokens: int
    max_pages: int
    max_pages_resident: int = 0
    final_pages_resident: int = 0
    pages_evicted: int = 0
    evictions: dict[str, int] = field(default_factory=dict)
    attended_min: int = 0
    attended_mean: float = 0.0
    attended_max: int = 0
    max_abs_error: float = 0.0
    latency_p50_us: float = 0.0
    latency_p99_us: float = 0.0
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


def run_demo(
    *,
    tokens: int,
    page_size: int = 16,
    max_pages: int = 8,
    sliding_window: int | None = 64,
    num_sink_tokens: int = 0,
    num_heads: int = 9,
    num_kv_heads: int = 3,
    head_dim: int = 64,
    seed: int = 0,
    eviction: EvictionPolicy = "evict_idle",
    tolerance: float = 1e-5,
    on_step: Callable[[], None] | None = None,
    backend: str = "numpy",
    device: str | None = None,
) -> DemoReport:
    """Stream ``tokens`` random float32 (q, k, v) tokens and check every step.

    Args:
        tokens: number of steps (>= 1).
        page_size, max_pages, sliding_window, num_sink_tokens, num_heads, num_kv_heads,
            head_dim, eviction: passed to :class:`KVStream`.
        seed: numpy Generator seed for the random tokens.
        tolerance: max allowed absolute error against the dense reference.
        on_step: called after each step (progress bars).
        backend, device: where the stream's pool lives and its step runs (see
            :class:`KVStream`); tokens go in as host arrays, outputs and pages are read back.

    Returns:
        The :class:`DemoReport`; ``report.ok`` is False on any mismatch above ``tolerance``,
        resident pages above ``max_pages`` or a pool page that disagrees with the record.

    Raises:
        ValueError: tokens < 1 or a bad stream configuration (BackendError: a bad backend).
        OutOfPagesError: the pool ran out under eviction "raise"/"reclaim".
    """
    from pagedattn.kernels import reference_attention

    if tokens < 1:
        raise ValueError(f"tokens must be >= 1, got {tokens}")
    stream = KVStream(
        num_heads,
        num_kv_heads,
        head_dim,
        page_size=page_size,
        max_pages=max_pages,
        sliding_window=sliding_window,
        num_sink_tokens=num_sink_tokens,
        eviction=eviction,
        backend=backend,
        device=device,
    )
    to_host: Callable[[Any], np.ndarray] = np.asarray  # numpy: no array-api-compat needed
    if stream.backend.name != "numpy":
        from pagedattn.backends.arrays import to_host

    rng = np.random.default_rng(seed)
    keys = np.empty((tokens, num_kv_heads, head_dim), np.float32)
    values = np.empty_like(keys)
    report = DemoReport(tokens=tokens, max_pages=max_pages)
    attended = np.empty(tokens, np.int64)
    latency = np.empty(tokens, np.float64)
    for p in range(tokens):
        q = rng.standard_normal((num_heads, head_dim), dtype=np.float32)
        keys[p] = rng.standard_normal((num_kv_heads, head_dim), dtype=np.float32)
        values[p] = rng.standard_normal((num_kv_heads, head_dim), dtype=np.float32)
        start = time.perf_counter()
        out = to_host(stream.step(q, keys[p], values[p]))  # on the host: the step is done
        latency[p] = time.perf_counter() - start

        resident = stream.resident_pages()
        if len(resident) > max_pages:
            report.failures.append(f"step {p}: {len(resident)} pages resident > {max_pages}")
        positions = []
        for page_id, first, last in resident:
            n = last - first + 1
            page = stream.pool.read_page(page_id)[0]  # host copy: (2, kv_heads, page_size, D)
            stored_k = page[0, :, :n].transpose(1, 0, 2)
            stored_v = page[1, :, :n].transpose(1, 0, 2)
            if not (
                np.array_equal(stored_k, keys[first : last + 1])
                and np.array_equal(stored_v, values[first : last + 1])
            ):
                report.failures.append(f"step {p}: page {page_id} does not hold {first}..{last}")
            positions.append(np.arange(first, last + 1))
        pos = np.concatenate(positions)
        in_window = pos > p - sliding_window if sliding_window is not None else pos >= 0
        pos = pos[in_window | (pos < num_sink_tokens)]
        attended[p] = pos.size
        if pos.size != stream.tokens_attended:
            report.failures.append(
                f"step {p}: stream reports {stream.tokens_attended} tokens attended, "
                f"the record {pos.size}"
            )
        ref = reference_attention(q[None], keys[pos], values[pos], scale=stream.scale, causal=False)
        assert isinstance(ref, np.ndarray)
        err = float(np.max(np.abs(out - ref[0])))
        report.max_abs_error = max(report.max_abs_error, err)
        if not err <= tolerance:
            report.failures.append(f"step {p}: max abs error {err:.3g} > {tolerance:g}")
        if on_step is not None:
            on_step()

    report.max_pages_resident = stream.max_pages_resident
    report.final_pages_resident = stream.pages_resident
    report.pages_evicted = stream.pages_evicted
    report.evictions = stream.manager.evictions
    report.attended_min = int(attended.min())
    report.attended_mean = float(attended.mean())
    report.attended_max = int(attended.max())
    report.latency_p50_us = float(np.percentile(latency, 50) * 1e6)
    report.latency_p99_us = float(np.percentile(latency, 99) * 1e6)
    return report
