"""Prefix hits across layer groups (vLLM's ``HybridKVCacheCoordinator.find_longest_cache_hit``).

A hit of ``h`` pages lets a sequence start computing at position ``h * page_size``. Its full
attention group must hold every page of that prefix; a sliding group only the pages the first
computed token can still see (its window back from the hit point, plus the sink pages), since
the pages before were never going to be read again. The hit is the longest ``h`` every group
holds; each group then takes exactly its pages of that prefix, a sliding group's table keeping
-1 where the window had already moved past.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pagedattn.cache.allocator import PageAllocator
from pagedattn.cache.hashing import PageHash
from pagedattn.cache.sequence_pages import SequencePages


def visible_pages(h: int, window: int | None, num_sink_pages: int, page_size: int) -> range:
    """Indices of the non-sink pages before ``h`` that a query at position ``h * page_size``
    sees under ``window`` (every page when None)."""
    if window is None:
        return range(num_sink_pages, max(h, num_sink_pages))
    lo = max((h * page_size - window + 1) // page_size, num_sink_pages)
    return range(lo, max(h, lo))


def chain_hit(
    tokens: np.ndarray, hashes: Sequence[PageHash], allocator: PageAllocator, page_size: int
) -> int:
    """Pages of the longest prefix of ``hashes`` the index serves in an unbroken chain (each
    verified by exact token ids and parent serial); nothing is taken."""
    parent: int | None = None
    for i, page_hash in enumerate(hashes):
        record = allocator.lookup(
            page_hash, tokens[i * page_size : (i + 1) * page_size].tolist(), parent
        )
        if record is None:
            return i
        parent = record.serial
    return len(hashes)


def cached_pages(
    tokens: np.ndarray, hashes: Sequence[PageHash], allocator: PageAllocator, page_size: int
) -> list[int | None]:
    """For each page of ``hashes``, the page id the index holds it in (same hash and exact
    token ids; the chained hash names the whole prefix before it), None when absent."""
    out: list[int | None] = []
    for i, page_hash in enumerate(hashes):
        try:
            page_id = allocator.page_of(page_hash)
        except KeyError:
            out.append(None)
            continue
        record = allocator.cached_page(page_id)
        same = record is not None and record.token_ids == tuple(
            tokens[i * page_size : (i + 1) * page_size].tolist()
        )
        out.append(page_id if same else None)
    return out


def windowed_hit(
    present: Sequence[int | None], upto: int, window: int | None, num_sink_pages: int,
    page_size: int,
) -> int:  # fmt: skip
    """The largest ``h <= upto`` whose sink pages and visible pages (:func:`visible_pages`)
    are all ``present``; 0 when none is."""
    for h in range(upto, 0, -1):
        need = [
            *range(min(num_sink_pages, h)),
            *visible_pages(h, window, num_sink_pages, page_size),
        ]
        if all(present[i] is not None for i in need):
            return h
    return 0


def take_windowed(
    seq: SequencePages,
    tokens: np.ndarray,
    hashes: Sequence[PageHash],
    present: Sequence[int | None],
    h: int,
    allocator: PageAllocator,
    window: int | None,
    num_sink_pages: int,
    page_size: int,
) -> None:
    """Fill the empty table ``seq`` with the first ``h`` pages of a windowed group's hit: the
    sink and visible pages touched (one more reference each), the others -1."""
    keep = set(range(min(num_sink_pages, h))) | set(
        visible_pages(h, window, num_sink_pages, page_size)
    )
    for i in range(h):
        page_id = present[i] if i in keep else None
        record = None if page_id is None else allocator.cached_page(page_id)
        if page_id is not None:
            allocator.touch(page_id)
        seq.page_table.append(-1 if page_id is None else page_id)
        seq.page_hashes.append(hashes[i])
        seq.serials.append(None if record is None else record.serial)
    visible = visible_pages(h, window, num_sink_pages, page_size)
    seq.trimmed_upto = visible.start if h else 0
    seq.num_tokens = seq.num_written_tokens = h * page_size
    seq.token_ids.extend(int(t) for t in tokens[: h * page_size])
