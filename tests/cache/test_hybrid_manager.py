"""HybridCacheManager: per-group page tables, window trimming of the sliding group, prefix hits
under the sliding rule, atomic reservations; layer groups from per-layer windows."""

from __future__ import annotations

import numpy as np
import pytest

from pagedattn.cache import CacheManager, OutOfPagesError
from pagedattn.cache.hybrid_manager import HybridCacheManager
from pagedattn.cache.layer_groups import LayerGroup, group_of_layers, layer_groups

NS = b"hybrid-test"
PS, W = 4, 8  # a query at p sees keys p - 7 .. p: at most 3 pages of 4


def hybrid(full: int = 64, sliding: int = 16, **kwargs: object) -> HybridCacheManager:
    groups = (LayerGroup(None, (5,)), LayerGroup(W, (0, 1, 2, 3, 4)))
    return HybridCacheManager(groups, (full, sliding), PS, NS, **kwargs)  # type: ignore[arg-type]


def run(m: CacheManager, seq: object, tokens: np.ndarray, chunk: int = PS) -> None:
    """Append ``tokens`` chunk by chunk, committing each (successful steps)."""
    for i in range(0, len(tokens), chunk):
        m.append_slots(seq, tokens[i : i + chunk])
        m.commit_written(seq)


def free_cached(m: CacheManager) -> int:
    """Free pages that still hold a cached prefix."""
    a = m.allocator
    return a.num_allocatable(reclaim_cached=True) - a.num_allocatable(reclaim_cached=False)


def sliding(m: HybridCacheManager) -> CacheManager:
    return m.group_managers[1]


def test_layer_groups_full_first_then_windows() -> None:
    windows = (8, 8, 0, 8, 4, 0)
    groups = layer_groups(6, windows)
    assert groups == (
        LayerGroup(None, (2, 5)),
        LayerGroup(8, (0, 1, 3)),
        LayerGroup(4, (4,)),
    )
    assert group_of_layers(groups, 6) == (1, 1, 0, 1, 2, 0)
    assert layer_groups(3, None) == (LayerGroup(None, (0, 1, 2)),)
    with pytest.raises(ValueError, match="2 layer windows for 3 layers"):
        layer_groups(3, (8, 0))


def test_sliding_group_keeps_only_its_window_and_full_group_every_page() -> None:
    m = hybrid()
    m.add_sequence("a")
    tokens = np.arange(100, 140)
    run(m, "a", tokens)
    full_table = m.page_table("a")
    slide_table = sliding(m).page_table("a")
    assert len(full_table) == len(slide_table) == 10
    assert -1 not in full_table
    # the last query (position 39) sees keys 32..39, the next one 33..40: pages 8 and 9 and,
    # for the page before the window of position 36's query, page 7 (it was not yet trimmed)
    assert [i for i, p in enumerate(slide_table) if p != -1] == [7, 8, 9]
    assert m.group_resident_pages() == (10, 3)
    # global page ids: the sliding group's come after the full group's 64
    tables = m.group_page_tables(["a"])
    assert tables[0][0].tolist() == full_table
    assert tables[1][0].tolist() == [p + 64 if p != -1 else -1 for p in slide_table]
    assert m.evictions["sliding_window"] == 7
    m.check_integrity()


def test_window_pages_go_to_the_prefix_cache_lru() -> None:
    m = hybrid()
    m.add_sequence("a")
    run(m, "a", np.arange(100, 140))
    s = sliding(m)
    # trimmed full hashed pages: free, but cached (reused last, and still a prefix hit)
    assert free_cached(s) == 7 and free_cached(m) == 0
    m.free_sequence("a")
    assert free_cached(s) == 10 and free_cached(m) == 10
    m.check_integrity()


def _cached_then_reclaimed(reclaims: int) -> tuple[HybridCacheManager, np.ndarray]:
    """A 40-token prompt run and freed (its pages cached), then ``reclaims`` sliding-group
    pages allocated and released in LRU order; the manager and the prompt."""
    m = hybrid()
    a = np.arange(100, 140)
    m.add_sequence("a")
    run(m, "a", a)
    m.free_sequence("a")
    s = sliding(m)
    taken = [s.allocator.allocate() for _ in range(reclaims)]
    for page_id in taken:
        s.allocator.release(page_id)
    return m, a


