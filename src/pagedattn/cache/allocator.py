"""PageAllocator: reference counts and an O(1) LRU free queue over the prefix-hash index.

Follows vLLM v1's ``BlockPool`` (``vllm/v1/core/block_pool.py``): a page whose reference count
drops to zero goes back to the free queue but keeps its prefix hash, so a later request with the
same prefix can take it back (``touch``) in O(1); allocation hands out the least recently used
free page and only then drops its hash entry. One deliberate difference: a freed page that holds
no cached prefix is queued at the LRU end, so it is reused before any cached page is evicted
(vLLM queues every freed block at the tail).

The prefix index itself (records, serials, written flags) is
:class:`pagedattn.cache.prefix_index.PrefixIndex`; the allocator checks references around it:
only a referenced page is registered or unregistered, and a failed step's entries are taken
back before its pages are released, so a free page in the index always holds written KV.
"""

from __future__ import annotations

from collections.abc import Sequence

from pagedattn.cache.free_queue import FreeQueue
from pagedattn.cache.hashing import PageHash
from pagedattn.cache.prefix_index import CachedPage, PrefixIndex


class OutOfPagesError(RuntimeError):
    """No free page can be allocated under the active policy (the engine preempts on it)."""


class PageAllocator:
    """Hands out page ids ``0 .. num_pages - 1`` and tracks who references them.

    Args:
        num_pages: pages in the pool (> 0).
        namespace: cache namespace bytes, used to re-hash stored token ids in
            :meth:`check_integrity`.

    Attributes:
        num_lru_evictions: cached free pages whose hash entry was dropped to reuse the page.

    Raises:
        ValueError: num_pages < 1.
    """

    def __init__(self, num_pages: int, namespace: bytes) -> None:
        if not isinstance(num_pages, int) or num_pages < 1:
            raise ValueError(f"num_pages must be a positive int, got {num_pages!r}")
        self.num_pages = num_pages
        self.namespace = namespace
        self._queue = FreeQueue(num_pages, range(num_pages))
        self._refcount = [0] * num_pages
        self._index = PrefixIndex(num_pages, namespace)
        self._num_uncached_free = num_pages
        self.num_lru_evictions = 0

    # ---- queries -------------------------------------------------------------------------

    @property
    def num_free_pages(self) -> int:
        """Pages with no reference (empty ones and cached ones)."""
        return len(self._queue)

    @property
    def num_cached_pages(self) -> int:
        """Pages registered in the prefix index (referenced or not)."""
        return len(self._index)

    def cached_hashes(self) -> list[PageHash]:
        """The hashes of every page in the prefix index (a copy; safe to call from another
        thread while the owner mutates the index: copying a dict of bytes keys holds the GIL)."""
        return self._index.hashes()

    def num_allocatable(self, *, reclaim_cached: bool = True) -> int:
        """Pages :meth:`allocate` can hand out now (cached free ones only if reclaim_cached)."""
        return len(self._queue) if reclaim_cached else self._num_uncached_free

    def refcount(self, page_id: int) -> int:
        """Number of page-table entries that reference ``page_id``."""
        self._check_page(page_id)
        return self._refcount[page_id]

    def cached_page(self, page_id: int) -> CachedPage | None:
        """The prefix-index record of ``page_id``, or None when it holds no cached prefix."""
        self._check_page(page_id)
        return self._index.record(page_id)

    def is_written(self, page_id: int) -> bool:
        """True when the page is registered and marked written (see :meth:`mark_written`)."""
        self._check_page(page_id)
        return self._index.is_written(page_id)

    def free_page_ids(self) -> list[int]:
        """Free page ids from the LRU end (allocated next) to the MRU end."""
        return list(self._queue)

    # ---- reference counting --------------------------------------------------------------

    def allocate(self, *, reclaim_cached: bool = True) -> int:
        """Take the least recently used free page; its refcount becomes 1.

        Args:
            reclaim_cached: when the LRU free page holds a cached prefix, drop that hash entry
                and reuse it (counted in ``num_lru_evictions``); when False, raise instead.

        Returns:
            The page id.

        Raises:
            OutOfPagesError: no free page, or only cached ones and ``reclaim_cached`` is False.
        """
        if not self._queue:
            raise OutOfPagesError(f"all {self.num_pages} pages are referenced")
        page_id = self._queue.peek_front()
        if self._index.record(page_id) is not None:
            if not reclaim_cached:
                raise OutOfPagesError(
                    f"no empty page: {len(self._queue)} free pages all hold cached prefixes"
                )
            self._index.remove(page_id)
            self.num_lru_evictions += 1
        else:
            self._num_uncached_free -= 1
        self._queue.remove(page_id)
        self._refcount[page_id] = 1
        return page_id

    def touch(self, page_id: int) -> None:
        """Add one reference (a prefix hit). A free cached page leaves the queue in O(1).

        Raises:
            ValueError: ``page_id`` is free and holds no cached prefix (nothing to share).
        """
        self._check_page(page_id)
        if self._refcount[page_id] == 0:
            if self._index.record(page_id) is None:
                raise ValueError(f"touch: page {page_id} is free and holds no cached prefix")
            self._queue.remove(page_id)
        self._refcount[page_id] += 1

    def release(self, page_id: int) -> bool:
        """Drop one reference; at zero the page returns to the free queue.

        A page holding a cached prefix is queued at the MRU end (stays reusable until it is the
        least recently used); an empty page at the LRU end (reused first).

        Returns:
            True when the page became free.

        Raises:
            ValueError: the page has no reference left (double free).
        """
        self._check_page(page_id)
        if self._refcount[page_id] == 0:
            raise ValueError(f"double free: page {page_id} has no reference left")
        self._refcount[page_id] -= 1
        if self._refcount[page_id]:
            return False
        if self._index.record(page_id) is not None:
            self._queue.push_back(page_id)
        else:
            self._queue.push_front(page_id)
            self._num_uncached_free += 1
        return True

    def free(self, page_id: int) -> None:
        """Return a page the caller references exclusively to the free queue.

        Raises:
            ValueError: the page is already free (double free) or other references remain.
        """
        self._check_page(page_id)
        count = self._refcount[page_id]
        if count != 1:
            what = "double free" if count == 0 else f"{count - 1} other reference(s) remain"
            raise ValueError(f"free: page {page_id}: {what}")
        self.release(page_id)

    # ---- prefix index --------------------------------------------------------------------

    def lookup(
        self, page_hash: PageHash, token_ids: Sequence[int], parent_serial: int | None
    ) -> CachedPage | None:
        """Find the cached page for ``page_hash`` if its stored content is exactly this prefix.

        Args:
            page_hash: chained hash of the page being looked up.
            token_ids: (page_size,) the page's token ids; compared with the stored ones.
            parent_serial: serial of the page hit just before (None for a first page).

        Returns:
            The record (its page id via :meth:`page_of`), or None on a miss or a collision.
        """
        return self._index.lookup(page_hash, token_ids, parent_serial)

    def page_of(self, page_hash: PageHash) -> int:
        """Page id currently registered under ``page_hash``. Raises KeyError when absent."""
        return self._index.page_of(page_hash)

    def register(
        self,
        page_id: int,
        page_hash: PageHash,
        parent_hash: PageHash | None,
        token_ids: Sequence[int],
        parent_serial: int | None,
    ) -> int | None:
        """Enter a full, referenced page into the prefix index.

        Returns:
            The serial now serving this exact prefix: a new one, or an existing identical
            entry's (same hash, tokens and parent) when another page already holds it; None when
            the hash is taken by a different prefix (a collision) and nothing was registered.

        Raises:
            ValueError: the page is free or already registered.
        """
        self._check_page(page_id)
        if self._refcount[page_id] == 0:
            raise ValueError(f"register: page {page_id} is free")
        return self._index.add(page_id, page_hash, parent_hash, token_ids, parent_serial)

    def mark_written(self, page_id: int) -> None:
        """The registered page's KV was written by a forward that succeeded.

        Raises:
            ValueError: the page is not registered.
        """
        self._check_page(page_id)
        self._index.mark_written(page_id)

    def unregister(self, page_id: int) -> None:
        """Take a referenced page's entry out of the prefix index (its KV was never written).

        Raises:
            ValueError: the page is free or not registered.
        """
        self._check_page(page_id)
        if self._index.record(page_id) is None or self._refcount[page_id] == 0:
            raise ValueError(f"unregister: page {page_id} is free or not registered")
        self._index.remove(page_id)

    def reset_prefix_cache(self) -> int:
        """Drop every cached prefix when no page is referenced (vLLM's ``reset_prefix_cache``):
        every page becomes empty and free, in page-id order. Returns the entries dropped.

        Raises:
            ValueError: a page is referenced (a sequence holds it); nothing changed.
        """
        held = sum(1 for count in self._refcount if count)
        if held:
            raise ValueError(f"reset_prefix_cache: {held} page(s) are referenced")
        dropped = len(self._index)
        self._index = PrefixIndex(self.num_pages, self.namespace)
        self._queue = FreeQueue(self.num_pages, range(self.num_pages))
        self._num_uncached_free = self.num_pages
        return dropped

    # ---- checks --------------------------------------------------------------------------

    def check_integrity(self, expected_refcounts: Sequence[int] | None = None) -> None:
        """Verify every invariant; raise AssertionError naming the first broken one.

        Checks: the free queue's links, no duplicates, free + used == num_pages, free pages have
        refcount 0 and used ones > 0 (equal to ``expected_refcounts`` when given), the uncached
        free counter, and every index entry points at a page whose stored token ids re-hash
        (with its stored parent hash and this namespace) to exactly that entry's hash.
        """
        self._queue.check_integrity()
        free = set(self._queue)
        used = [p for p in range(self.num_pages) if self._refcount[p] > 0]
        if len(free) + len(used) != self.num_pages or free.intersection(used):
            raise AssertionError(f"free {len(free)} + used {len(used)} != {self.num_pages}")
        if any(self._refcount[p] < 0 for p in range(self.num_pages)):
            raise AssertionError("negative refcount")
        if expected_refcounts is not None and list(expected_refcounts) != self._refcount:
            diff = [
                (p, self._refcount[p], int(e))
                for p, e in enumerate(expected_refcounts)
                if self._refcount[p] != e
            ]
            raise AssertionError(f"refcounts (page, have, expected) differ: {diff[:8]}")
        uncached_free = sum(1 for p in free if self._index.record(p) is None)
        if uncached_free != self._num_uncached_free:
            raise AssertionError(f"uncached free {uncached_free} != {self._num_uncached_free}")
        self._index.check_integrity(free)

    def _check_page(self, page_id: int) -> None:
        if not 0 <= page_id < self.num_pages:
            raise ValueError(f"page_id must be in [0, {self.num_pages}), got {page_id}")
