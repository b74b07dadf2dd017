"""PageAllocator: O(1) LRU free queue, refcounts, double-free errors, prefix index checks."""

from __future__ import annotations

import pytest

from pagedattn.cache import hashing
from pagedattn.cache.allocator import OutOfPagesError, PageAllocator
from pagedattn.cache.free_queue import FreeQueue
from pagedattn.cache.hashing import hash_page_tokens

NS = b"test-namespace"


def _register(alloc: PageAllocator, page: int, tokens: list[int]) -> int | None:
    """Register a page and mark its KV written (what a step that succeeded does)."""
    serial = alloc.register(page, hash_page_tokens(None, tokens, NS), None, tokens, None)
    if alloc.cached_page(page) is not None:
        alloc.mark_written(page)
    return serial


def test_free_queue_removes_from_the_middle_in_order() -> None:
    q = FreeQueue(5, range(5))
    q.remove(2)
    q.push_back(2)
    front = q.peek_front()
    q.remove(front)
    q.push_front(front)  # take 0 out, put it back at the front
    q.remove(3)
    assert list(q) == [0, 1, 4, 2]
    assert list(q.iter_reversed()) == [2, 4, 1, 0]
    with pytest.raises(ValueError, match="already in the free queue"):
        q.push_back(1)
    with pytest.raises(ValueError, match="not in the free queue"):
        q.remove(3)
    q.check_integrity()


def test_allocate_release_and_errors() -> None:
    alloc = PageAllocator(3, NS)
    assert [alloc.allocate() for _ in range(3)] == [0, 1, 2]
    with pytest.raises(OutOfPagesError):
        alloc.allocate()
    assert issubclass(OutOfPagesError, RuntimeError)
    alloc.touch(1)  # shared by two owners
    with pytest.raises(ValueError, match="1 other reference"):
        alloc.free(1)
    assert alloc.release(1) is False
    alloc.free(1)
    with pytest.raises(ValueError, match="double free"):
        alloc.release(1)
    with pytest.raises(ValueError, match="double free"):
        alloc.free(1)
    with pytest.raises(ValueError, match="no cached prefix"):
        alloc.touch(1)
    assert alloc.allocate() == 1
    alloc.check_integrity(expected_refcounts=[1, 1, 1])


def test_cached_pages_evicted_lru_after_empty_pages() -> None:
    alloc = PageAllocator(4, NS)
    pages = [alloc.allocate() for _ in range(4)]
    for p in pages[:3]:
        assert _register(alloc, p, [p, p, p]) is not None
    for p in pages:  # release 0, 1, 2 (cached) then 3 (empty)
        alloc.release(p)
    assert alloc.free_page_ids() == [3, 0, 1, 2]
    assert alloc.num_allocatable(reclaim_cached=False) == 1
    # a hit on page 1 takes it out of the middle of the queue
    hit = alloc.lookup(hash_page_tokens(None, [1, 1, 1], NS), [1, 1, 1], None)
    assert hit is not None and alloc.page_of(hit.page_hash) == 1
    alloc.touch(1)
    assert alloc.free_page_ids() == [3, 0, 2]
    assert alloc.allocate(reclaim_cached=False) == 3  # empty page first, no eviction
    with pytest.raises(OutOfPagesError, match="cached"):
        alloc.allocate(reclaim_cached=False)
    assert alloc.num_lru_evictions == 0
    assert alloc.allocate() == 0  # least recently used cached page, hash dropped
    assert alloc.num_lru_evictions == 1
    assert alloc.cached_page(0) is None
    assert alloc.lookup(hash_page_tokens(None, [0, 0, 0], NS), [0, 0, 0], None) is None
    alloc.check_integrity(expected_refcounts=[1, 1, 0, 1])


def test_reused_page_never_serves_its_old_hash() -> None:
    alloc = PageAllocator(1, NS)
    page = alloc.allocate()
    old = hash_page_tokens(None, [5, 6], NS)
    alloc.register(page, old, None, [5, 6], None)
    alloc.release(page)
    assert alloc.allocate() == page  # LRU eviction of the cached page
    assert alloc.lookup(old, [5, 6], None) is None
    alloc.register(page, hash_page_tokens(None, [7, 8], NS), None, [7, 8], None)
    assert alloc.lookup(old, [5, 6], None) is None
    alloc.check_integrity()


def test_forced_collision_is_rejected_by_token_compare(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hashing, "_digest", lambda data: b"\x01" * 16)
    alloc = PageAllocator(2, NS)
    a, b = alloc.allocate(), alloc.allocate()
    h = hash_page_tokens(None, [1, 2], NS)
    assert h == hash_page_tokens(None, [3, 4], NS)  # the collision is real
    assert alloc.register(a, h, None, [1, 2], None) == 0
    assert alloc.register(b, h, None, [3, 4], None) is None  # not entered
    assert alloc.lookup(h, [3, 4], None) is None
    assert alloc.lookup(h, [1, 2], None) is not None
    assert alloc.lookup(h, [1, 2], 7) is None  # wrong parent
    alloc.check_integrity()


def test_check_integrity_detects_corruption() -> None:
    alloc = PageAllocator(2, NS)
    page = alloc.allocate()
    _register(alloc, page, [9, 9])
    alloc.check_integrity()
    record = alloc.cached_page(page)
    assert record is not None
    object.__setattr__(record, "token_ids", (9, 8))
    with pytest.raises(AssertionError, match="do not hash"):
        alloc.check_integrity()
    with pytest.raises(AssertionError, match="refcounts"):
        alloc.check_integrity(expected_refcounts=[2, 0])


def test_reset_prefix_cache_empties_an_idle_pool_and_refuses_a_held_page() -> None:
    alloc = PageAllocator(4, NS)
    pages = [alloc.allocate() for _ in range(3)]
    for p in pages:
        _register(alloc, p, [p, p])
    with pytest.raises(ValueError, match="3 page"):
        alloc.reset_prefix_cache()
    assert alloc.num_cached_pages == 3  # refused: nothing changed
    for p in pages:
        alloc.release(p)
    assert alloc.num_allocatable(reclaim_cached=False) == 1
    assert alloc.reset_prefix_cache() == 3
    assert alloc.num_cached_pages == 0 and alloc.num_allocatable(reclaim_cached=False) == 4
    assert alloc.lookup(hash_page_tokens(None, [1, 1], NS), [1, 1], None) is None
    assert alloc.free_page_ids() == [0, 1, 2, 3]
    alloc.check_integrity(expected_refcounts=[0, 0, 0, 0])
