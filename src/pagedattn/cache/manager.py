"""CacheManager: per-sequence page tables, slot mapping, prefix sharing, window/sink trimming.

The engine-facing half of the paged KV cache (vLLM v1 ``KVCacheManager``, Kwon et al.,
"Efficient Memory Management for LLM Serving with PagedAttention", SOSP 2023). It never touches
KV data: it returns slot mappings and page tables for the kernels, and fork returns the page
copies the caller applies at once with :meth:`PagePool.copy_pages`.

Reserved is not written: :meth:`CacheManager.append_slots` hands out slots and registers the
pages that became full so that requests admitted in the same step can share them (the forward
writes every layer's KV before any attention reads it). :meth:`CacheManager.commit_written`,
which the caller invokes once the forward that wrote those slots succeeded, marks them written.
A sequence freed with registered pages that were never committed (its step failed) takes
those entries back out of the index first (:meth:`CacheManager.free_sequence`): a later
request can never be served KV that was not computed.

Sliding window W with S sink tokens (StreamingLLM, arXiv 2309.17453): a query at position p sees
keys j with p - W < j <= p, plus j < S. A full page with no such key for the first query being
written, and holding no sink token, goes back to the pool at once; its page-table entry becomes -1
("no page: those keys are not visible").
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from collections.abc import Hashable, Sequence
from typing import Literal

import numpy as np

from pagedattn.cache.allocator import OutOfPagesError, PageAllocator
from pagedattn.cache.hashing import PageHash, prefix_page_hashes
from pagedattn.cache.sequence_pages import SequencePages, pad_page_tables, validate_token_ids
from pagedattn.cache.tier_pages import PageTier, computed_pages, restore_pages

logger = logging.getLogger("pagedattn.cache")

EvictionPolicy = Literal["reclaim", "evict_idle", "raise"]
EVICTION_POLICIES: tuple[EvictionPolicy, ...] = ("reclaim", "evict_idle", "raise")
#: Eviction counter names: "lru" a cached free page reused (its prefix entry dropped),
#: "sliding_window" a page-table entry that left the window, "lossy" a live page dropped
#: although still visible (the "evict_idle" policy, or :meth:`CacheManager.evict_oldest_page`).
EVICTION_REASONS = ("lru", "sliding_window", "lossy")


class CacheManager:
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
        self.allocator = PageAllocator(num_pages, namespace)
        self.tier = tier
        self.tier_restored_tokens = 0
        #: tier failures absorbed: "lookup" lookups that raised (a miss), "write" pages
        #: whose write-through raised (not stored)
        self.tier_errors: Counter[str] = Counter()
        self.page_size = page_size
        self.namespace = namespace
        self.sliding_window = sliding_window
        self.num_sink_tokens = num_sink_tokens
        self.policy: EvictionPolicy = policy
        self.enable_prefix_caching = enable_prefix_caching
        self.num_sink_pages = -(-num_sink_tokens // page_size)
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0
        self._window_evictions = 0
        self._lossy_evictions = 0
        self._seqs: OrderedDict[Hashable, SequencePages] = OrderedDict()  # LRU first

    # ---- queries -------------------------------------------------------------------------

    @property
    def num_pages(self) -> int:
        return self.allocator.num_pages

    @property
    def num_free_pages(self) -> int:
        """Pages allocatable now without lossy eviction (cached ones unless policy "raise")."""
        return self.allocator.num_allocatable(reclaim_cached=self._reclaim)

    @property
    def evictions(self) -> dict[str, int]:
        """Eviction counts by reason (see :data:`EVICTION_REASONS`); plain monotonic ints."""
        return {
            "lru": self.allocator.num_lru_evictions,
            "sliding_window": self._window_evictions,
            "lossy": self._lossy_evictions,
        }

    def __contains__(self, seq_id: object) -> bool:
        return seq_id in self._seqs

    def num_tokens(self, seq_id: Hashable) -> int:
        """KV tokens reserved (or prefix-cached) for the sequence; its next position."""
        return self._get(seq_id).num_tokens

    def num_written_tokens(self, seq_id: Hashable) -> int:
        """KV tokens committed as written (see :meth:`commit_written`) or prefix-cached."""
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

    def can_append(self, seq_id: Hashable, num_new_tokens: int = 1) -> bool:
        """True when :meth:`append_slots` of that many tokens needs no lossy eviction."""
        seq = self._get(seq_id)
        need = seq.pages_needed(num_new_tokens, self.page_size)
        freed = sum(
            1
            for i in self._trim_indices(seq, seq.num_tokens)
            if seq.page_table[i] != -1
            and self.allocator.refcount(seq.page_table[i]) == 1
            and (self._reclaim or self.allocator.cached_page(seq.page_table[i]) is None)
        )
        return need <= self.num_free_pages + freed

    # ---- lifecycle -----------------------------------------------------------------------

    def add_sequence(
        self, seq_id: Hashable, prompt_token_ids: Sequence[int] | np.ndarray = ()
    ) -> int:
        """Register a sequence and reuse the cached full pages of its prompt's prefix.

        Only full pages hit, each verified by exact token ids and parent; when the whole
        prompt would hit, the last page is left out so at least one token is computed (the
        model needs its logits). Write the rest with ``append_slots(seq_id, prompt[cached:])``.

        Args:
            seq_id: any hashable id not in use.
            prompt_token_ids: (prompt_len,) integer token ids (may be empty).

        With a tier, a miss restores the following pages from it; a tier that raises is a
        miss for the pages it did not restore (counted in ``tier_errors["lookup"]``).

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
            ps = self.page_size
            hashes = prefix_page_hashes(tokens[: (len(tokens) - 1) // ps * ps], ps, self.namespace)
            parent_serial: int | None = None
            for i, page_hash in enumerate(hashes):
                record = self.allocator.lookup(
                    page_hash, tokens[i * ps : (i + 1) * ps].tolist(), parent_serial
                )
                if record is None:
                    break
                seq.page_table.append(self.allocator.page_of(page_hash))
                seq.page_hashes.append(page_hash)
                seq.serials.append(record.serial)
                parent_serial = record.serial
            for page_id in seq.page_table:
                self.allocator.touch(page_id)
            try:
                if self.tier is not None and len(seq.page_table) < len(hashes):
                    self._restore(seq, tokens, hashes, parent_serial)
            except BaseException:  # e.g. KeyboardInterrupt: give back every page taken
                for page_id in reversed(seq.page_table):
                    self.allocator.release(page_id)
                raise
            seq.num_tokens = seq.num_written_tokens = len(seq.page_table) * ps
            seq.token_ids.extend(int(t) for t in tokens[: seq.num_tokens])
            self.prefix_query_tokens += len(tokens)
            self.prefix_hit_tokens += seq.num_tokens
        self._seqs[seq_id] = seq
        return seq.num_tokens

    def _restore(
        self, seq: SequencePages, tokens: np.ndarray, hashes: list[PageHash], parent: int | None
    ) -> None:
        """Restore the pages after the in-memory hits from the tier; a store that raises is
        a miss for the pages not restored yet, counted in ``tier_errors["lookup"]``."""
        assert self.tier is not None
        before = len(seq.page_table)
        try:
            restore_pages(
                self.tier, self.allocator, seq, tokens, hashes, parent,
                self.page_size, max_pages=self.num_free_pages, reclaim=self._reclaim,
            )  # fmt: skip
        except Exception:
            self.tier_errors["lookup"] += 1
            logger.warning("kv_store lookup failed: a prefix-cache miss", exc_info=True)
        self.tier_restored_tokens += (len(seq.page_table) - before) * self.page_size

    def append_slots(self, seq_id: Hashable, token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Reserve KV slots for new tokens; a page is allocated when its first token arrives.

        First drops pages outside the window of the first new token (see module doc), then
        allocates, then registers pages that became full in the prefix index (not yet written:
        call :meth:`commit_written` once the forward that writes these slots succeeded).

        Args:
            seq_id: an existing sequence.
            token_ids: (num_new_tokens,) integer ids of the tokens being written.

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
        self._trim(seq, n0)
        need = seq.pages_needed(k, ps)
        self._reserve(need, writer=seq_id)
        for _ in range(need):
            seq.page_table.append(self.allocator.allocate(reclaim_cached=self._reclaim))
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
        page_ids, keys = computed_pages(self._get(seq_id), start, end, self.page_size)
        if not page_ids:
            return 0
        try:
            self.tier.write(page_ids, keys)
        except Exception:  # the pages stay in the pool: only the tier's copy is lost
            self.tier_errors["write"] += len(page_ids)
            logger.warning("kv_store write failed: %d page(s) not stored", len(page_ids),
                           exc_info=True)  # fmt: skip
            return 0
        return len(page_ids)

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
        if not seq.num_written_tokens <= upto <= seq.num_tokens:
            raise ValueError(
                f"num_tokens: expected {seq.num_written_tokens} <= n <= {seq.num_tokens}, "
                f"got {upto}"
            )
        ps = self.page_size
        first = seq.num_written_tokens // ps
        seq.num_written_tokens = upto
        written: list[int] = []
        for i in range(first, upto // ps):
            page_id = seq.page_table[i]
            if page_id != -1 and self._registered_here(seq, i):
                self.allocator.mark_written(page_id)
                written.append(page_id)
        return written

    def unreserve(self, seq_id: Hashable, num_tokens: int) -> None:
        """Take back the slots reserved past ``num_tokens`` (a step that was scheduled but
        never run): pages the sequence registered past it leave the prefix index, pages past
        its new last page go back to the pool. Window trimming is not undone (the next
        reservation at that position would trim the same pages).

        Raises:
            KeyError: unknown seq_id. ValueError: ``num_tokens`` below the written tokens or
                above the reserved ones.
        """
        seq = self._get(seq_id)
        if not seq.num_written_tokens <= num_tokens <= seq.num_tokens:
            raise ValueError(
                f"num_tokens: expected {seq.num_written_tokens} <= n <= {seq.num_tokens}, "
                f"got {num_tokens}"
            )
        ps, keep = self.page_size, -(-num_tokens // self.page_size)
        for i in range(num_tokens // ps, len(seq.page_table)):
            if seq.page_table[i] != -1 and self._registered_here(seq, i):
                self.allocator.unregister(seq.page_table[i])  # reserved, never written
        for page_id in reversed(seq.page_table[keep:]):
            if page_id != -1:
                self.allocator.release(page_id)
        del seq.page_table[keep:]
        seq.num_tokens = num_tokens
        if self.enable_prefix_caching:
            del seq.token_ids[num_tokens:]
            del seq.page_hashes[num_tokens // ps :]
            del seq.serials[num_tokens // ps :]

    def fork(self, parent_id: Hashable, child_id: Hashable) -> list[tuple[int, int]]:
        """Create ``child_id`` sharing the parent's full pages; its partial last page is copied.

        Returns:
            ``[(src_page, dst_page)]`` page copies the caller must apply to the KV storage
            (:meth:`PagePool.copy_pages`) at once, before any page can be freed or allocated
            again (the source is the parent's, the destination the child's alone); empty
            when the parent's last page is full.

        Raises:
            KeyError: unknown parent. ValueError: child_id in use.
            OutOfPagesError: no page for the copy.
        """
        parent = self._get(parent_id)
        if child_id in self._seqs:
            raise ValueError(f"sequence {child_id!r} already exists")
        partial = parent.num_tokens % self.page_size != 0
        self._reserve(int(partial), writer=parent_id)
        child = parent.copy()
        copies: list[tuple[int, int]] = []
        if partial:
            dst = self.allocator.allocate(reclaim_cached=self._reclaim)
            copies.append((child.page_table[-1], dst))
            child.page_table[-1] = dst
        for page_id in child.page_table[: len(child.page_table) - int(partial)]:
            if page_id != -1:
                self.allocator.touch(page_id)
        self._seqs[child_id] = child
        return copies

    def free_sequence(self, seq_id: Hashable) -> None:
        """Release each of the sequence's pages once (last page first, so a prefix's tail is
        evicted before its head) and forget the sequence.

        Raises:
            KeyError: unknown seq_id.
        """
        seq = self._get(seq_id)
        ps = self.page_size
        for i in range(seq.num_written_tokens // ps, len(seq.page_table)):
            if seq.page_table[i] != -1 and self._registered_here(seq, i):
                self.allocator.unregister(seq.page_table[i])  # registered, never written
        for page_id in reversed(seq.page_table):
            if page_id != -1:
                self.allocator.release(page_id)
        del self._seqs[seq_id]

    def evict_oldest_page(self, seq_id: Hashable) -> int:
        """Lossy: drop the sequence's oldest resident full non-sink page (entry becomes -1).

        The sequence's later pages are no longer registered in the prefix index (their KV was
        computed without the dropped keys).

        Returns:
            The page id dropped.

        Raises:
            KeyError: unknown seq_id. OutOfPagesError: no such page.
        """
        seq = self._get(seq_id)
        index = seq.oldest_evictable(self.num_sink_pages, self.page_size, self.allocator, False)
        if index is None:
            raise OutOfPagesError(f"sequence {seq_id!r} has no evictable page")
        return self._drop_lossy(seq, index)

    # ---- internals -----------------------------------------------------------------------

    @property
    def _reclaim(self) -> bool:
        return self.policy != "raise"

    def _registered_here(self, seq: SequencePages, index: int) -> bool:
        """The page at ``index`` is in the index under this sequence's own entry (not a page
        it got from a prefix hit, which is written already)."""
        record = self.allocator.cached_page(seq.page_table[index])
        return (
            record is not None
            and index < len(seq.serials)
            and record.serial == seq.serials[index]
            and not self.allocator.is_written(seq.page_table[index])
        )

    def _get(self, seq_id: Hashable) -> SequencePages:
        try:
            return self._seqs[seq_id]
        except KeyError:
            raise KeyError(f"unknown sequence {seq_id!r}") from None

    def _trim_indices(self, seq: SequencePages, query_pos: int) -> range:
        return seq.window_trim_range(
            query_pos, self.sliding_window, self.num_sink_pages, self.page_size
        )

    def _trim(self, seq: SequencePages, query_pos: int) -> int:
        indices = self._trim_indices(seq, query_pos)
        dropped = seq.drop_pages(indices, self.allocator)
        seq.trimmed_upto = max(seq.trimmed_upto, indices.stop)
        self._window_evictions += dropped
        return dropped

    def _reserve(self, need: int, writer: Hashable) -> None:
        while self.num_free_pages < need:
            if self.policy != "evict_idle" or not self._evict_idle_page(writer):
                raise OutOfPagesError(
                    f"need {need} pages, {self.num_free_pages} free (policy {self.policy!r})"
                )

    def _evict_idle_page(self, writer: Hashable) -> bool:
        for seq_id, seq in self._seqs.items():  # least recently accessed first
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
        self._lossy_evictions += 1
        return page_id

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
