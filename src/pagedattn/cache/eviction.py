"""Eviction: pages that leave a sequence's page table while it runs.

Sliding window W with S sink tokens (StreamingLLM, arXiv 2309.17453): a query at position p sees
keys j with p - W < j <= p, plus j < S. A full page with no such key for the first query being
written, and holding no sink token, goes back to the pool at once; its page-table entry becomes -1
("no page: those keys are not visible").

Lossy eviction drops a page whose keys are still visible (its entry becomes -1 too): the
``"evict_idle"`` policy does it to another sequence when no free page is left, and
:meth:`PageEviction.evict_oldest_page` does it on request (the single-stream ``KVStream``).
A sequence that lost a visible page registers no later page (their KV was computed without the
dropped keys). Reusing the least recently used cached free page ("lru") is the allocator's.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Literal

from pagedattn.cache.allocator import OutOfPagesError, PageAllocator
from pagedattn.cache.sequence_pages import SequencePages

EvictionPolicy = Literal["reclaim", "evict_idle", "raise"]
EVICTION_POLICIES: tuple[EvictionPolicy, ...] = ("reclaim", "evict_idle", "raise")
#: Eviction counter names: "lru" a cached free page reused (its prefix entry dropped),
#: "sliding_window" a page-table entry that left the window, "lossy" a live page dropped
#: although still visible (the "evict_idle" policy, or :meth:`CacheManager.evict_oldest_page`).
EVICTION_REASONS = ("lru", "sliding_window", "lossy")


class PageEviction:
    """Window trimming and lossy eviction over one allocator (see the module doc).

    Args:
        allocator: the pool's allocator (dropped pages are released to it).
        page_size: tokens per page.
        sliding_window: W, or None for full attention (nothing is trimmed).
        num_sink_pages: pages holding the S sink tokens, never dropped.
        policy: what to do when no free page is left (see ``CacheManager``).

    Attributes:
        num_window_evictions: page-table entries that left the window.
        num_lossy_evictions: pages dropped although still visible.
    """

    def __init__(
        self,
        allocator: PageAllocator,
        page_size: int,
        sliding_window: int | None,
        num_sink_pages: int,
        policy: EvictionPolicy,
    ) -> None:
        self.allocator = allocator
        self.page_size = page_size
        self.sliding_window = sliding_window
        self.num_sink_pages = num_sink_pages
        self.policy: EvictionPolicy = policy
        self.num_window_evictions = 0
        self.num_lossy_evictions = 0

    @property
    def reclaim(self) -> bool:
        """Allocation may reuse unreferenced cached pages (every policy but "raise")."""
        return self.policy != "raise"

    @property
    def num_free_pages(self) -> int:
        """Pages allocatable now without lossy eviction."""
        return self.allocator.num_allocatable(reclaim_cached=self.reclaim)

    def counts(self) -> dict[str, int]:
        """Eviction counts by reason (:data:`EVICTION_REASONS`); plain monotonic ints."""
        return {
            "lru": self.allocator.num_lru_evictions,
            "sliding_window": self.num_window_evictions,
            "lossy": self.num_lossy_evictions,
        }

    def trim_indices(self, seq: SequencePages, query_pos: int) -> range:
        """Table indices of the pages a query at ``query_pos`` no longer sees."""
        return seq.window_trim_range(
            query_pos, self.sliding_window, self.num_sink_pages, self.page_size
        )

    def num_trim_freed(self, seq: SequencePages) -> int:
        """Pages that trimming for the sequence's next token gives back to the allocatable
        ones (resident, referenced only here, and not a cached page kept under "raise")."""
        return sum(
            1
            for i in self.trim_indices(seq, seq.num_tokens)
            if seq.page_table[i] != -1
            and self.allocator.refcount(seq.page_table[i]) == 1
            and (self.reclaim or self.allocator.cached_page(seq.page_table[i]) is None)
        )

    def trim(self, seq: SequencePages, query_pos: int) -> int:
        """Drop the pages outside the window of a query at ``query_pos``; returns how many."""
        indices = self.trim_indices(seq, query_pos)
        dropped = seq.drop_pages(indices, self.allocator)
        seq.trimmed_upto = max(seq.trimmed_upto, indices.stop)
        self.num_window_evictions += dropped
        return dropped

    def make_room(
        self, need: int, seqs: Mapping[Hashable, SequencePages], writer: Hashable
    ) -> None:
        """Ensure ``need`` pages are allocatable; under "evict_idle" by dropping pages of the
        sequences other than ``writer``, least recently accessed first (``seqs`` is in that
        order).

        Raises:
            OutOfPagesError: not enough pages under the policy.
        """
        while self.num_free_pages < need:
            if self.policy != "evict_idle" or not self._evict_idle_page(seqs, writer):
                raise OutOfPagesError(
                    f"need {need} pages, {self.num_free_pages} free (policy {self.policy!r})"
                )

    def evict_oldest_page(self, seq: SequencePages, seq_id: Hashable) -> int:
        """Lossy: drop the sequence's oldest resident full non-sink page.

        Raises:
            OutOfPagesError: no such page.
        """
        index = seq.oldest_evictable(self.num_sink_pages, self.page_size, self.allocator, False)
        if index is None:
            raise OutOfPagesError(f"sequence {seq_id!r} has no evictable page")
        return self._drop_lossy(seq, index)

    def _evict_idle_page(self, seqs: Mapping[Hashable, SequencePages], writer: Hashable) -> bool:
        for seq_id, seq in seqs.items():  # least recently accessed first
            if seq_id == writer:
                continue
            index = seq.oldest_evictable(self.num_sink_pages, self.page_size, self.allocator, True)
            if index is not None:
                self._drop_lossy(seq, index)
                return True
        return False

    def _drop_lossy(self, seq: SequencePages, index: int) -> int:
        page_id = seq.page_table[index]
        seq.drop_pages(range(index, index + 1), self.allocator)
        seq.lossy = True
        self.num_lossy_evictions += 1
        return page_id
