"""Write-through queue: full pages go to the store on a background thread.

The engine thread only copies a page out of the pool and enqueues it (``put_nowait``); a
daemon thread writes batches to the store. The queue is bounded: when it is full the pages are
dropped and counted, never waited for (SGLang HiCache's write-through policy, with the same
"never stall the forward" rule).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence

from pagedattn.storage.base import KVStore, StoredPage

_STOP = None


class BackgroundWriter:
    """Args:
        store: where pages go.
        max_pending: most batches waiting (>= 1); more are dropped.

    Raises:
        ValueError: ``max_pending`` < 1.
    """

    def __init__(self, store: KVStore, max_pending: int = 64) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending: expected >= 1, got {max_pending}")
        self.store = store
        self._queue: queue.Queue[list[StoredPage] | None] = queue.Queue(max_pending)
        self._lock = threading.Lock()
        self.num_dropped = 0
        self.num_failed = 0
        self._thread = threading.Thread(target=self._run, name="kv-store-writer", daemon=True)
        self._thread.start()

    @property
    def is_full(self) -> bool:
        """True when a submit now would be dropped (lets callers skip copying the pages)."""
        return self._queue.full()

    def submit(self, pages: Sequence[StoredPage]) -> bool:
        """Queue pages for writing without waiting; False (and counted) when the queue is full."""
        if not pages:
            return True
        try:
            self._queue.put_nowait(list(pages))
        except queue.Full:
            self.count_dropped(len(pages))
            return False
        return True

    def count_dropped(self, num_pages: int) -> None:
        with self._lock:
            self.num_dropped += num_pages

    def flush(self) -> None:
        """Wait until every queued page was written (or failed)."""
        self._queue.join()

    def close(self) -> None:
        """Write what is queued, then stop the thread (idempotent)."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()

    def _run(self) -> None:
        while True:
            pages = self._queue.get()
            try:
                if pages is _STOP:
                    return
                self.store.put(pages)
            except Exception:  # a store bug must not kill the writer; the pages are lost
                with self._lock:
                    self.num_failed += len(pages or ())
            finally:
                self._queue.task_done()
