"""HybridCacheManager: one sequence's pages kept per layer group (full attention, sliding window).

vLLM's hybrid KV cache manager on a CPU pool: each layer group has its own page ids, allocator,
prefix index and window trimming (a :class:`CacheManager` apiece); the group's layers read and
write only their own page ids. Group 0 (full attention) is this object itself; every other
group is a sliding window whose pages leave the table, back to the pool or to the prefix-cache
LRU when full and hashed, as soon as the window has moved past them. Page ids are global: group
``g`` owns ids ``base[g] .. base[g] + num_pages[g] - 1`` of one :class:`PagePool`, whose rows of
the other groups' layers are never written (on NumPy never resident).

Every change is made in every group or in none: a reservation that one group cannot hold is
taken back from the groups that made it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Sequence

import numpy as np

from pagedattn.cache.hashing import prefix_page_hashes
from pagedattn.cache.hybrid_hits import cached_pages, chain_hit, take_windowed, windowed_hit
from pagedattn.cache.hybrid_tier import extend_from_tiers
from pagedattn.cache.layer_groups import LayerGroup, effective_window
from pagedattn.cache.manager import CacheManager
from pagedattn.cache.sequence_pages import SequencePages, pad_page_tables, validate_token_ids
from pagedattn.cache.tier_fetch import FetchedPages
from pagedattn.cache.tier_pages import PageTier


def group_namespace(namespace: bytes, group: int, window: int | None) -> bytes:
    """The 16-byte namespace of a group's pages (prefix hashes and persistent-tier records):
    one group's page is never read as another's, nor as a page of every layer."""
    suffix = f"|kv-group:{group}:window:{window or 0}".encode()
    return hashlib.blake2b(namespace + suffix, digest_size=16).digest()


class HybridCacheManager(CacheManager):
    """Page tables of many sequences in each layer group.

    Args:
        groups: the layer groups (:func:`pagedattn.cache.layer_groups.layer_groups`), at
            least two; group 0 keeps every page (full attention) unless ``sliding_window``.
        num_pages: pages of each group (> 0 each).
        page_size, namespace, enable_prefix_caching: as :class:`CacheManager`.
        sliding_window, num_sink_tokens: the engine's own window and sinks (StreamingLLM);
            each group trims with the smaller of it and its layers' window, and keeps the sinks.
        tiers: None, or the persistent tier of each group (its own records): a miss restores
            from them (:mod:`pagedattn.cache.hybrid_tier`), computed pages are written to them.

    Raises:
        ValueError: fewer than two groups, a page count per group that does not match, or
            whatever :class:`CacheManager` raises.
    """

    def __init__(
        self,
        groups: Sequence[LayerGroup],
        num_pages: Sequence[int],
        page_size: int,
        namespace: bytes,
        *,
        sliding_window: int | None = None,
        num_sink_tokens: int = 0,
        enable_prefix_caching: bool = True,
        tiers: Sequence[PageTier] | None = None,
    ) -> None:
        if tiers is not None and len(tiers) != len(groups):
            raise ValueError(f"HybridCacheManager: {len(tiers)} tiers for {len(groups)} groups")
        if len(groups) < 2 or len(num_pages) != len(groups):
            raise ValueError(
                f"HybridCacheManager: expected >= 2 groups and a page count each, got "
                f"{len(groups)} groups and {len(num_pages)} counts"
            )
        windows = [effective_window(sliding_window, g.window) for g in groups]
        super().__init__(
            num_pages[0], page_size, group_namespace(namespace, 0, windows[0]),
            sliding_window=windows[0],
            num_sink_tokens=num_sink_tokens, enable_prefix_caching=enable_prefix_caching,
            tier=None if tiers is None else tiers[0],
        )  # fmt: skip
        self.groups = tuple(groups)
        self.windows = tuple(windows)
        others = [
            CacheManager(
                num_pages[g],
                page_size,
                group_namespace(namespace, g, windows[g]),
                sliding_window=windows[g],
                num_sink_tokens=num_sink_tokens,
                enable_prefix_caching=enable_prefix_caching,
                tier=None if tiers is None else tiers[g],
            )
            for g in range(1, len(groups))
        ]
        for m in others:
            m.tier_errors = self.tier_errors  # one count for the engine
        self.group_managers: tuple[CacheManager, ...] = (self, *others)
        self.bases = tuple(int(b) for b in np.cumsum([0, *num_pages[:-1]]))
        self.group_num_pages = tuple(int(n) for n in num_pages)

    @property
    def total_pages(self) -> int:
        """Page ids of every group together (the pool's size)."""
        return sum(self.group_num_pages)

    def _others(self) -> tuple[CacheManager, ...]:
        return self.group_managers[1:]

    # ---- reads -----------------------------------------------------------------------------

    def group_page_tables(
        self, seq_ids: Sequence[Hashable], max_pages: int | None = None
    ) -> tuple[np.ndarray, ...]:
        """Per group, the padded int32 page tables of ``seq_ids`` in global page ids (-1 where
        no page is held)."""
        out = []
        for base, manager in zip(self.bases, self.group_managers, strict=True):
            tables = pad_page_tables([manager._get(s).page_table for s in seq_ids], max_pages)
            out.append(np.where(tables >= 0, tables + base, -1).astype(np.int32))
        return tuple(out)

    def group_resident_pages(self) -> tuple[int, ...]:
        """Pages each group's sequences hold now (referenced; cached free pages not counted)."""
        return tuple(m.num_pages - m.allocator.num_free_pages for m in self.group_managers)

    def can_append(self, seq_id: Hashable, num_new_tokens: int = 1) -> bool:
        """True when every group can hold the new tokens without lossy eviction."""
        return all(CacheManager.can_append(m, seq_id, num_new_tokens) for m in self.group_managers)

    def can_draft(self, seq_id: Hashable, num_new_tokens: int) -> bool:
        """True when every group holds the drafted tokens in empty pages."""
        return all(CacheManager.can_draft(m, seq_id, num_new_tokens) for m in self.group_managers)

    @property
    def evictions(self) -> dict[str, int]:
        """Eviction counts by reason, summed over the groups."""
        total: dict[str, int] = {}
        for m in self.group_managers:
            for reason, count in m.eviction.counts().items():
                total[reason] = total.get(reason, 0) + count
        return total

    # ---- lifecycle -------------------------------------------------------------------------

    def add_sequence(
        self, seq_id: Hashable, prompt_token_ids: Sequence[int] | np.ndarray = (), *,
        fetched: FetchedPages | None = None,
    ) -> int:  # fmt: skip
        """Register a sequence in every group with the longest prefix hit every group holds
        (:mod:`pagedattn.cache.hybrid_hits`); returns the cached tokens (see
        :meth:`CacheManager.add_sequence`; ``fetched`` holds each group's records)."""
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id!r} already exists")
        tokens = validate_token_ids(prompt_token_ids)
        ps = self.page_size
        seqs = [SequencePages() for _ in self.group_managers]
        if self.enable_prefix_caching and len(tokens):
            hit_tokens = tokens[: (len(tokens) - 1) // ps * ps]
            hashes = [prefix_page_hashes(hit_tokens, ps, m.namespace) for m in self.group_managers]
            chain = h = chain_hit(tokens, hashes[0], self.allocator, ps)
            present = [
                cached_pages(tokens, hashes[g][:h], m.allocator, ps)
                for g, m in enumerate(self.group_managers)
            ]
            for g, m in enumerate(self.group_managers):
                if g:
                    h = windowed_hit(present[g], h, m.sliding_window, m.num_sink_pages, ps)
            owned: list[tuple[CacheManager, int]] = []
            if self.tier is None or chain == len(hashes[0]):
                seqs[0].take_cached_prefix(tokens, hashes[0][:h], self.allocator, ps)
            else:  # the tier continues group 0's in-memory chain
                seqs[0].take_cached_prefix(tokens, hashes[0][:chain], self.allocator, ps)
                tiers = [
                    m.tier if fetched is None else fetched.tier(g, m.tier)
                    for g, m in enumerate(self.group_managers)
                ]
                top, extra, owned = extend_from_tiers(
                    self.group_managers, tiers, seqs[0], tokens, hashes, h, self.tier_errors
                )
                if top > h:
                    self.tier_restored_tokens += (top - chain) * ps
                    h, present = top, [present[0], *extra]
            seqs[0].num_tokens = seqs[0].num_written_tokens = h * ps
            seqs[0].token_ids.extend(int(t) for t in tokens[: h * ps])
            for g, m in enumerate(self._others(), start=1):
                take_windowed(
                    seqs[g], tokens, hashes[g], present[g], h, m.allocator, m.sliding_window,
                    m.num_sink_pages, ps,
                )  # fmt: skip
            for m, page_id in owned:  # the tables hold them now
                m.allocator.release(page_id)
            self.prefix_query_tokens += len(tokens)
            self.prefix_hit_tokens += h * ps
        for seq, m in zip(seqs, self.group_managers, strict=True):
            m._seqs[seq_id] = seq
        return seqs[0].num_tokens

    def append_slots(
        self, seq_id: Hashable, token_ids: Sequence[int] | np.ndarray, *, trim: bool = True
    ) -> np.ndarray:
        """Reserve the new tokens' slots in every group (see :meth:`CacheManager.append_slots`);
        returns group 0's slots (the others' follow from their page tables). A group that
        cannot hold them raises after the groups before it took their reservation back."""
        start = self.num_tokens(seq_id)
        slots = CacheManager.append_slots(self, seq_id, token_ids, trim=trim)
        done: list[CacheManager] = [self]
        try:
            for m in self._others():
                m.append_slots(seq_id, token_ids, trim=trim)
                done.append(m)
        except BaseException:
            for m in done:
                CacheManager.unreserve(m, seq_id, start)
            raise
        return slots

    def commit_written(self, seq_id: Hashable, num_tokens: int | None = None) -> list[int]:
        """Commit in every group; returns group 0's newly written pages."""
        for m in self._others():
            m.commit_written(seq_id, num_tokens)
        return CacheManager.commit_written(self, seq_id, num_tokens)

    def unreserve(self, seq_id: Hashable, num_tokens: int) -> None:
        """Take back the slots past ``num_tokens`` in every group."""
        for m in self.group_managers:
            CacheManager.unreserve(m, seq_id, num_tokens)

    def free_sequence(self, seq_id: Hashable) -> None:
        """Release the sequence's pages in every group."""
        for m in self.group_managers:
            CacheManager.free_sequence(m, seq_id)

    def reset_prefix_cache(self) -> int:
        """Drop every group's cached prefixes; returns the entries dropped."""
        return sum(CacheManager.reset_prefix_cache(m) for m in self.group_managers)

    def pages_computed(self, seq_id: Hashable, start: int, end: int) -> int:
        """Hand every group's newly computed full pages to its tier (see
        :meth:`CacheManager.pages_computed`); returns the pages queued."""
        return sum(CacheManager.pages_computed(m, seq_id, start, end) for m in self.group_managers)

    def evict_oldest_page(self, seq_id: Hashable) -> int:
        """Lossy eviction is not defined across layer groups.

        Raises:
            ValueError: always.
        """
        raise ValueError("evict_oldest_page: not supported with a hybrid KV cache")

    def check_integrity(self, *, between_steps: bool = True) -> None:
        """Every group's invariants, and the same sequences and token counts in each."""
        for m in self.group_managers:
            CacheManager.check_integrity(m, between_steps=between_steps)
            if set(m._seqs) != set(self._seqs) or any(
                m._seqs[s].num_tokens != self._seqs[s].num_tokens for s in self._seqs
            ):
                raise AssertionError("hybrid KV cache: groups disagree on sequences or tokens")
