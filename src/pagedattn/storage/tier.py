"""KVTier: the persistent tier as the cache manager sees it (lookup/restore and write-through).

It joins a :class:`KVStore`, the :class:`BackgroundWriter` and the :class:`PagePool` (read and
written one host page at a time, whatever its backend): :meth:`lookup` returns the
longest run of consecutive pages the store holds and that pass every check, :meth:`load`
copies one into a pool page, :meth:`write` copies pool pages out and queues them.

The engine never waits on the store: it runs :meth:`fetch` on its restore thread
(:mod:`pagedattn.engine.kv_restores`) while the request waits for its KV, and gives up at
``lookup_deadline_s`` (:meth:`count_deadline`). :meth:`lookup` is the same read for a caller
that waits: the store is read on a lookup thread, a few pages per call, and the caller waits
at most ``lookup_deadline_s`` per step (:meth:`begin_step` starts a step's budget). Either
way, pages fetched by the deadline are used; the rest are recomputed and counted
(``lookups_timed_out``, ``lookup_pages_dropped``, and the error kind ``deadline``). While a
lookup that overran is still on the network, the next ones are misses at once
(``lookups_skipped``), so a stalled store costs at most the deadline.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from pagedattn.cache.hashing import PageKey
from pagedattn.cache.tier_fetch import FetchJob
from pagedattn.storage.base import KVStore, StoredPage

if TYPE_CHECKING:
    from pagedattn.cache.group_pool import GroupPages
    from pagedattn.cache.page_pool import PagePool

#: Pages one store read asks for (one Redis round trip of at most ``batch_pages`` commands).
LOOKUP_CHUNK_PAGES = 8


class KVTier:
    """Args:
    store: the backend.
    pool: the page pool, or one layer group's pages of it (a hybrid KV cache).
    max_pending: write batches the background queue holds before dropping.
    lookup_deadline_s: the most seconds the engine thread waits on lookups per step (> 0).

    Raises:
        ValueError: a deadline <= 0.
    """

    def __init__(
        self,
        store: KVStore,
        pool: PagePool | GroupPages,
        *,
        max_pending: int = 64,
        lookup_deadline_s: float = 0.5,
    ) -> None:
        from pagedattn.storage.writer import BackgroundWriter

        if not lookup_deadline_s > 0:
            raise ValueError(f"lookup_deadline_s: expected > 0, got {lookup_deadline_s!r}")
        self.store = store
        self.pool = pool
        self.lookup_deadline_s = float(lookup_deadline_s)
        self.writer = BackgroundWriter(store, max_pending)
        self._lookups = concurrent.futures.ThreadPoolExecutor(1, "kv-store-lookup")
        self._running: concurrent.futures.Future[None] | None = None
        self._step_waited = 0.0
        self._lock = threading.Lock()
        self._closed = False
        self.num_restored_pages = 0
        self.num_lookups_timed_out = 0
        self.num_lookups_skipped = 0
        self.num_lookup_pages_dropped = 0

    def begin_step(self) -> None:
        """A new engine step: its lookups share a fresh ``lookup_deadline_s``."""
        self._step_waited = 0.0

    def lookup(self, keys: Sequence[PageKey]) -> list[np.ndarray]:
        """KV of the longest prefix of ``keys`` whose pages are all stored and valid, as far
        as the step's deadline allows.

        Asks ``contains`` first (cheap), then reads only the consecutive run, a few pages per
        call; a page that fails its checks ends the run.

        Returns:
            One array ``(num_layers, 2, num_kv_heads, page_size, head_dim)`` per restored page.
        """
        if not keys:
            return []
        budget = self.lookup_deadline_s - self._step_waited
        if budget <= 0 or (self._running is not None and not self._running.done()):
            with self._lock:
                self.num_lookups_skipped += 1
                self.num_lookup_pages_dropped += len(keys)
            return []
        job = FetchJob(keys)
        t0 = time.monotonic()
        future = self._lookups.submit(self.fetch, job)
        try:
            future.result(timeout=budget)
        except concurrent.futures.TimeoutError:
            with job.lock:
                job.abandoned = True
                pages = list(job.pages)
            self._running = future
            with self._lock:
                self.num_lookups_timed_out += 1
                self.num_lookup_pages_dropped += len(keys) - len(pages)
            self._step_waited += time.monotonic() - t0
            return pages
        self._step_waited += time.monotonic() - t0
        return job.pages

    def fetch(self, job: FetchJob) -> None:
        """The consecutive run of stored, valid pages of ``job.keys`` into ``job.pages``,
        chunk by chunk, until the run ends or the job is abandoned. Runs on the calling thread
        (a lookup or restore thread, never the engine's): store I/O, record checks, checksums
        and signatures happen here. Raises what the store raises."""
        keys = job.keys
        if job.abandoned:
            return
        present = self.store.contains([k.page_hash for k in keys])
        run = next((i for i, p in enumerate(present) if not p), len(keys))
        for lo in range(0, run, LOOKUP_CHUNK_PAGES):
            if job.abandoned:
                return
            got = self.store.get(keys[lo : min(run, lo + LOOKUP_CHUNK_PAGES)])
            with job.lock:
                if job.abandoned:
                    return
                for kv in got:
                    if kv is None:
                        return
                    job.pages.append(kv)

    def count_deadline(self, *, skipped: bool, pages_dropped: int) -> None:
        """Count a lookup given up at its deadline (``skipped``: a miss at once, an overrun
        read still being on the network) and the pages it asked for and did not get."""
        with self._lock:
            if skipped:
                self.num_lookups_skipped += 1
            else:
                self.num_lookups_timed_out += 1
            self.num_lookup_pages_dropped += pages_dropped

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
        """Finish queued writes and close the store (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self.writer.close()
        self._lookups.shutdown(wait=True)
        self.store.close()

    def stats(self) -> dict[str, Any]:
        """The store's :meth:`KVStore.stats` plus ``pages_restored``, ``writes_dropped``,
        ``writes_failed``, ``lookups_timed_out`` (lookups that hit the step's deadline),
        ``lookups_skipped`` (misses at once: the step's deadline was spent, or an overrun
        lookup was still on the network) and ``lookup_pages_dropped`` (pages those lookups
        asked for and did not get); both lookup counts also appear as ``errors["deadline"]``."""
        s = dict(self.store.stats())
        s["pages_restored"] = self.num_restored_pages
        s["writes_dropped"] = self.writer.num_dropped
        s["writes_failed"] = self.writer.num_failed
        with self._lock:
            s["lookups_timed_out"] = self.num_lookups_timed_out
            s["lookups_skipped"] = self.num_lookups_skipped
            s["lookup_pages_dropped"] = self.num_lookup_pages_dropped
            dropped = self.num_lookups_timed_out + self.num_lookups_skipped
        if dropped:
            s["errors"] = {**s.get("errors", {}), "deadline": dropped}
        return s
