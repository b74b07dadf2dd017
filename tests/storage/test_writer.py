"""Write-through queue (never blocks, drops and counts when full) and the circuit breaker."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from pagedattn.storage.base import StoredPage
from pagedattn.storage.breaker import CircuitBreaker
from pagedattn.storage.writer import BackgroundWriter
from tests.storage.pages import namespace, pages


class _BlockedStore:
    namespace = namespace()

    def __init__(self) -> None:
        self.release = threading.Event()
        self.written: list[StoredPage] = []

    def put(self, batch: Sequence[StoredPage]) -> int:
        self.release.wait()
        self.written.extend(batch)
        return 1

    def __getattr__(self, name: str) -> Any:  # the rest of KVStore is unused here
        raise AttributeError(name)


def test_full_queue_drops_and_counts_without_waiting() -> None:
    store = _BlockedStore()
    writer = BackgroundWriter(store, max_pending=2)  # type: ignore[arg-type]
    batches = [pages(list(range(i * 4, i * 4 + 4)), store.namespace) for i in range(6)]
    accepted = [writer.submit(b) for b in batches]  # the store is stuck: nothing drains
    # one batch is taken by the thread (stuck in put), two wait, the rest are dropped
    assert accepted.count(True) in (2, 3) and accepted[:2] == [True, True]
    assert writer.num_dropped == accepted.count(False)
    store.release.set()
    writer.flush()
    assert len(store.written) == accepted.count(True)
    writer.close()


def test_breaker_opens_then_probes_then_closes() -> None:
    now = [0.0]
    breaker = CircuitBreaker(cooldown_s=1.0, clock=lambda: now[0])
    assert breaker.allow() and breaker.is_closed
    breaker.failure()
    assert not breaker.is_closed and not breaker.allow()
    now[0] = 1.5
    assert breaker.allow()  # the one probe
    assert not breaker.allow()  # others wait for its outcome
    breaker.failure()
    assert not breaker.allow()
    now[0] = 3.0
    assert breaker.allow()
    breaker.success()
    assert breaker.is_closed and breaker.allow() and breaker.num_opened == 1


def test_tier_write_drops_when_the_queue_is_full() -> None:
    """KVTier.write (the engine-thread side) never waits: with the store stuck, pages beyond
    the queue are dropped and counted, and what was queued lands once the store frees."""
    import numpy as np

    from pagedattn.cache.page_pool import PagePool
    from pagedattn.storage.tier import KVTier

    store = _BlockedStore()
    store.stats = lambda: {}  # type: ignore[method-assign]
    pool = PagePool(2, 8, 2, 4, 8)
    pool.kv[...] = np.random.default_rng(0).standard_normal(pool.kv.shape)
    tier = KVTier(store, pool, max_pending=1)
    keys = [p.key for p in pages(list(range(32)), store.namespace)]
    for i in range(8):
        tier.write([i], [keys[i]])
    # 1 queued (+ 1 in the stuck put if the thread took it already), the rest dropped
    assert 6 <= tier.writer.num_dropped <= 7
    store.release.set()
    tier.flush()
    assert len(store.written) == 8 - tier.writer.num_dropped
    for page in store.written:  # each queued page is the pool page as it was when written
        i = keys.index(page.key)
        assert page.kv.tobytes() == pool.kv[:, :, i].tobytes()
    assert tier.stats()["writes_dropped"] == tier.writer.num_dropped
