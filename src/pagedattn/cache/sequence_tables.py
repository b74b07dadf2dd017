"""SequenceTables: the page tables of many sequences as the kernels and the checks read them
(token counts, padded page tables) and the invariants that tie them to the allocator.

The read side of :class:`pagedattn.cache.manager.CacheManager`, which changes the tables.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

import numpy as np

from pagedattn.cache.allocator import PageAllocator
from pagedattn.cache.sequence_pages import SequencePages, pad_page_tables


class SequenceTables:
    """Page tables by sequence id, least recently accessed first.

    Args:
        allocator: the pool's allocator (reference counts, prefix index).
        page_size: tokens per page.
        enable_prefix_caching: full pages are hashed (their hash chain is checked).
    """

    def __init__(
        self, allocator: PageAllocator, page_size: int, enable_prefix_caching: bool
    ) -> None:
        self.allocator = allocator
        self.page_size = page_size
        self.enable_prefix_caching = enable_prefix_caching
        self._seqs: OrderedDict[Hashable, SequencePages] = OrderedDict()  # LRU first

    @property
    def num_pages(self) -> int:
        return self.allocator.num_pages

    def __contains__(self, seq_id: object) -> bool:
        return seq_id in self._seqs

    def num_tokens(self, seq_id: Hashable) -> int:
        """KV tokens reserved (or prefix-cached) for the sequence; its next position."""
        return self._get(seq_id).num_tokens

    def num_written_tokens(self, seq_id: Hashable) -> int:
        """KV tokens committed as written (see ``CacheManager.commit_written``) or
        prefix-cached."""
        return self._get(seq_id).num_written_tokens

    def page_table(self, seq_id: Hashable) -> list[int]:
        """Copy of the sequence's page ids in position order; -1 where a page was dropped."""
        return list(self._get(seq_id).page_table)

    def page_tables(self, seq_ids: Sequence[Hashable], max_pages: int | None = None) -> np.ndarray:
        """Padded page tables for the kernels.

        Args:
            seq_ids: the batch's sequences, in batch order.
            max_pages: width; default the longest table (at least 1).

        Returns:
            int32 ``(len(seq_ids), max_pages)``, -1 past a table's end and where pages were dropped.

        Raises:
            KeyError: unknown seq_id. ValueError: ``max_pages`` shorter than a table.
        """
        return pad_page_tables([self._get(s).page_table for s in seq_ids], max_pages)

    def check_integrity(self, *, between_steps: bool = True) -> None:
        """Allocator invariants plus: every refcount equals the page-table entries naming the
        page, each table has ceil(num_tokens / page_size) entries with a resident last page,
        and registered is told from written: a registered page not yet written is only a page
        reserved by a step in progress (none at all ``between_steps``; a free one never).

        Raises:
            AssertionError: naming the first broken invariant.
        """
        expected = [0] * self.num_pages
        for seq_id, seq in self._seqs.items():
            seq.check(self.page_size, self.enable_prefix_caching, str(seq_id))
            for index, page_id in enumerate(seq.page_table):
                if page_id == -1:
                    continue
                expected[page_id] += 1
                registered = self.allocator.cached_page(page_id) is not None
                if between_steps and registered and not self.allocator.is_written(page_id):
                    raise AssertionError(
                        f"{seq_id}: page {page_id} (index {index}) is in the prefix index but "
                        f"its KV was never committed as written "
                        f"({seq.num_written_tokens} tokens written)"
                    )
        self.allocator.check_integrity(expected)

    def _get(self, seq_id: Hashable) -> SequencePages:
        try:
            return self._seqs[seq_id]
        except KeyError:
            raise KeyError(f"unknown sequence {seq_id!r}") from None