def test_prefix_hit_needs_only_the_window_before_the_hit_point() -> None:
    # Reclaim the 6 empty sliding pages and the 7 oldest cached ones (indices 0..6): the
    # sliding group keeps only pages 7, 8, 9 of the prefix.
    m, a = _cached_then_reclaimed(13)
    s = sliding(m)
    assert s.allocator.num_lru_evictions == 7
    prompt = np.concatenate([a, np.arange(500, 510)])
    assert m.add_sequence("b", prompt) == 40  # pages 8, 9 are all a query at 40 sees
    assert [i for i, p in enumerate(s.page_table("b")) if p != -1] == [8, 9]
    assert -1 not in m.page_table("b")
    run(m, "b", prompt[40:], chunk=10)
    m.check_integrity()
    m.free_sequence("b")
    m.check_integrity()


def test_hit_shrinks_to_where_the_sliding_group_still_holds_the_window() -> None:
    # 6 empty pages, then the LRU order is indices 0..6 (trimmed), then 9, 8, 7 (freed last
    # page first): 14 reclaims take index 9 as well.
    m, a = _cached_then_reclaimed(14)
    s = sliding(m)
    prompt = np.concatenate([a, np.arange(500, 510)])
    # h = 10 pages would need 8 and 9; h = 9 (36 tokens) needs pages 7 and 8, still cached
    assert m.add_sequence("b", prompt) == 36
    assert [i for i, p in enumerate(s.page_table("b")) if p != -1] == [7, 8]
    assert len(m.page_table("b")) == 9  # the full group took exactly the same prefix
    run(m, "b", prompt[36:], chunk=7)
    m.check_integrity()


def test_no_hit_when_the_sliding_group_lost_the_window() -> None:
    m, a = _cached_then_reclaimed(16)
    held = m.allocator.num_free_pages
    assert m.add_sequence("b", np.concatenate([a, [7, 7, 7]])) == 0
    assert m.page_table("b") == [] and m.allocator.num_free_pages == held  # nothing taken
    m.check_integrity()


def test_a_reservation_the_sliding_group_cannot_hold_changes_no_group() -> None:
    m = hybrid(full=64, sliding=2)
    m.add_sequence("a")
    assert not m.can_append("a", 12)  # 3 pages: the full group could, the sliding one not
    with pytest.raises(OutOfPagesError):
        m.append_slots("a", np.arange(12))
    assert m.num_tokens("a") == 0 and sliding(m).num_tokens("a") == 0
    assert m.allocator.num_free_pages == 64
    m.check_integrity()
    assert m.can_append("a", 8)


@pytest.mark.parametrize("seed", range(6))
def test_random_workload_keeps_every_groups_invariants(seed: int) -> None:
    """Admissions with shared prefixes, chunks, take-backs and frees on small pools
    (so reservations fail and pages are reclaimed): every group stays consistent, a failed
    reservation changes nothing, and every page comes back."""
    rng = np.random.default_rng(seed)
    m = hybrid(full=40, sliding=12)
    base = rng.integers(0, 50, 64)
    live: list[int] = []
    next_id = hits = 0
    for _ in range(300):
        op = rng.integers(0, 4)
        if op == 0 or not live:
            prompt = np.concatenate([base[: rng.integers(0, 64)], rng.integers(0, 50, 6)])
            hit = m.add_sequence(next_id, prompt)
            hits += hit > 0
            assert hit % PS == 0 and hit < len(prompt)
            assert hit == sliding(m).num_tokens(next_id)
            try:  # the scheduler's admission: the rest of the prompt, or wait
                m.append_slots(next_id, prompt[hit:])
            except OutOfPagesError:
                m.free_sequence(next_id)
            else:
                m.commit_written(next_id)
                live.append(next_id)
            next_id += 1
        elif op in (1, 2):
            seq = live[rng.integers(len(live))]
            n = int(rng.integers(1, 9))
            before = [g.num_tokens(seq) for g in m.group_managers]
            tables = [g.page_table(seq) for g in m.group_managers]
            try:
                m.append_slots(seq, rng.integers(0, 50, n))
            except OutOfPagesError:
                assert [g.num_tokens(seq) for g in m.group_managers] == before
                # a failed reservation only trims what the window had left behind anyway
                for g, old in zip(m.group_managers, tables, strict=True):
                    new = g.page_table(seq)
                    assert len(new) == len(old)
                    assert all(a in (b, -1) for a, b in zip(new, old, strict=True))
            else:
                if rng.random() < 0.3:
                    m.unreserve(seq, before[0])
                else:
                    m.commit_written(seq)
        else:
            m.free_sequence(live.pop(int(rng.integers(len(live)))))
        m.check_integrity()
    for seq in live:
        m.free_sequence(seq)
    assert m.group_resident_pages() == (0, 0)
    m.check_integrity()
    assert hits > 10  # the workload did share prefixes
