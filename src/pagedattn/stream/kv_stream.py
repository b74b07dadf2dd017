"""KVStream: one token stream through the paged cache (single-sequence facade for demos/tests).

Each :meth:`KVStream.step` writes one token's K/V into the page pool with ``write_kv`` and attends
its query over every resident page inside the window plus the sink pages with
``paged_attention_decode``. Memory stays bounded: with a sliding window W, pages leave as the
window passes (StreamingLLM, arXiv 2309.17453); when the pool is still too small (or there is no
window) and ``eviction="evict_idle"``, the stream drops its own oldest non-sink page (lossy).

The page pool lives on the stream's backend (:mod:`pagedattn.backends`): ``numpy`` runs the Numba
kernels, ``torch`` (cpu or cuda) and ``cupy`` run the array-namespace kernels of
:mod:`pagedattn.backends.xp_kernels` on the device, so only one token's q/k/v crosses per step.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from pagedattn.backends import resolve_backend
from pagedattn.cache.hashing import PageKey, cache_namespace, hash_page_tokens
from pagedattn.cache.manager import EVICTION_POLICIES, CacheManager, EvictionPolicy
from pagedattn.cache.page_pool import PagePool

_SEQ = 0


class KVStream:
    """A bounded paged KV cache for a single stream of decode steps.

    Args:
        num_heads: query heads (a multiple of ``num_kv_heads``).
        num_kv_heads: KV heads (GQA groups).
        head_dim: per-head width.
        page_size: tokens per page.
        max_pages: pages in the pool; resident pages never exceed it.
        sliding_window: W keys visible to each query (itself included), or None for all.
        num_sink_tokens: S first tokens kept resident and visible.
        eviction: ``"evict_idle"`` (drop the oldest non-sink page when the pool is full),
            ``"reclaim"`` or ``"raise"`` (raise :class:`OutOfPagesError` instead).
        scale: attention scale, default ``1 / sqrt(head_dim)``.
        backend: ``"numpy"`` (Numba kernels, host arrays), ``"torch"`` or ``"cupy"``: the
            library holding the page pool and running the step.
        device: ``"cpu"`` or ``"cuda"``; None = the backend's default (cuda for cupy).

    Raises:
        ValueError: a bad size, head split, window, sink count or eviction name.
        pagedattn.backends.BackendError: an unknown or invalid (backend, device) pair, or its
            library / device is missing (one line saying what to install).
    """

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int = 16,
        max_pages: int = 8,
        sliding_window: int | None = 64,
        num_sink_tokens: int = 0,
        eviction: EvictionPolicy = "evict_idle",
        scale: float | None = None,
        backend: str = "numpy",
        device: str | None = None,
    ) -> None:
        self.backend = resolve_backend(backend, device)
        if num_kv_heads < 1 or num_heads < 1 or num_heads % num_kv_heads:
            raise ValueError(
                f"num_heads ({num_heads}) must be a positive multiple of num_kv_heads "
                f"({num_kv_heads})"
            )
        if eviction not in EVICTION_POLICIES:
            raise ValueError(f"eviction must be one of {EVICTION_POLICIES}, got {eviction!r}")
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.page_size = page_size
        self.max_pages = max_pages
        self.sliding_window = sliding_window
        self.num_sink_tokens = num_sink_tokens
        self.eviction: EvictionPolicy = eviction
        self.scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
        self.pool = PagePool(1, max_pages, num_kv_heads, page_size, head_dim, backend=self.backend)
        self._paged_ops = self._ops()  # here, so a missing array-api-compat fails at once
        self.manager = CacheManager(
            max_pages,
            page_size,
            b"kvstream",
            sliding_window=sliding_window,
            num_sink_tokens=num_sink_tokens,
            policy=eviction,
            enable_prefix_caching=False,
        )
        self.manager.add_sequence(_SEQ)
        self.tokens_attended = 0
        self.max_pages_resident = 0

    # ---- measurements --------------------------------------------------------------------

    @property
    def num_tokens(self) -> int:
        """Tokens written so far (the next token's position)."""
        return self.manager.num_tokens(_SEQ)

    @property
    def page_table(self) -> list[int]:
        """Page ids in position order; -1 for pages that left the cache."""
        return self.manager.page_table(_SEQ)

    @property
    def pages_resident(self) -> int:
        """Pages the stream holds now."""
        return sum(p != -1 for p in self.page_table)

    @property
    def pages_evicted(self) -> int:
        """Pages dropped so far (left the window, or lossy eviction of the oldest page)."""
        ev = self.manager.evictions
        return ev["sliding_window"] + ev["lossy"]

    def resident_pages(self) -> list[tuple[int, int, int]]:
        """``(page_id, first_position, last_position)`` of every resident page, position order.

        ``last_position`` is the last position written (a partial last page ends early).
        """
        ps, n = self.page_size, self.num_tokens
        return [
            (page_id, i * ps, min((i + 1) * ps, n) - 1)
            for i, page_id in enumerate(self.page_table)
            if page_id != -1
        ]

    def attended_positions(self) -> np.ndarray:
        """int64 positions the newest token attends: resident and visible (window or sink)."""
        newest = self.num_tokens - 1
        lo = -1 if self.sliding_window is None else newest - self.sliding_window
        out = [
            np.arange(first, last + 1, dtype=np.int64) for _, first, last in self.resident_pages()
        ]
        pos = np.concatenate(out) if out else np.zeros(0, np.int64)
        keep: np.ndarray = pos[(pos > lo) | (pos < self.num_sink_tokens)]
        return keep

    # ---- the step ------------------------------------------------------------------------

    def step(self, q: Any, k: Any, v: Any) -> Any:
        """Write one token's K/V and attend its query over the resident visible keys.

        Args:
            q: float32 ``(num_heads, head_dim)``.
            k, v: float32 ``(num_kv_heads, head_dim)``.
            On ``numpy`` host NumPy arrays; on ``torch`` / ``cupy`` arrays of that library
            (moved to the stream's device if elsewhere) or host NumPy arrays (copied there).

        Returns:
            float32 ``(num_heads, head_dim)`` attention output, an array of the stream's
            backend on its device (NumPy for ``numpy``).

        Raises:
            ValueError: a wrong shape or dtype (the message names the expected shape).
            OutOfPagesError: no page for the token (eviction "raise"/"reclaim", or only sink
                pages left to drop).
        """
        q, k, v = self._inputs(q, k, v)
        if self.eviction == "evict_idle" and not self.manager.can_append(_SEQ, 1):
            self.manager.evict_oldest_page(_SEQ)
        slots = self.manager.append_slots(_SEQ, [self.num_tokens])
        k_cache, v_cache = self.pool.k_cache(0), self.pool.v_cache(0)
        ops = self._paged_ops
        ops.write_kv(k_cache, v_cache, k[None, ...], v[None, ...], slots)
        self.manager.commit_written(_SEQ)
        out = ops.paged_attention_decode(
            q[None, ...],
            k_cache,
            v_cache,
            self.manager.page_tables([_SEQ]),
            np.array([self.num_tokens], np.int32),
            scale=self.scale,
            sliding_window=self.sliding_window,
            num_sink_tokens=self.num_sink_tokens,
        )
        self.tokens_attended = int(self.attended_positions().size)
        self.max_pages_resident = max(self.max_pages_resident, self.pages_resident)
        return out[0, ...]

    def _inputs(self, q: Any, k: Any, v: Any) -> tuple[Any, Any, Any]:
        """q, k, v checked (and moved to the backend's device)."""
        kv_names = "(num_kv_heads, head_dim)"
        shapes = (
            ("q", q, (self.num_heads, self.head_dim), "(num_heads, head_dim)"),
            ("k", k, (self.num_kv_heads, self.head_dim), kv_names),
            ("v", v, (self.num_kv_heads, self.head_dim), kv_names),
        )
        if self.backend.name == "numpy":
            for args in shapes:
                self._check(*args)
            return q, k, v
        from pagedattn.backends.arrays import backend_array

        q, k, v = (backend_array(n, a, self.backend, shape, w) for n, a, shape, w in shapes)
        return q, k, v

    def _ops(self) -> Any:
        if self.backend.name == "numpy":  # the Numba kernels (no array-api-compat needed)
            import pagedattn.kernels as numba_ops

            return numba_ops
        from pagedattn.backends.paged_ops import paged_ops

        return paged_ops(self.backend)

    # ---- persistence -----------------------------------------------------------------------

    @property
    def namespace(self) -> bytes:
        """What a saved stream must match to be loaded: geometry, window, sinks, dtype."""
        return cache_namespace(
            model_fingerprint="kvstream",
            dtype="float32",
            page_size=self.page_size,
            num_layers=1,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            rope_theta=1.0,
            rope_scaling=f"num_heads={self.num_heads},scale={self.scale!r}",
            sliding_window=self.sliding_window,
            num_sink_tokens=self.num_sink_tokens,
        )

    def _page_keys(self, num_tokens: int) -> list[PageKey]:
        """Key of every page (resident or not): chained hashes over the page's positions."""
        ps, keys, parent = self.page_size, [], None
        for first in range(0, num_tokens, ps):
            positions = tuple(range(first, min(first + ps, num_tokens)))
            page_hash = hash_page_tokens(parent, np.asarray(positions), self.namespace)
            keys.append(PageKey(page_hash, parent, positions))
            parent = page_hash
        return keys

    def save(self, path: str | Path) -> None:
        """Write the resident pages and the stream position to ``path`` (atomic), in the page
        record format of :mod:`pagedattn.storage.record` (never pickle).

        Raises:
            OSError: the write failed.
        """
        from pagedattn.storage.stream_file import write_stream_file

        keys = self._page_keys(self.num_tokens)
        pages = [
            (keys[i], self.pool.read_page(page_id))
            for i, page_id in enumerate(self.page_table)
            if page_id != -1
        ]
        write_stream_file(path, self.namespace, self.num_tokens, pages)

    def load(self, path: str | Path) -> None:
        """Restore a saved stream into this fresh stream (same configuration).

        The page table is rebuilt by replaying the saved number of tokens through the same
        window / eviction rules, then every resident page takes its saved KV; each record is
        checked (checksum, namespace = this configuration, hash chain, positions, shape).

        Raises:
            ValueError: this stream has already written tokens.
            RecordError: a damaged file, or one saved under another configuration.
        """
        from pagedattn.storage.record import RecordError
        from pagedattn.storage.stream_file import read_stream_file

        if self.num_tokens:
            raise ValueError(
                f"load: expected a fresh stream, this one has {self.num_tokens} tokens"
            )
        shape = (1, 2, self.num_kv_heads, self.page_size, self.head_dim)
        num_tokens, records = read_stream_file(
            path, self.namespace, shape, np.float32, self.max_pages
        )
        keys = self._page_keys(num_tokens)
        for pos in range(num_tokens):
            if self.eviction == "evict_idle" and not self.manager.can_append(_SEQ, 1):
                self.manager.evict_oldest_page(_SEQ)
            self.manager.append_slots(_SEQ, [pos])
            self.max_pages_resident = max(self.max_pages_resident, self.pages_resident)
        resident = [(i, p) for i, p in enumerate(self.page_table) if p != -1]
        if [r.key for r in records] != [keys[i] for i, _ in resident]:
            raise RecordError("tokens", f"{path}: the saved pages are not this stream's pages")
        for (_, page_id), record in zip(resident, records, strict=True):
            self.pool.write_page(page_id, record.kv)
        self.tokens_attended = int(self.attended_positions().size) if num_tokens else 0

    @staticmethod
    def _check(name: str, a: np.ndarray, shape: tuple[int, int], names: str) -> None:
        if not isinstance(a, np.ndarray) or a.dtype != np.float32 or a.shape != shape:
            got = f"{a.dtype} {a.shape}" if isinstance(a, np.ndarray) else type(a).__name__
            raise ValueError(f"{name}: expected float32 {names} = {shape}, got {got}")
