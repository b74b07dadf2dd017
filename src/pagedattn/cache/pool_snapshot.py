"""A plain-data picture of the page pool: each page's state and some sequences' page tables.

Read by whoever owns the cache (it is not thread-safe: the engine thread takes it between
steps). It holds ids and counts only, never token ids or KV.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from pagedattn.cache.sequence_tables import SequenceTables

#: Page state codes of :attr:`PoolSnapshot.page_states`, by code.
PAGE_STATES = ("free", "cached", "used", "shared")
FREE, CACHED, USED, SHARED = range(4)


@dataclass(frozen=True)
class TableSnapshot:
    """One sequence's page table.

    Attributes:
        seq_id: the sequence.
        num_tokens: KV tokens reserved for it.
        num_written_tokens: of those, tokens whose KV was written (or prefix-cached).
        num_pages: entries in its page table (dropped ones included).
        pages: the first ``max_table`` entries, page ids in position order; -1 = dropped.
    """

    seq_id: Hashable
    num_tokens: int
    num_written_tokens: int
    num_pages: int
    pages: tuple[int, ...]


@dataclass(frozen=True)
class PoolSnapshot:
    """The pool at one moment.

    Attributes:
        num_pages: pages in the pool.
        page_size: tokens per page.
        page_states: one code per page (:data:`PAGE_STATES`): free (no reference, no cached
            prefix), cached (no reference, holds a cached prefix: in the LRU, reusable until
            reclaimed), used (one page-table entry), shared (several).
        num_registered: pages in the prefix index, referenced or not.
        tables: the page tables asked for, in the order asked.
    """

    num_pages: int
    page_size: int
    page_states: bytes
    num_registered: int
    tables: tuple[TableSnapshot, ...]


def pool_snapshot(
    cache: SequenceTables, seq_ids: Sequence[Hashable], max_table: int = 1024
) -> PoolSnapshot:
    """Snapshot ``cache``'s pool and the page tables of ``seq_ids`` (unknown ids are skipped).

    Args:
        cache: the cache manager (or its read side).
        seq_ids: sequences whose tables to copy.
        max_table: most entries copied per table (>= 0); ``num_pages`` tells the full length.

    Raises:
        ValueError: a negative ``max_table``.
    """
    if max_table < 0:
        raise ValueError(f"max_table must be >= 0, got {max_table}")
    allocator = cache.allocator
    states = bytearray(allocator.num_pages)
    for page_id in range(allocator.num_pages):
        refs = allocator.refcount(page_id)
        if refs == 0:
            states[page_id] = FREE if allocator.cached_page(page_id) is None else CACHED
        else:
            states[page_id] = USED if refs == 1 else SHARED
    tables = []
    for seq_id in seq_ids:
        if seq_id not in cache:
            continue
        table = cache.page_table(seq_id)
        tables.append(
            TableSnapshot(
                seq_id,
                cache.num_tokens(seq_id),
                cache.num_written_tokens(seq_id),
                len(table),
                tuple(table[:max_table]),
            )
        )
    return PoolSnapshot(
        allocator.num_pages,
        cache.page_size,
        bytes(states),
        allocator.num_cached_pages,
        tuple(tables),
    )
