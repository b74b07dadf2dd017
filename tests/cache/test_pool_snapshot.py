"""pool_snapshot: each page's state and the tables asked for, checked against states worked
out by hand from the operations applied."""

from __future__ import annotations

import pytest

from pagedattn.cache import CacheManager
from pagedattn.cache.pool_snapshot import PAGE_STATES, pool_snapshot

NS = b"snapshot-test"


def states(m: CacheManager) -> list[str]:
    return [PAGE_STATES[code] for code in pool_snapshot(m, []).page_states]


def test_free_used_shared_and_cached_pages() -> None:
    m = CacheManager(8, 4, NS)
    assert states(m) == ["free"] * 8
    prompt = list(range(10, 20))  # 10 tokens: two full pages and 2 tokens
    m.add_sequence("a", prompt)
    m.append_slots("a", prompt)
    m.commit_written("a")
    a = m.page_table("a")
    assert len(a) == 3
    expected = ["free"] * 8
    for page in a:
        expected[page] = "used"
    assert states(m) == expected

    assert m.add_sequence("b", prompt) == 8  # the two full pages hit
    for page in a[:2]:
        expected[page] = "shared"
    assert states(m) == expected

    snap = pool_snapshot(m, ["b", "missing", "a"], max_table=2)
    assert (snap.num_pages, snap.page_size, snap.num_registered) == (8, 4, 2)
    assert [t.seq_id for t in snap.tables] == ["b", "a"]
    b_table, a_table = snap.tables
    assert (b_table.num_tokens, b_table.num_written_tokens, b_table.num_pages) == (8, 8, 2)
    assert b_table.pages == tuple(a[:2])
    assert (a_table.num_tokens, a_table.num_pages, a_table.pages) == (10, 3, tuple(a[:2]))

    m.free_sequence("b")
    m.free_sequence("a")
    # the registered full pages stay in the LRU as cached prefixes; the partial page is free
    expected = ["free"] * 8
    expected[a[0]] = expected[a[1]] = "cached"
    assert states(m) == expected
    assert pool_snapshot(m, ["a"]).tables == ()


def test_negative_table_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="max_table"):
        pool_snapshot(CacheManager(2, 4, NS), [], max_table=-1)
