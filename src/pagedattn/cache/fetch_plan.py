"""Which records a persistent-tier restore reads (engine thread, no I/O): the first half of
a restore that never waits on the store (:mod:`pagedattn.cache.tier_fetch`)."""

from __future__ import annotations

import numpy as np

from pagedattn.cache.hashing import prefix_page_hashes
from pagedattn.cache.hybrid_hits import cached_pages, chain_hit
from pagedattn.cache.manager import CacheManager
from pagedattn.cache.tier_fetch import FetchingTier, TierFetch, WindowFetch
from pagedattn.cache.tier_pages import page_key


def plan_fetch(manager: CacheManager, tokens: np.ndarray) -> TierFetch | None:
    """The records a restore of ``tokens``' prefix would read (engine thread; no I/O), None
    when there is nothing to read: no tier, prefix caching off, or group 0's in-memory chain
    already covers every full page before the last token."""
    managers: tuple[CacheManager, ...] = getattr(manager, "group_managers", (manager,))
    tier = manager.tier
    if not isinstance(tier, FetchingTier) or not manager.enable_prefix_caching:
        return None
    ps = manager.page_size
    hit_tokens = tokens[: (len(tokens) - 1) // ps * ps]
    hashes = [prefix_page_hashes(hit_tokens, ps, m.namespace) for m in managers]
    chain = chain_hit(tokens, hashes[0], manager.allocator, ps)
    if chain == len(hashes[0]):
        return None
    last = min(len(hashes[0]), chain + manager.allocator.num_pages)
    keys = [page_key(hashes[0], tokens, i, ps) for i in range(chain, last)]
    windows = []
    for g, m in enumerate(managers[1:], start=1):
        if not isinstance(m.tier, FetchingTier):
            return None
        present = cached_pages(tokens, hashes[g], m.allocator, ps)
        windows.append(
            WindowFetch(
                m.tier,
                tuple(page_key(hashes[g], tokens, i, ps) for i in range(len(hashes[g]))),
                tuple(p is not None for p in present),
                m.sliding_window,
                m.num_sink_pages,
            )
        )
    return TierFetch(tier, keys, chain, ps, windows)
