"""PrefixIndex: the prefix-hash index of the page pool, which pages hold which cached prefix.

A registered page records its token ids and the registration serial of its parent page. A hit
must match both: equal token ids (so a digest collision cannot serve another page's KV) and the
parent serial of the page hit just before (so a page is only served after the exact page whose
KV it was computed against).

Registered is not written: a page is registered when a step reserves its slots (so requests
of the same step can share it: one forward writes every layer's KV before any attention reads
it) and is marked written (:meth:`PrefixIndex.mark_written`) once that forward succeeded; a
failed step's entries are taken back (:meth:`PrefixIndex.remove`) before its pages are
released. Who references a page is the allocator's business
(:class:`pagedattn.cache.allocator.PageAllocator`), which keeps the index's entries of free
pages written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pagedattn.cache.hashing import PageHash, hash_page_tokens


@dataclass(frozen=True)
class CachedPage:
    """What the prefix index knows about one registered page.

    Attributes:
        page_hash: chained hash of the page (16 bytes).
        parent_hash: the previous page's hash, None for a sequence's first page.
        token_ids: the page's exact token ids (page_size ints).
        serial: unique, never reused registration number.
        parent_serial: serial of the registered parent page, None for a first page.
    """

    page_hash: PageHash
    parent_hash: PageHash | None
    token_ids: tuple[int, ...]
    serial: int
    parent_serial: int | None


class PrefixIndex:
    """Page hash -> page id, with each registered page's record and written flag.

    Args:
        num_pages: pages in the pool; page ids are ``0 .. num_pages - 1`` (the caller checks
            them).
        namespace: cache namespace bytes, used to re-hash stored token ids in
            :meth:`check_integrity`.
    """

    def __init__(self, num_pages: int, namespace: bytes) -> None:
        self.namespace = namespace
        self._records: list[CachedPage | None] = [None] * num_pages
        self._written = [False] * num_pages  # registered pages whose KV a forward wrote
        self._pages: dict[PageHash, int] = {}
        self._next_serial = 0

    def __len__(self) -> int:
        """Registered pages."""
        return len(self._pages)

    def hashes(self) -> list[PageHash]:
        """Every registered hash (a copy; safe to call from another thread while the owner
        mutates the index: copying a dict of bytes keys holds the GIL)."""
        return list(self._pages)

    def record(self, page_id: int) -> CachedPage | None:
        """The record of ``page_id``, or None when it holds no cached prefix."""
        return self._records[page_id]

    def is_written(self, page_id: int) -> bool:
        """True when the page is registered and marked written."""
        return self._written[page_id]

    def page_of(self, page_hash: PageHash) -> int:
        """Page id currently registered under ``page_hash``. Raises KeyError when absent."""
        return self._pages[page_hash]

    def lookup(
        self, page_hash: PageHash, token_ids: Sequence[int], parent_serial: int | None
    ) -> CachedPage | None:
        """The record for ``page_hash`` if its stored content is exactly this prefix (same
        token ids, same parent serial), else None (a miss or a collision)."""
        page_id = self._pages.get(page_hash)
        if page_id is None:
            return None
        record = self._records[page_id]
        if record is None:  # pragma: no cover - guarded by check_integrity
            raise AssertionError(f"hash index points at uncached page {page_id}")
        if record.parent_serial != parent_serial or record.token_ids != tuple(token_ids):
            return None
        return record

    def add(
        self,
        page_id: int,
        page_hash: PageHash,
        parent_hash: PageHash | None,
        token_ids: Sequence[int],
        parent_serial: int | None,
    ) -> int | None:
        """Register ``page_id`` (not yet written) under ``page_hash``.

        Returns:
            The serial now serving this exact prefix: a new one, or an existing identical
            entry's (same hash, tokens and parent) when another page already holds it; None when
            the hash is taken by a different prefix (a collision) and nothing was registered.

        Raises:
            ValueError: the page is already registered.
        """
        if self._records[page_id] is not None:
            raise ValueError(f"register: page {page_id} is already registered")
        tokens = tuple(int(t) for t in token_ids)
        existing = self._pages.get(page_hash)
        if existing is not None:
            record = self._records[existing]
            assert record is not None
            same = record.token_ids == tokens and record.parent_serial == parent_serial
            return record.serial if same else None
        serial = self._next_serial
        self._next_serial += 1
        self._records[page_id] = CachedPage(page_hash, parent_hash, tokens, serial, parent_serial)
        self._pages[page_hash] = page_id
        self._written[page_id] = False
        return serial

    def mark_written(self, page_id: int) -> None:
        """The registered page's KV was written by a forward that succeeded.

        Raises:
            ValueError: the page is not registered.
        """
        if self._records[page_id] is None:
            raise ValueError(f"mark_written: page {page_id} is not registered")
        self._written[page_id] = True

    def remove(self, page_id: int) -> None:
        """Take the registered ``page_id`` out of the index (the caller checked it is)."""
        record = self._records[page_id]
        assert record is not None
        del self._pages[record.page_hash]
        self._records[page_id] = None
        self._written[page_id] = False

    def check_integrity(self, free: set[int]) -> None:
        """Verify the index; raise AssertionError naming the first broken invariant.

        Checks: the hash index and the page records agree, no ``free`` page in the index is
        unwritten, no unregistered page is marked written, and every entry's stored token ids
        re-hash (with its stored parent hash and this namespace) to exactly that entry's hash.
        """
        num_pages = len(self._records)
        registered = [p for p in range(num_pages) if self._records[p] is not None]
        if sorted(self._pages.values()) != registered:
            raise AssertionError("hash index and page records disagree")
        unwritten_free = [p for p in free if self._records[p] is not None and not self._written[p]]
        if unwritten_free:
            raise AssertionError(
                f"free pages in the prefix index were never written: {unwritten_free[:8]}"
            )
        if any(self._written[p] and self._records[p] is None for p in range(num_pages)):
            raise AssertionError("a page is marked written but not registered")
        for page_hash, page_id in self._pages.items():
            record = self._records[page_id]
            assert record is not None
            rehashed = hash_page_tokens(
                record.parent_hash, np.asarray(record.token_ids, np.int64), self.namespace
            )
            if record.page_hash != page_hash or rehashed != page_hash:
                raise AssertionError(f"page {page_id}: stored token ids do not hash to its entry")
