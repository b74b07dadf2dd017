"""The last few minutes of the cache counters, sampled every few seconds while the server
runs, as per-second rates for ``/v1/kv/state`` (the same counters ``/metrics`` exports)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from pagedattn.server.kv_state_models import KVRatePoint

_TIER = ("pages_hit", "pages_written", "bytes_read", "bytes_written")


def page_counters(stats: Mapping[str, Any]) -> dict[str, int]:
    """The sampled counters of an engine ``get_stats()``: evictions (every reason),
    preemptions, prefix-cache queries and hits (tokens) and pages held by sequences."""
    return {
        "evictions": sum(stats["evictions"].values()),
        "preemptions": stats["num_preemptions"],
        "prefix_cache_queries": stats["prefix_cache_queries"],
        "prefix_cache_hits": stats["prefix_cache_hits"],
        "used_pages": stats["num_pages"] - stats["num_free_pages"],
    }


class CounterHistory:
    """Samples ``stats_fn()`` every ``interval_s`` and keeps ``window_s`` of samples.

    Args:
        stats_fn: the engine's latest ``get_stats()`` (cheap: the loop's copy).
        interval_s: seconds between samples (> 0).
        window_s: seconds of history kept.
    """

    def __init__(
        self,
        stats_fn: Callable[[], Mapping[str, Any]],
        interval_s: float = 2.0,
        window_s: float = 300.0,
    ) -> None:
        if interval_s <= 0 or window_s < interval_s:
            raise ValueError(f"expected 0 < interval_s <= window_s, got {interval_s}, {window_s}")
        self.stats_fn = stats_fn
        self.interval_s = interval_s
        self._samples: deque[tuple[float, dict[str, int], dict[str, int] | None]] = deque(
            maxlen=int(window_s / interval_s) + 1
        )

    def sample(self, now: float | None = None) -> None:
        """Record the counters now (unix time ``now``, default the clock)."""
        stats = self.stats_fn()
        store = stats.get("kv_store")
        tier = None if store is None else {k: int(store[k]) for k in _TIER}
        self._samples.append((time.time() if now is None else now, page_counters(stats), tier))

    async def run(self) -> None:
        """Sample forever, every ``interval_s`` (cancel the task to stop)."""
        while True:
            self.sample()
            await asyncio.sleep(self.interval_s)

    def points(self) -> list[KVRatePoint]:
        """Rates between consecutive samples, oldest first."""
        samples = list(self._samples)
        points = []
        for (t0, a, ta), (t1, b, tb) in itertools.pairwise(samples):
            dt = t1 - t0
            if dt <= 0:
                continue
            queries = b["prefix_cache_queries"] - a["prefix_cache_queries"]
            hits = b["prefix_cache_hits"] - a["prefix_cache_hits"]

            def tier_rate(key: str, ta: Any = ta, tb: Any = tb, dt: float = dt) -> float | None:
                return None if ta is None or tb is None else (tb[key] - ta[key]) / dt

            points.append(
                KVRatePoint(
                    time=t1,
                    interval_s=dt,
                    used_pages=b["used_pages"],
                    prefix_cache_hit_ratio=hits / queries if queries > 0 else None,
                    evictions_per_s=(b["evictions"] - a["evictions"]) / dt,
                    preemptions_per_s=(b["preemptions"] - a["preemptions"]) / dt,
                    tier_pages_read_per_s=tier_rate("pages_hit"),
                    tier_pages_written_per_s=tier_rate("pages_written"),
                    tier_bytes_read_per_s=tier_rate("bytes_read"),
                    tier_bytes_written_per_s=tier_rate("bytes_written"),
                )
            )
        return points
