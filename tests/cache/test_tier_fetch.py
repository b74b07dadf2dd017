"""A restore's read (TierFetch) on in-memory tiers: group 0's consecutive run first, then each
sliding group's window at the hit point that run reaches, only the pages its pool lacks; the
records land under their own group; an abandoned read stops."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from pagedattn.cache.hashing import PageKey
from pagedattn.cache.tier_fetch import FetchedTier, FetchJob, TierFetch, WindowFetch

PS = 4


def _keys(group: int, n: int) -> tuple[PageKey, ...]:
    hashes = [bytes([group, i]) * 8 for i in range(n)]
    return tuple(
        PageKey(h, hashes[i - 1] if i else None, tuple(range(i * PS, (i + 1) * PS)))
        for i, h in enumerate(hashes)
    )


class DictTier:
    """Holds records by page hash; ``fetch`` reads the consecutive run it holds."""

    def __init__(self, keys: Sequence[PageKey], held: Sequence[int]) -> None:
        self.records = {keys[i].page_hash: np.full(2, i, np.float32) for i in held}
        self.asked: list[list[bytes]] = []
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def fetch(self, job: FetchJob) -> None:
        self.asked.append([k.page_hash for k in job.keys])
        self.entered.set()
        for key in job.keys:
            if self.gate is not None:
                self.gate.wait(30)
            with job.lock:
                if job.abandoned or key.page_hash not in self.records:
                    return
                job.pages.append(self.records[key.page_hash])

    def lookup(self, keys: Sequence[PageKey]) -> list[np.ndarray]:
        raise AssertionError("a fetched restore never looks up the store")

    def load(self, page_id: int, kv: np.ndarray) -> None: ...

    def write(self, page_ids: Sequence[int], keys: Sequence[PageKey]) -> None: ...


def test_each_group_reads_its_window_at_the_hit_point_and_keeps_its_records() -> None:
    full, win_a, win_b = _keys(0, 6), _keys(1, 6), _keys(2, 6)
    tier0 = DictTier(full, held=range(2, 5))  # pages 2-4 after an in-memory chain of 2
    tier_a = DictTier(win_a, held=range(6))
    tier_b = DictTier(win_b, held=range(6))
    # window 8 tokens: a query at position 5 * 4 = 20 sees positions 13-20, pages 3 and 4
    windows = [
        WindowFetch(tier_a, win_a, (True,) * 6, 8, 0),  # its pool holds every page
        WindowFetch(tier_b, win_b, (True, True, True, False, False, True), 8, 0),
    ]
    fetch = TierFetch(tier0, full[2:], 2, PS, windows)
    fetch.run()
    assert fetch.done.is_set() and fetch.error is None
    assert fetch.num_asked == 4 and fetch.num_fetched() == 3  # the run ends at page 5
    assert tier_a.asked == []  # nothing to read: the pool has the window
    assert tier_b.asked == [[win_b[3].page_hash, win_b[4].page_hash]]
    got = fetch.result().groups
    assert [sorted(g) for g in got] == [
        sorted(k.page_hash for k in full[2:5]),
        [],
        sorted(k.page_hash for k in win_b[3:5]),
    ]
    # the restore reads them as a tier: the longest prefix of the keys it asks for
    tier = FetchedTier(tier0, got[0])
    assert [int(kv[0]) for kv in tier.lookup(full[2:])] == [2, 3, 4]
    assert tier.lookup(full[:3]) == []  # page 0 was not read (the pool held it)


def test_an_abandoned_read_stops_and_keeps_what_it_read() -> None:
    full = _keys(0, 6)
    tier0 = DictTier(full, held=range(6))
    tier0.gate = threading.Event()
    fetch = TierFetch(tier0, full, 0, PS, [])
    thread = threading.Thread(target=fetch.run)
    thread.start()
    assert tier0.entered.wait(30)  # the read waits before its first page
    fetch.abandon()
    tier0.gate.set()
    thread.join(30)
    assert fetch.done.is_set() and fetch.num_fetched() == 0
    never = TierFetch(tier0, full, 0, PS, [])
    never.abandon()
    never.run()  # abandoned before it started: reads nothing
    assert never.done.is_set() and len(tier0.asked) == 1 and never.result().groups == ({},)


def test_a_store_that_raises_is_reported_not_raised() -> None:
    class Broken(DictTier):
        def fetch(self, job: FetchJob) -> None:
            raise OSError("injected: the store is gone")

    full = _keys(0, 3)
    fetch = TierFetch(Broken(full, held=()), full, 0, PS, [])
    fetch.run()
    assert isinstance(fetch.error, OSError) and fetch.done.is_set()
    assert fetch.result().groups == ({},)
