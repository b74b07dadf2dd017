"""Hypothesis state machine over CacheManager: every operation keeps every invariant.

A shadow KV pool stores each token's id at its slot, so the test also proves that every
resident entry of every page table (prefix hits included) holds exactly that
sequence's tokens: no aliasing, no stale page served.
"""

from __future__ import annotations

import contextlib

import numpy as np
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pagedattn.cache import CacheManager, OutOfPagesError
from pagedattn.cache.page_pool import PagePool

PAGE_SIZE = 4
NUM_PAGES = 12
CONFIGS = [
    {"sliding_window": None, "num_sink_tokens": 0, "policy": "reclaim"},
    {"sliding_window": None, "num_sink_tokens": 0, "policy": "raise"},
    {"sliding_window": 6, "num_sink_tokens": 2, "policy": "evict_idle"},
    {"sliding_window": 9, "num_sink_tokens": 0, "policy": "reclaim"},
]
# few distinct prompts so prefix hits happen often
PROMPTS = st.sampled_from([[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 7, 7, 7, 7], [5] * 13, [2]])


class CacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tokens: dict[int, list[int]] = {}
        self.next_id = 0

    @initialize(config=st.sampled_from(CONFIGS))
    def setup(self, config: dict) -> None:
        self.m = CacheManager(NUM_PAGES, PAGE_SIZE, b"ns", **config)
        self.pool = PagePool(1, NUM_PAGES, 1, PAGE_SIZE, 1)
        self.flat = self.pool.k_cache(0).reshape(-1)

    def _write(self, seq: int, new: list[int]) -> None:
        predicted = self.m.can_append(seq, len(new))
        try:
            slots = self.m.append_slots(seq, new)
        except OutOfPagesError:
            assert not predicted
            return
        # can_append is exact, except that "evict_idle" may still succeed by lossy eviction
        assert predicted or self.m.policy == "evict_idle"
        assert slots.shape == (len(new),) and slots.dtype == np.int64
        self.flat[slots] = new
        self.m.commit_written(seq)
        self.tokens[seq].extend(new)

    @rule(prompt=PROMPTS)
    def add(self, prompt: list[int]) -> None:
        seq, self.next_id = self.next_id, self.next_id + 1
        before = (self.m.prefix_query_tokens, self.m.prefix_hit_tokens)
        cached = self.m.add_sequence(seq, prompt)
        assert cached % PAGE_SIZE == 0 and 0 <= cached < len(prompt)
        assert self.m.prefix_query_tokens == before[0] + len(prompt)
        assert self.m.prefix_hit_tokens == before[1] + cached
        self.tokens[seq] = list(prompt[:cached])
        self._write(seq, prompt[cached:])

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), new=st.lists(st.integers(0, 9), min_size=1, max_size=6))
    def append(self, data: st.DataObject, new: list[int]) -> None:
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        self._write(seq, new)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        self.m.free_sequence(seq)
        del self.tokens[seq]

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), new=st.lists(st.integers(0, 9), min_size=1, max_size=9))
    def failed_write(self, data: st.DataObject, new: list[int]) -> None:
        """A step reserves slots, its forward fails before writing them, the sequence is
        freed: no later prefix hit may serve those pages (contents_match would see it)."""
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        with contextlib.suppress(OutOfPagesError):
            self.m.append_slots(seq, new)
            self.m.check_integrity(between_steps=False)
        self.m.free_sequence(seq)
        del self.tokens[seq]

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def evict(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        with contextlib.suppress(OutOfPagesError):
            self.m.evict_oldest_page(seq)

    @invariant()
    def integrity(self) -> None:
        if not hasattr(self, "m"):
            return
        self.m.check_integrity()
        used = {p for s in self.tokens for p in self.m.page_table(s) if p != -1}
        alloc = self.m.allocator
        assert alloc.num_free_pages == NUM_PAGES - len(used)
        reclaim = self.m.policy != "raise"
        assert self.m.num_free_pages == alloc.num_allocatable(reclaim_cached=reclaim)

    @invariant()
    def contents_match(self) -> None:
        if not hasattr(self, "m"):
            return
        for seq, toks in self.tokens.items():
            assert self.m.num_tokens(seq) == len(toks)
            table = self.m.page_table(seq)
            for pos, tok in enumerate(toks):
                page = table[pos // PAGE_SIZE]
                if page != -1:
                    assert self.flat[page * PAGE_SIZE + pos % PAGE_SIZE] == tok, (seq, pos)


TestCacheMachine = CacheMachine.TestCase
