"""CacheManager: page arithmetic, slot mapping, prefix sharing, window/sinks, policies."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pagedattn.cache import CacheManager, OutOfPagesError, hashing

NS = b"manager-test"


def write(m: CacheManager, seq: object, token_ids: Any) -> np.ndarray:
    """Reserve slots and commit them as written (what a successful step does)."""
    slots = m.append_slots(seq, token_ids)
    m.commit_written(seq)
    return slots


@pytest.mark.parametrize(
    ("length", "pages", "fill"),
    [(1, 1, 1), (15, 1, 15), (16, 1, 16), (17, 2, 1), (31, 2, 15), (32, 2, 16), (33, 3, 1)],
)
def test_page_arithmetic(length: int, pages: int, fill: int) -> None:
    m = CacheManager(8, 16, NS)
    m.add_sequence("s")
    slots = write(m, "s", np.arange(length))
    table = m.page_table("s")
    assert len(table) == pages
    assert int(slots[-1]) % 16 + 1 == fill
    assert int(slots[-1]) // 16 == table[-1]
    expected = [table[p // 16] * 16 + p % 16 for p in range(length)]
    assert slots.dtype == np.int64 and slots.tolist() == expected
    m.check_integrity()


def test_page_allocated_only_when_its_first_token_arrives() -> None:
    m = CacheManager(4, 4, NS)
    m.add_sequence(7)
    counts = []
    for t in range(9):
        write(m, 7, [t])
        counts.append(m.num_free_pages)
    assert counts == [3, 3, 3, 3, 2, 2, 2, 2, 1]
    assert m.num_tokens(7) == 9


def test_prefix_sharing_refcounts_and_o1_rehit() -> None:
    m = CacheManager(8, 16, NS)
    prompt = list(range(100, 140))  # 40 tokens: two full pages + 8
    assert m.add_sequence("a", prompt) == 0
    write(m, "a", prompt)
    assert m.add_sequence("b", prompt) == 32
    assert m.page_table("b") == m.page_table("a")[:2]
    shared = m.page_table("a")[:2]
    assert [m.allocator.refcount(p) for p in shared] == [2, 2]
    write(m, "b", prompt[32:])
    assert m.page_table("b")[2] != m.page_table("a")[2]
    assert (m.prefix_query_tokens, m.prefix_hit_tokens) == (80, 32)
    m.free_sequence("a")
    m.free_sequence("b")
    free = m.allocator.free_page_ids()
    assert set(shared) <= set(free)  # cached-free: still in the index
    assert all(m.allocator.cached_page(p) is not None for p in shared)
    assert m.add_sequence("c", prompt) == 32
    assert m.page_table("c") == shared
    assert not set(shared) & set(m.allocator.free_page_ids())  # left the free queue
    assert m.allocator.free_page_ids() == [p for p in free if p not in shared]
    m.check_integrity()


def test_fully_cached_prompt_leaves_last_token_uncached() -> None:
    m = CacheManager(8, 4, NS)
    prompt = list(range(8))
    m.add_sequence("a", prompt)
    write(m, "a", prompt)
    assert m.add_sequence("b", prompt) == 4
    assert write(m, "b", prompt[4:]).shape == (4,)
    m.check_integrity()


def test_page_reused_after_lru_never_serves_old_hash() -> None:
    m = CacheManager(2, 4, NS)
    m.add_sequence("a", [1, 2, 3, 4, 5])
    write(m, "a", [1, 2, 3, 4, 5])
    m.free_sequence("a")
    m.add_sequence("b")
    write(m, "b", [9] * 8)  # takes both pages; the cached one is evicted
    assert m.evictions["lru"] == 1
    m.free_sequence("b")
    assert m.add_sequence("c", [1, 2, 3, 4, 5]) == 0
    m.check_integrity()


def test_forced_collision_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hashing, "_digest", lambda data: b"\x07" * 16)
    m = CacheManager(4, 4, NS)
    m.add_sequence("a", [1, 2, 3, 4, 0])
    write(m, "a", [1, 2, 3, 4, 0])
    assert m.add_sequence("b", [5, 6, 7, 8, 0]) == 0  # same digest, different tokens
    assert m.add_sequence("c", [1, 2, 3, 4, 0]) == 4
    m.check_integrity()


def test_sliding_window_returns_pages_and_marks_minus_one() -> None:
    m = CacheManager(8, 4, NS, sliding_window=8, num_sink_tokens=2)
    m.add_sequence("s")
    tables = []
    for t in range(20):
        write(m, "s", [t])
        tables.append(m.page_table("s"))
    # page 0 holds the sinks and stays; page 1 (4..7) leaves at p=15, page 2 at p=19
    assert tables[14] == [0, 1, 2, 3]
    assert tables[15] == [0, -1, 2, 3]
    # the freed pages hold cached prefixes, so the empty page 4 is used before them
    assert tables[19] == [0, -1, -1, 3, 4]
    assert m.allocator.free_page_ids() == [5, 6, 7, 1, 2]
    assert m.evictions["sliding_window"] == 2
    m.check_integrity()


def test_policies_on_exhaustion() -> None:
    for policy in ("reclaim", "raise"):
        m = CacheManager(2, 4, NS, policy=policy)  # type: ignore[arg-type]
        m.add_sequence("a", [1, 2, 3, 4, 5])
        write(m, "a", [1, 2, 3, 4, 5])
        m.free_sequence("a")
        m.add_sequence("b")
        if policy == "raise":
            write(m, "b", [0])  # the empty page
            assert not m.can_append("b", 4)
            with pytest.raises(OutOfPagesError):
                write(m, "b", [0] * 4)
            assert m.num_tokens("b") == 1
        else:
            write(m, "b", [0] * 8)
            assert m.evictions["lru"] == 1
        m.check_integrity()


def test_evict_idle_takes_lru_page_of_least_recently_used_other_sequence() -> None:
    m = CacheManager(4, 2, NS, policy="evict_idle", num_sink_tokens=1)
    for s in ("x", "y"):
        m.add_sequence(s)
        write(m, s, [1, 2, 3, 4])
    assert m.num_free_pages == 0
    assert m.can_append("y", 1) is False
    write(m, "y", [5])  # x is idle and least recently used: its page 1 goes
    assert m.page_table("x") == [0, -1]
    # the dropped page held a cached prefix, so reusing it also drops its hash entry
    assert m.evictions == {"lru": 1, "sliding_window": 0, "lossy": 1}
    with pytest.raises(OutOfPagesError):
        write(m, "y", [6, 7])  # x keeps only its sink page, y is the writer
    m.check_integrity()


def test_page_tables_padding_and_errors() -> None:
    m = CacheManager(8, 4, NS)
    m.add_sequence("a")
    m.add_sequence("b")
    write(m, "a", list(range(9)))
    write(m, "b", [1])
    pt = m.page_tables(["a", "b"])
    assert pt.dtype == np.int32 and pt.tolist() == [[0, 1, 2], [3, -1, -1]]
    assert m.page_tables(["b"], max_pages=2).tolist() == [[3, -1]]
    with pytest.raises(ValueError, match="max_pages"):
        m.page_tables(["a"], max_pages=2)
    with pytest.raises(KeyError):
        m.page_table("zzz")
    with pytest.raises(ValueError, match="already exists"):
        m.add_sequence("a")
    with pytest.raises(ValueError, match="integer"):
        write(m, "a", [1.5])


def test_can_append_skips_pages_already_dropped_inside_the_trim_range() -> None:
    m = CacheManager(4, 4, NS, sliding_window=9, enable_prefix_caching=False)
    m.add_sequence("s")
    write(m, "s", list(range(12)))  # one chunk: nothing trimmed yet
    assert m.evict_oldest_page("s") == 0  # lossy hole inside the range the window will trim
    assert m.can_append("s", 1) is True
    write(m, "s", [12])
    assert m.page_table("s") == [-1, 1, 2, 0]
    assert m.evictions == {"lru": 0, "sliding_window": 0, "lossy": 1}
    m.check_integrity()


def test_a_failed_steps_registered_pages_are_taken_back_when_freed() -> None:
    m = CacheManager(16, 4, NS)
    prompt = list(range(10, 23))  # 13 tokens: three full pages + 1
    m.add_sequence("a", prompt)
    m.append_slots("a", prompt[:9])  # a step reserves two full pages ...
    assert m.allocator.num_cached_pages == 2  # ... shareable within that step
    assert not any(m.allocator.is_written(p) for p in m.page_table("a"))
    m.check_integrity(between_steps=False)
    with pytest.raises(AssertionError, match="never committed as written"):
        m.check_integrity()  # between steps a registered page must be written
    assert m.add_sequence("b", prompt) == 8  # same step: b shares them
    m.free_sequence("b")
    m.free_sequence("a")  # ... then the forward failed: a is freed without a commit
    assert m.allocator.num_cached_pages == 0 and m.num_free_pages == 16
    m.check_integrity()
    assert m.add_sequence("c", prompt) == 0  # nothing unwritten is ever served
    m.append_slots("c", prompt[:9])
    assert m.commit_written("c", 6) == m.page_table("c")[:1]  # one page full of written KV
    assert m.commit_written("c") == m.page_table("c")[1:2]
    m.append_slots("c", prompt[9:])
    assert m.commit_written("c") == m.page_table("c")[2:3]
    m.free_sequence("c")
    assert m.add_sequence("d", prompt) == 12  # committed pages outlive their sequence
    with pytest.raises(ValueError, match="num_tokens"):
        m.commit_written("d", 3)  # below what is already written
    m.check_integrity()


def test_check_integrity_tells_a_registered_page_from_a_written_one() -> None:
    m = CacheManager(8, 4, NS)
    m.add_sequence("a", list(range(8)))
    write(m, "a", list(range(8)))
    m.check_integrity()
    page = m.page_table("a")[1]
    m.allocator.unregister(page)  # re-enter it behind the manager's back, unwritten
    m.allocator.register(page, hashing.hash_page_tokens(None, [9] * 4, NS), None, [9] * 4, None)
    with pytest.raises(AssertionError, match="never committed as written"):
        m.check_integrity()
    m.allocator.release(page)  # a free page in the index that was never written
    with pytest.raises(AssertionError, match="never written"):
        m.allocator.check_integrity()
