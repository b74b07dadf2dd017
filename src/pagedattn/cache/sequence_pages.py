"""SequencePages: one sequence's page table and prefix-hash chain (state owned by CacheManager)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from pagedattn.cache.allocator import PageAllocator
from pagedattn.cache.hashing import PageHash, hash_page_tokens


def validate_token_ids(token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """Token ids as a 1-D int64 array.

    Raises:
        ValueError: not 1-D, or not integers.
    """
    arr = np.asarray(token_ids)
    if arr.ndim != 1:
        raise ValueError(f"token_ids: expected shape (num_tokens,), got {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"token_ids: expected integer ids, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def pad_page_tables(tables: Sequence[Sequence[int]], max_pages: int | None) -> np.ndarray:
    """Stack page tables into int32 ``(len(tables), max_pages)`` padded with -1.

    Raises:
        ValueError: ``max_pages`` shorter than a table.
    """
    width = max([1, *(len(t) for t in tables)]) if max_pages is None else max_pages
    out = np.full((len(tables), width), -1, np.int32)
    for row, table in enumerate(tables):
        if len(table) > width:
            raise ValueError(f"max_pages={width} but sequence {row} has {len(table)} pages")
        out[row, : len(table)] = table
    return out


@dataclass
class SequencePages:
    """Pages of one sequence.

    Attributes:
        page_table: page ids in position order; -1 where a page was dropped.
        num_tokens: KV tokens reserved (slots handed out); ``len(page_table) ==
            ceil(num_tokens / page_size)``.
        num_written_tokens: of those, tokens whose KV a successful forward wrote (or that were
            served from the prefix cache); pages this sequence registered beyond them are
            taken back out of the prefix index when it is freed (its step failed).
        token_ids: every token id reserved (kept only with prefix caching, to hash full pages).
        page_hashes: chained hash of each full page (prefix caching only).
        serials: registration serial serving each full page's exact prefix, None once the chain
            is broken (a collision, a dropped page or lossy eviction).
        trimmed_upto: pages before this index were already checked against the window.
        lossy: a visible page was dropped; later pages' KV no longer matches the prefix.
    """

    page_table: list[int] = field(default_factory=list)
    num_tokens: int = 0
    num_written_tokens: int = 0
    token_ids: list[int] = field(default_factory=list)
    page_hashes: list[PageHash] = field(default_factory=list)
    serials: list[int | None] = field(default_factory=list)
    trimmed_upto: int = 0
    lossy: bool = False

    def num_full_pages(self, page_size: int) -> int:
        return self.num_tokens // page_size

    def pages_needed(self, num_new_tokens: int, page_size: int) -> int:
        """New pages that appending ``num_new_tokens`` tokens allocates."""
        return -(-(self.num_tokens + num_new_tokens) // page_size) - len(self.page_table)

    def window_trim_range(
        self, query_pos: int, sliding_window: int | None, num_sink_pages: int, page_size: int
    ) -> range:
        """Indices of full non-sink pages wholly at positions <= query_pos - W, not yet trimmed."""
        if sliding_window is None:
            return range(0)
        stop = min((query_pos - sliding_window + 1) // page_size, self.num_full_pages(page_size))
        return range(max(self.trimmed_upto, num_sink_pages), max(stop, 0))

    def drop_pages(self, indices: range, allocator: PageAllocator) -> int:
        """Release the resident pages at ``indices`` (entries become -1); returns how many."""
        dropped = 0
        for i in indices:
            if self.page_table[i] != -1:
                allocator.release(self.page_table[i])
                self.page_table[i] = -1
                dropped += 1
        return dropped

    def register_page(
        self, index: int, allocator: PageAllocator, page_size: int, namespace: bytes
    ) -> None:
        """Hash the just-filled page ``index`` and enter it in the prefix index if its whole
        chain is registered and its KV is exact (no lossy eviction)."""
        tokens = self.token_ids[index * page_size : (index + 1) * page_size]
        parent_hash = self.page_hashes[index - 1] if index else None
        page_hash = hash_page_tokens(parent_hash, tokens, namespace)
        self.page_hashes.append(page_hash)
        parent_serial = self.serials[index - 1] if index else None
        serial = None
        page_id = self.page_table[index]
        if not self.lossy and page_id != -1 and (index == 0 or parent_serial is not None):
            serial = allocator.register(page_id, page_hash, parent_hash, tokens, parent_serial)
        self.serials.append(serial)

    def take_cached_prefix(
        self, tokens: np.ndarray, hashes: list[PageHash], allocator: PageAllocator, page_size: int
    ) -> int | None:
        """Append the cached pages of the longest prefix of ``hashes`` (each verified by exact
        token ids and parent) to this empty table and touch them.

        Returns:
            The serial of the last page taken, None when none was.
        """
        ps, parent_serial = page_size, None
        for i, page_hash in enumerate(hashes):
            record = allocator.lookup(
                page_hash, tokens[i * ps : (i + 1) * ps].tolist(), parent_serial
            )
            if record is None:
                break
            self.page_table.append(allocator.page_of(page_hash))
            self.page_hashes.append(page_hash)
            self.serials.append(record.serial)
            parent_serial = record.serial
        for page_id in self.page_table:
            allocator.touch(page_id)
        return parent_serial

    def oldest_evictable(
        self, num_sink_pages: int, page_size: int, allocator: PageAllocator, exclusive: bool
    ) -> int | None:
        """Index of the oldest resident full non-sink page (referenced only here if
        ``exclusive``), or None."""
        for i in range(num_sink_pages, self.num_full_pages(page_size)):
            page_id = self.page_table[i]
            if page_id != -1 and (not exclusive or allocator.refcount(page_id) == 1):
                return i
        return None

    def check(self, page_size: int, prefix_caching: bool, name: str) -> None:
        """Raise AssertionError when the table length, last page, written count or hash chain
        is inconsistent."""
        if len(self.page_table) != -(-self.num_tokens // page_size):
            raise AssertionError(f"{name}: {len(self.page_table)} pages for {self.num_tokens}")
        if self.num_tokens % page_size and self.page_table[-1] == -1:
            raise AssertionError(f"{name}: partial last page was dropped")
        if not 0 <= self.num_written_tokens <= self.num_tokens:
            raise AssertionError(
                f"{name}: {self.num_written_tokens} written of {self.num_tokens} reserved tokens"
            )
        full = self.num_full_pages(page_size)
        if prefix_caching and not (
            len(self.token_ids) == self.num_tokens
            and len(self.page_hashes) == full
            and len(self.serials) == full
        ):
            raise AssertionError(f"{name}: hash chain out of step with {self.num_tokens} tokens")
