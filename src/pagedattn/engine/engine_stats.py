"""The engine's counters as one plain dict (what ``/metrics`` and ``--stats`` read)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pagedattn.cache import CacheManager
from pagedattn.engine.scheduler import Scheduler

if TYPE_CHECKING:
    from pagedattn.storage import KVTier


def engine_stats(
    scheduler: Scheduler, cache_manager: CacheManager, kv_tier: KVTier | None
) -> dict[str, Any]:
    """Plain counters for metrics (see :class:`pagedattn.engine.stats.SchedulerStats`).

    Keys: every SchedulerStats field, ``num_running``, ``num_waiting`` (waiting for their KV
    too), ``num_waiting_for_kv`` (of those, requests whose prefix is being read from the
    persistent tier), ``num_pages``,
    ``num_free_pages``, ``kv_cache_usage`` (fraction of pages referenced), and
    ``evictions`` (dict reason -> count from the cache manager), ``tier_restored_tokens``
    (prompt tokens restored from the persistent tier), ``tier_errors`` (dict: "lookup"
    lookups that raised and were a miss, "write" pages whose write-through raised) and
    ``kv_store`` (the tier's :meth:`pagedattn.storage.KVTier.stats`, None without a tier), and
    ``spec_acceptance_ratio`` (speculative decoding: accepted / drafted tokens, 0.0 before
    any draft).
    """
    s = scheduler.stats
    drafted = s.spec_num_drafted_tokens
    pages = cache_manager.num_pages
    referenced = pages - cache_manager.allocator.num_free_pages
    return {
        **{k: (dict(v) if k == "num_finished" else v) for k, v in vars(s).items()},
        "num_running": len(scheduler.running),
        "num_waiting": len(scheduler.waiting) + scheduler.queues.num_waiting_for_kv,
        "num_waiting_for_kv": scheduler.queues.num_waiting_for_kv,
        "num_pages": pages,
        "num_free_pages": cache_manager.num_free_pages,
        "kv_cache_usage": referenced / pages,
        "evictions": cache_manager.evictions,
        "tier_restored_tokens": cache_manager.tier_restored_tokens,
        "tier_errors": dict(cache_manager.tier_errors),
        "kv_store": None if kv_tier is None else kv_tier.stats(),
        "spec_acceptance_ratio": s.spec_num_accepted_tokens / drafted if drafted else 0.0,
    }
