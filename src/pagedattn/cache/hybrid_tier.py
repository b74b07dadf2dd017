"""Restoring a hybrid KV cache's prefix from the persistent tier, every layer group from its
own records (each group's are namespaced apart, :func:`hybrid_manager.group_namespace`).

Group 0 (full attention) holds its in-memory chain of pages; it restores the run of pages after
it that its tier holds, up to ``H``; a sliding group then needs, for a hit at ``H``, only its sink
pages and the pages a query at ``H * page_size`` sees (:func:`hybrid_hits.visible_pages`): those
not in memory come from its tier. When a sliding group's tier lacks one, the hit stays at ``h``
(the in-memory hybrid hit; the pages already restored stay in the prefix cache, written, for a
later request).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from pagedattn.cache.hashing import PageHash
from pagedattn.cache.hybrid_hits import cached_pages, visible_pages
from pagedattn.cache.sequence_pages import SequencePages
from pagedattn.cache.tier_pages import PageTier, page_key, restore_or_miss

if TYPE_CHECKING:
    from pagedattn.cache.manager import CacheManager

logger = logging.getLogger("pagedattn.cache")


def _restore_window(
    m: CacheManager, tier: PageTier | None, hashes: Sequence[PageHash], tokens: np.ndarray,
    h: int, errors: Counter[str],
) -> tuple[list[int | None], list[int]] | None:  # fmt: skip
    """The group's page ids of the first ``h`` pages (None where absent) with every page a
    hit at ``h`` needs present, restoring the missing ones from the group's tier; with the
    restored page ids (one reference each, the caller's). None when the tier lacks one."""
    ps = m.page_size
    present = cached_pages(tokens, hashes[:h], m.allocator, ps)
    sinks = range(min(m.num_sink_pages, h))
    need = [
        i
        for i in (*sinks, *visible_pages(h, m.sliding_window, m.num_sink_pages, ps))
        if present[i] is None
    ]
    reclaim = m.eviction.reclaim
    if not need:
        return present, []
    if tier is None or len(need) > m.allocator.num_allocatable(reclaim_cached=reclaim):
        return None
    try:
        kvs = tier.lookup([page_key(hashes, tokens, i, ps) for i in need])
    except Exception:
        errors["lookup"] += 1
        logger.warning("kv_store lookup failed: a prefix-cache miss", exc_info=True)
        return None
    if len(kvs) < len(need):
        return None
    restored: list[int] = []
    for i, kv in zip(need, kvs, strict=True):
        page_id = m.allocator.allocate(reclaim_cached=reclaim)
        parent = present[i - 1] if i else None
        record = None if parent is None else m.allocator.cached_page(parent)
        key = page_key(hashes, tokens, i, ps)
        try:
            tier.load(page_id, kv)
            serial = m.allocator.register(
                page_id, key.page_hash, key.parent_hash, key.token_ids,
                None if record is None else record.serial,
            )  # fmt: skip
        except Exception:
            errors["lookup"] += 1
            logger.warning("kv_store restore failed: a prefix-cache miss", exc_info=True)
            serial = None
        if serial is None:
            m.allocator.free(page_id)
            for done in restored:
                m.allocator.release(done)
            return None
        m.allocator.mark_written(page_id)
        present[i] = page_id
        restored.append(page_id)
    return present, restored


def extend_from_tiers(
    managers: Sequence[CacheManager],
    tiers: Sequence[PageTier | None],
    seq0: SequencePages,
    tokens: np.ndarray,
    hashes: Sequence[Sequence[PageHash]],
    h: int,
    errors: Counter[str],
) -> tuple[int, list[list[int | None]], list[tuple[CacheManager, int]]]:
    """Extend a hybrid hit from the groups' tiers (see the module doc).

    ``tiers[g]`` is group ``g``'s tier (its manager's, or the records fetched for it).
    ``seq0`` is group 0's table holding its in-memory chain (at least ``h`` pages, ``h`` being
    the in-memory hit of every group); it takes the restored pages, and is cut back to ``h``
    pages when the hit cannot grow.

    Returns:
        The hit ``H >= h``; when ``H > h``, for each group after the first its page ids of the
        first ``H``
        pages (:func:`cached_pages`, restored ones included); the restored pages of those
        groups, each with one reference the caller gives back once its table took them.
    """
    group0, ps = managers[0], managers[0].page_size
    tier0 = tiers[0]
    assert tier0 is not None
    parent = seq0.serials[-1] if seq0.serials else None
    reclaim = group0.eviction.reclaim
    restore_or_miss(
        tier0, group0.allocator, seq0, tokens, list(hashes[0]), parent, ps, errors,
        max_pages=group0.allocator.num_allocatable(reclaim_cached=reclaim), reclaim=reclaim,
    )  # fmt: skip
    top = len(seq0.page_table)
    if top > h:
        presents: list[list[int | None]] = []
        owned: list[tuple[CacheManager, int]] = []
        for g, m in enumerate(managers[1:], start=1):
            got = _restore_window(m, tiers[g], hashes[g], tokens, top, errors)
            if got is None:
                break
            presents.append(got[0])
            owned.extend((m, page_id) for page_id in got[1])
        else:
            return top, presents, owned
        for m, page_id in owned:
            m.allocator.release(page_id)
    for page_id in seq0.page_table[h:]:  # back to the prefix cache, written
        group0.allocator.release(page_id)
    del seq0.page_table[h:], seq0.page_hashes[h:], seq0.serials[h:]
    return h, [], []
