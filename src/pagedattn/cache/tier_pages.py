"""What the cache manager exchanges with the persistent tier: which computed pages to write,
and restoring a run of stored pages into fresh pool pages (registered in the prefix index).

The tier is a cache below the pool: a tier that raises costs a miss or a lost copy, never a
request. :func:`restore_or_miss` and :func:`write_computed` absorb its errors, count them by
kind ("lookup", "write") and log them.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from pagedattn.cache.allocator import PageAllocator
from pagedattn.cache.hashing import PageHash, PageKey
from pagedattn.cache.sequence_pages import SequencePages

logger = logging.getLogger("pagedattn.cache")


def page_key(hashes: Sequence[PageHash], tokens: np.ndarray, i: int, page_size: int) -> PageKey:
    """The tier key of full page ``i``: its hash, its parent's and its exact token ids."""
    parent = hashes[i - 1] if i else None
    return PageKey(hashes[i], parent, tuple(tokens[i * page_size : (i + 1) * page_size].tolist()))


class PageTier(Protocol):
    """The persistent tier as the cache manager uses it (:class:`pagedattn.storage.KVTier`)."""

    def lookup(self, keys: Sequence[PageKey]) -> list[np.ndarray]:
        """KV of the longest stored, valid prefix of ``keys``."""
        ...

    def load(self, page_id: int, kv: np.ndarray) -> None:
        """Copy a restored page into pool page ``page_id``."""
        ...

    def write(self, page_ids: Sequence[int], keys: Sequence[PageKey]) -> None:
        """Queue pool pages for the store."""
        ...


def computed_pages(
    seq: SequencePages, start: int, end: int, page_size: int
) -> tuple[list[int], list[PageKey]]:
    """Page ids and keys of the full pages that writing tokens ``[start, end)`` completed.

    Left out: pages of a sequence that lost a visible page (lossy eviction: its later KV is not
    what the hash names), pages dropped by the window, and pages whose prefix chain is not
    registered (a hash collision).
    """
    if seq.lossy:
        return [], []
    ps, page_ids, keys = page_size, [], []
    for i in range(start // ps, min(end // ps, len(seq.page_hashes))):
        if seq.page_table[i] == -1 or seq.serials[i] is None:
            continue
        page_ids.append(seq.page_table[i])
        parent = seq.page_hashes[i - 1] if i else None
        keys.append(
            PageKey(seq.page_hashes[i], parent, tuple(seq.token_ids[i * ps : (i + 1) * ps]))
        )
    return page_ids, keys


def restore_pages(
    tier: PageTier,
    allocator: PageAllocator,
    seq: SequencePages,
    tokens: np.ndarray,
    hashes: list[PageHash],
    parent_serial: int | None,
    page_size: int,
    *,
    max_pages: int,
    reclaim: bool,
) -> int:
    """Restore the pages after ``seq``'s in-memory hits: the longest run of ``hashes`` the tier
    holds (at most ``max_pages``), each into a freshly allocated page, registered in the prefix
    index (and marked written: its KV is in the pool before it is registered) and appended to
    ``seq``'s table.

    Args:
        tier: the tier; allocator: the pool's allocator.
        seq: the sequence being admitted (its table holds the in-memory hits so far).
        tokens: (prompt_len,) int64 prompt ids; hashes: the chained hashes of its full pages
            that may be reused; parent_serial: serial of the last in-memory hit (None if none).
        page_size: tokens per page; max_pages: pages that may be allocated;
        reclaim: allocation may reuse cached free pages.

    Returns:
        Tokens restored (a multiple of page_size).

    Raises:
        Whatever the tier's lookup or load raises. ``seq`` then holds the pages restored
        before the error (each complete, registered and written) and no page was leaked.
    """
    ps, first = page_size, len(seq.page_table)
    keys = [
        page_key(hashes, tokens, i, ps) for i in range(first, min(len(hashes), first + max_pages))
    ]
    restored = 0
    for key, kv in zip(keys, tier.lookup(keys), strict=False):
        page_id = allocator.allocate(reclaim_cached=reclaim)
        try:
            tier.load(page_id, kv)
        except BaseException:
            allocator.free(page_id)  # the pages restored before it stay in ``seq``, valid
            raise
        serial = allocator.register(
            page_id, key.page_hash, key.parent_hash, key.token_ids, parent_serial
        )
        if serial is None:  # the hash is taken by another prefix: stop here
            allocator.free(page_id)
            break
        allocator.mark_written(page_id)  # its bytes are in the pool already
        seq.page_table.append(page_id)
        seq.page_hashes.append(key.page_hash)
        seq.serials.append(serial)
        parent_serial = serial
        restored += ps
    return restored


def restore_or_miss(
    tier: PageTier,
    allocator: PageAllocator,
    seq: SequencePages,
    tokens: np.ndarray,
    hashes: list[PageHash],
    parent_serial: int | None,
    page_size: int,
    errors: Counter[str],
    *,
    max_pages: int,
    reclaim: bool,
) -> int:
    """:func:`restore_pages`, where a tier that raises is a miss for the pages not restored
    yet (counted in ``errors["lookup"]``).

    Returns:
        Tokens restored (a multiple of page_size), those restored before an error included.
    """
    before = len(seq.page_table)
    try:
        restore_pages(
            tier, allocator, seq, tokens, hashes, parent_serial, page_size,
            max_pages=max_pages, reclaim=reclaim,
        )  # fmt: skip
    except Exception:
        errors["lookup"] += 1
        logger.warning("kv_store lookup failed: a prefix-cache miss", exc_info=True)
    return (len(seq.page_table) - before) * page_size


def write_computed(
    tier: PageTier,
    seq: SequencePages,
    start: int,
    end: int,
    page_size: int,
    errors: Counter[str],
) -> int:
    """Queue the full pages that writing tokens ``[start, end)`` completed
    (:func:`computed_pages`) for the tier. A tier that raises loses those pages' copy
    (counted in ``errors["write"]``); the pages stay in the pool.

    Returns:
        The number of pages queued.
    """
    page_ids, keys = computed_pages(seq, start, end, page_size)
    if not page_ids:
        return 0
    try:
        tier.write(page_ids, keys)
    except Exception:  # the pages stay in the pool: only the tier's copy is lost
        errors["write"] += len(page_ids)
        logger.warning("kv_store write failed: %d page(s) not stored", len(page_ids),
                       exc_info=True)  # fmt: skip
        return 0
    return len(page_ids)
