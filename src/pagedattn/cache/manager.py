"""CacheManager: per-sequence page tables, slot mapping, prefix sharing, window/sink trimming.

The engine-facing half of the paged KV cache (vLLM v1 ``KVCacheManager``, Kwon et al.,
"Efficient Memory Management for LLM Serving with PagedAttention", SOSP 2023). It never touches
KV data: it returns slot mappings and page tables for the kernels.

Reserved is not written (:mod:`.reservations`): a page registered by ``append_slots`` is
marked written by ``commit_written`` once the forward that wrote it succeeded. Pages leave
a table through the window or lossy eviction (:mod:`.eviction`); the persistent tier restores
misses (:mod:`.prefix_hits`) and receives computed pages (:mod:`.tier_pages`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence

import numpy as np

from pagedattn.cache import reservations
from pagedattn.cache.allocator import PageAllocator
from pagedattn.cache.eviction import (
    EVICTION_POLICIES,
    EVICTION_REASONS,
    EvictionPolicy,
    PageEviction,
)
from pagedattn.cache.prefix_hits import take_prefix_hits
from pagedattn.cache.sequence_pages import SequencePages, validate_token_ids
from pagedattn.cache.sequence_tables import SequenceTables
from pagedattn.cache.tier_fetch import FetchedPages
from pagedattn.cache.tier_pages import PageTier, write_computed

__all__ = ["EVICTION_POLICIES", "EVICTION_REASONS", "CacheManager", "EvictionPolicy"]


class CacheManager(SequenceTables):
    """Page tables of many sequences over one pool of ``num_pages`` pages.

    Args:
        num_pages: pages in the pool (> 0).
        page_size: tokens per page (> 0).
        namespace: cache namespace bytes (:func:`pagedattn.cache.hashing.cache_namespace`).
        sliding_window: W (>= 1) or None for full attention.
        num_sink_tokens: S >= 0, first tokens kept resident and visible whatever the window.
        policy: what to do when no free page is left: ``"reclaim"`` (default) reuse the least
            recently used unreferenced cached page, then raise :class:`OutOfPagesError`;
            ``"evict_idle"`` additionally drop the oldest exclusively owned non-sink page of the
            least recently accessed other sequence (lossy: its entry becomes -1);
            ``"raise"`` never reuse cached pages.
        enable_prefix_caching: hash full pages and share them between sequences.
        tier: the persistent tier below the pool (:class:`pagedattn.storage.tier.KVTier`), or
            None. On a prefix-cache miss :meth:`add_sequence` restores the longest run of the
            following pages from it; :meth:`pages_computed` writes newly computed full pages
            to it. Needs prefix caching (pages are named by their prefix hash).

    Raises:
        ValueError: a bad size, window, sink count or policy; a tier without prefix caching.
    """

    def __init__(
        self,
        num_pages: int,
        page_size: int,
        namespace: bytes,
        *,
        sliding_window: int | None = None,
        num_sink_tokens: int = 0,
        policy: EvictionPolicy = "reclaim",
        enable_prefix_caching: bool = True,
        tier: PageTier | None = None,
    ) -> None:
        if not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"page_size must be a positive int, got {page_size!r}")
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window must be None or >= 1, got {sliding_window}")
        if num_sink_tokens < 0:
            raise ValueError(f"num_sink_tokens must be >= 0, got {num_sink_tokens}")
        if policy not in EVICTION_POLICIES:
            raise ValueError(f"policy must be one of {EVICTION_POLICIES}, got {policy!r}")
        if tier is not None and not enable_prefix_caching:
            raise ValueError("kv_store: needs prefix caching (pages are named by prefix hash)")
        super().__init__(PageAllocator(num_pages, namespace), page_size, enable_prefix_caching)
        self.tier = tier
        self.tier_restored_tokens = 0
        #: tier failures absorbed: "lookup" lookups that raised (a miss), "write" pages
        #: whose write-through raised (not stored)
        self.tier_errors: Counter[str] = Counter()
        self.namespace = namespace
        self.sliding_window = sliding_window
        self.num_sink_tokens = num_sink_tokens
        self.num_sink_pages = -(-num_sink_tokens // page_size)
        self.eviction = PageEviction(
            self.allocator, page_size, sliding_window, self.num_sink_pages, policy
        )
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0

    @property
    def policy(self) -> EvictionPolicy:
        """What happens when no free page is left (see the class doc)."""
        return self.eviction.policy

    @property
    def num_free_pages(self) -> int:
        """Pages allocatable now without lossy eviction (cached ones unless policy "raise")."""
        return self.eviction.num_free_pages

    @property
    def evictions(self) -> dict[str, int]:
        """Eviction counts by reason (see :data:`EVICTION_REASONS`); plain monotonic ints."""
        return self.eviction.counts()

    def group_page_tables(
        self, seq_ids: Sequence[Hashable], max_pages: int | None = None
    ) -> tuple[np.ndarray, ...]:
        """Per layer group, the padded page tables of ``seq_ids`` (one group here: every layer
        shares the tables; see :meth:`page_tables`)."""
        return (self.page_tables(seq_ids, max_pages),)

    def can_append(self, seq_id: Hashable, num_new_tokens: int = 1) -> bool:
        """True when :meth:`append_slots` of that many tokens needs no lossy eviction."""
        seq = self._get(seq_id)
        need = seq.pages_needed(num_new_tokens, self.page_size)
        return need <= self.num_free_pages + self.eviction.num_trim_freed(seq)

    def can_draft(self, seq_id: Hashable, num_new_tokens: int) -> bool:
        """True when appending that many drafted tokens needs only empty pages (drafts never
        reclaim a cached page nor trim)."""
        seq = self._get(seq_id)
        need = seq.pages_needed(num_new_tokens, self.page_size)
        return need <= self.allocator.num_allocatable(reclaim_cached=False)

    # ---- lifecycle -----------------------------------------------------------------------

    def add_sequence(
        self, seq_id: Hashable, prompt_token_ids: Sequence[int] | np.ndarray = (), *,
        fetched: FetchedPages | None = None,
    ) -> int:  # fmt: skip
        """Register a sequence and reuse the cached full pages of its prompt's prefix.

        Only full pages hit, each verified by exact token ids and parent; when the whole
        prompt would hit, the last page is left out so at least one token is computed (the
        model needs its logits). Write the rest with ``append_slots(seq_id, prompt[cached:])``.
        With a tier, a miss restores the following pages from it; a tier that raises is a
        miss for the pages it did not restore (counted in ``tier_errors["lookup"]``).

        Args:
            seq_id: any hashable id not in use.
            prompt_token_ids: (prompt_len,) integer token ids (may be empty).
            fetched: records read from the tier beforehand (:mod:`.tier_fetch`): the restore
                reads them instead of the store (no I/O; :data:`~.tier_fetch.NO_PAGES`:
                nothing is restored). None: the tier is read now.

        Returns:
            num_cached_tokens, a multiple of page_size, < prompt_len (0 for an empty prompt).

        Raises:
            ValueError: seq_id in use, or token ids not 1-D integers.
        """
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id!r} already exists")
        tokens = validate_token_ids(prompt_token_ids)
        seq = SequencePages()
        if self.enable_prefix_caching and len(tokens):
            tier = self.tier if fetched is None else fetched.tier(0, self.tier)
            self.tier_restored_tokens += take_prefix_hits(
                seq, tokens, self.allocator, self.page_size, self.namespace, tier,
                self.tier_errors, reclaim=self.eviction.reclaim,
            )  # fmt: skip
            self.prefix_query_tokens += len(tokens)
            self.prefix_hit_tokens += seq.num_tokens
        self._seqs[seq_id] = seq
        return seq.num_tokens

    def append_slots(
        self, seq_id: Hashable, token_ids: Sequence[int] | np.ndarray, *, trim: bool = True
    ) -> np.ndarray:
        """Reserve KV slots for new tokens; a page is allocated when its first token arrives.

        First drops pages outside the window of the first new token (:mod:`.eviction`), then
        allocates, then registers pages that became full in the prefix index (not yet written:
        call :meth:`commit_written` once the forward that writes these slots succeeded).

        Args:
            seq_id: an existing sequence.
            token_ids: (num_new_tokens,) integer ids of the tokens being written.
            trim: False when the step already reserved earlier tokens of this sequence whose
                queries still see those pages (drafts appended after the step token).

        Returns:
            slot_mapping, int64 ``(num_new_tokens,)``: ``page_id * page_size + offset``.

        Raises:
            KeyError: unknown seq_id. ValueError: bad token ids.
            OutOfPagesError: not enough pages under the policy (the sequence is unchanged
                apart from window trimming, which would happen anyway).
        """
        seq = self._get(seq_id)
        tokens = validate_token_ids(token_ids)
        ps, n0, k = self.page_size, seq.num_tokens, len(tokens)
        if trim:
            self.eviction.trim(seq, n0)
        need = seq.pages_needed(k, ps)
        self.eviction.make_room(need, self._seqs, writer=seq_id)
        for _ in range(need):
            seq.page_table.append(self.allocator.allocate(reclaim_cached=self.eviction.reclaim))
        positions = np.arange(n0, n0 + k, dtype=np.int64)
        table = np.asarray(seq.page_table, np.int64)
        slots: np.ndarray = table[positions // ps] * ps + positions % ps
        seq.num_tokens += k
        if self.enable_prefix_caching:
            seq.token_ids.extend(int(t) for t in tokens)
            for i in range(n0 // ps, seq.num_tokens // ps):
                seq.register_page(i, self.allocator, ps, self.namespace)
        self._seqs.move_to_end(seq_id)
        return slots

    def pages_computed(self, seq_id: Hashable, start: int, end: int) -> int:
        """The forward that wrote the sequence's tokens ``[start, end)`` succeeded: hand the
        full pages it completed to the tier (write-through; a no-op without a tier). See
        :func:`pagedattn.cache.tier_pages.computed_pages`.

        A tier that raises loses those pages' copy (counted in ``tier_errors["write"]``);
        the step and the pool are unaffected.

        Returns:
            The number of pages queued.

        Raises:
            KeyError: unknown seq_id.
        """
        if self.tier is None:
            return 0
        return write_computed(
            self.tier, self._get(seq_id), start, end, self.page_size, self.tier_errors
        )

    def commit_written(self, seq_id: Hashable, num_tokens: int | None = None) -> list[int]:
        """The commit point: the KV of the sequence's reserved slots up to ``num_tokens`` was
        written by a forward that succeeded; the pages this sequence registered that are now
        full of written tokens are marked written (and survive the sequence being freed).

        This is the one place a page's KV is known to be real; the scheduler hands the same
        pages to the persistent tier right after (:meth:`pages_computed`).

        Args:
            seq_id: an existing sequence.
            num_tokens: tokens now written, ``num_written_tokens <= num_tokens <= num_tokens
                reserved``; None = every reserved token.

        Returns:
            The page ids this sequence registered that became written, in position order
            (empty without prefix caching; a page whose prefix another page already serves,
            or that window trimming dropped, is not listed).

        Raises:
            KeyError: unknown seq_id. ValueError: ``num_tokens`` outside that range.
        """
        seq = self._get(seq_id)
        upto = seq.num_tokens if num_tokens is None else num_tokens
        return reservations.commit_written(seq, upto, self.allocator, self.page_size)

    def unreserve(self, seq_id: Hashable, num_tokens: int) -> None:
        """Take back the slots reserved past ``num_tokens`` (a step that was scheduled but
        never run): pages the sequence registered past it leave the prefix index, pages past
        its new last page go back to the pool. Window trimming is not undone (the next
        reservation at that position would trim the same pages).

        Raises:
            KeyError: unknown seq_id. ValueError: ``num_tokens`` below the written tokens or
                above the reserved ones.
        """
        reservations.unreserve(
            self._get(seq_id), num_tokens, self.allocator, self.page_size,
            self.enable_prefix_caching,
        )  # fmt: skip

    def free_sequence(self, seq_id: Hashable) -> None:
        """Release each of the sequence's pages once (last page first, so a prefix's tail is
        evicted before its head) and forget the sequence.

        Raises:
            KeyError: unknown seq_id.
        """
        seq = self._get(seq_id)
        reservations.unregister_unwritten(seq, self.allocator, self.page_size)
        for page_id in reversed(seq.page_table):
            if page_id != -1:
                self.allocator.release(page_id)
        del self._seqs[seq_id]

    def reset_prefix_cache(self) -> int:
        """Drop every cached prefix of the pool (the persistent tier keeps its pages); returns
        the entries dropped.

        Raises:
            ValueError: a sequence still holds pages; nothing changed.
        """
        if self._seqs:
            raise ValueError(f"reset_prefix_cache: {len(self._seqs)} sequence(s) hold pages")
        return self.allocator.reset_prefix_cache()

    def evict_oldest_page(self, seq_id: Hashable) -> int:
        """Lossy: drop the sequence's oldest resident full non-sink page (entry becomes -1).

        The sequence's later pages are no longer registered in the prefix index (their KV was
        computed without the dropped keys).

        Returns:
            The page id dropped.

        Raises:
            KeyError: unknown seq_id. OutOfPagesError: no such page.
        """
        return self.eviction.evict_oldest_page(self._get(seq_id), seq_id)
