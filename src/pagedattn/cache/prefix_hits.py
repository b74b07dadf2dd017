"""Prefix hits: a new sequence's table starts with the cached full pages of its prompt, from
the pool's prefix index first, then (on a miss) restored from the persistent tier."""

from __future__ import annotations

from collections import Counter

import numpy as np

from pagedattn.cache.allocator import PageAllocator
from pagedattn.cache.hashing import prefix_page_hashes
from pagedattn.cache.sequence_pages import SequencePages
from pagedattn.cache.tier_pages import PageTier, restore_or_miss


def take_prefix_hits(
    seq: SequencePages,
    tokens: np.ndarray,
    allocator: PageAllocator,
    page_size: int,
    namespace: bytes,
    tier: PageTier | None,
    tier_errors: Counter[str],
    *,
    reclaim: bool,
) -> int:
    """Fill the empty table ``seq`` with the prompt's cached full pages.

    Only full pages hit, each verified by exact token ids and parent; the page holding the
    prompt's last token is never a hit (the model needs its logits). The pages after the
    in-memory hits are restored from ``tier`` when it holds them (at most the pages
    allocatable now); a tier that raises is a miss (:func:`restore_or_miss`).

    Returns:
        Tokens restored from the tier; ``seq.num_tokens`` holds every cached token.

    Raises:
        Whatever is not an ``Exception`` (e.g. KeyboardInterrupt): every page taken is given
        back first.
    """
    ps = page_size
    hashes = prefix_page_hashes(tokens[: (len(tokens) - 1) // ps * ps], ps, namespace)
    parent_serial = seq.take_cached_prefix(tokens, hashes, allocator, ps)
    restored = 0
    try:
        if tier is not None and len(seq.page_table) < len(hashes):
            restored = restore_or_miss(
                tier, allocator, seq, tokens, hashes, parent_serial, ps, tier_errors,
                max_pages=allocator.num_allocatable(reclaim_cached=reclaim), reclaim=reclaim,
            )  # fmt: skip
    except BaseException:  # e.g. KeyboardInterrupt: give back every page taken
        for page_id in reversed(seq.page_table):
            allocator.release(page_id)
        raise
    seq.num_tokens = seq.num_written_tokens = len(seq.page_table) * ps
    seq.token_ids.extend(int(t) for t in tokens[: seq.num_tokens])
    return restored
