"""KVTier: the persistent tier as the cache manager sees it (lookup/restore and write-through).

It joins a :class:`KVStore`, the :class:`BackgroundWriter` and the :class:`PagePool` (read and
written one host page at a time, whatever its backend): :meth:`lookup` returns the
longest run of consecutive pages the store holds and that pass every check, :meth:`load`
copies one into a pool page, :meth:`write` copies pool pages out and queues them.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from pagedattn.cache.hashing import PageKey
from pagedattn.storage.base import KVStore, StoredPage

if TYPE_CHECKING:
    from pagedattn.cache.page_pool import PagePool


class KVTier:
    """Args:
    store: the backend.
    pool: the page pool.
    max_pending: write batches the background queue holds before dropping.
    """

    def __init__(self, store: KVStore, pool: PagePool, *, max_pending: int = 64) -> None:
        from pagedattn.storage.writer import BackgroundWriter

        self.store = store
        self.pool = pool
        self.writer = BackgroundWriter(store, max_pending)
        self._lock = threading.Lock()
        self.num_restored_pages = 0

    def lookup(self, keys: Sequence[PageKey]) -> list[np.ndarray]:
        """KV of the longest prefix of ``keys`` whose pages are all stored and valid.

        Asks ``contains`` first (cheap), then reads only the consecutive run; a page that fails
        its checks ends the run.

        Returns:
            One array ``(num_layers, 2, num_kv_heads, page_size, head_dim)`` per restored page.
        """
        if not keys:
            return []
        present = self.store.contains([k.page_hash for k in keys])
        run = next((i for i, p in enumerate(present) if not p), len(keys))
        out: list[np.ndarray] = []
        for kv in self.store.get(keys[:run]):
            if kv is None:
                break
            out.append(kv)
        return out

    def load(self, page_id: int, kv: np.ndarray) -> None:
        """Copy a restored page into pool page ``page_id``."""
        self.pool.write_page(page_id, kv)
        with self._lock:
            self.num_restored_pages += 1

    def write(self, page_ids: Sequence[int], keys: Sequence[PageKey]) -> None:
        """Queue pool pages for the store (copied now; dropped and counted if the queue is full)."""
        if not page_ids:
            return
        if self.writer.is_full:
            self.writer.count_dropped(len(page_ids))
            return
        pages = [
            StoredPage(key, self.pool.read_page(page_id))
            for page_id, key in zip(page_ids, keys, strict=True)
        ]
        self.writer.submit(pages)

    def flush(self) -> None:
        """Wait for queued writes."""
        self.writer.flush()

    def close(self) -> None:
        """Finish queued writes and close the store."""
        self.writer.close()
        self.store.close()

    def stats(self) -> dict[str, Any]:
        """The store's :meth:`KVStore.stats` plus ``pages_restored``, ``writes_dropped``,
        ``writes_failed``."""
        s = dict(self.store.stats())
        s["pages_restored"] = self.num_restored_pages
        s["writes_dropped"] = self.writer.num_dropped
        s["writes_failed"] = self.writer.num_failed
        return s
