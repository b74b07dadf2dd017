"""FreeQueue: doubly linked list of free page ids with O(1) pop, push and removal.

The same structure as vLLM v1's ``FreeKVCacheBlockQueue`` (``vllm/v1/core/kv_cache_utils.py``):
the head is the least recently used end (next page handed out), the tail the most recently
freed. Links are kept in two integer lists indexed by page id, with two sentinel nodes, so a
cached page that gets a prefix hit leaves the queue in O(1) from wherever it sits.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice

_NONE = -1


class FreeQueue:
    """Doubly linked queue over page ids ``0 .. num_pages - 1``.

    Args:
        num_pages: capacity (> 0).
        initial: page ids to enqueue head-to-tail at construction (default: none).

    Raises:
        ValueError: a page id out of range or already queued (for every mutating method).
    """

    def __init__(self, num_pages: int, initial: range | list[int] | None = None) -> None:
        if num_pages < 1:
            raise ValueError(f"num_pages must be >= 1, got {num_pages}")
        self.num_pages = num_pages
        self._head = num_pages  # sentinel before the LRU end
        self._tail = num_pages + 1  # sentinel after the MRU end
        self._prev = [_NONE] * (num_pages + 2)
        self._next = [_NONE] * (num_pages + 2)
        self._next[self._head] = self._tail
        self._prev[self._tail] = self._head
        self._queued = [False] * num_pages
        self._len = 0
        for page_id in initial or ():
            self.push_back(page_id)

    def __len__(self) -> int:
        return self._len

    def __contains__(self, page_id: object) -> bool:
        return isinstance(page_id, int) and 0 <= page_id < self.num_pages and self._queued[page_id]

    def __iter__(self) -> Iterator[int]:
        """Page ids from the LRU end (head) to the MRU end (tail)."""
        node = self._next[self._head]
        while node != self._tail:
            yield node
            node = self._next[node]

    def iter_reversed(self) -> Iterator[int]:
        """Page ids from the MRU end (tail) to the LRU end (head)."""
        node = self._prev[self._tail]
        while node != self._head:
            yield node
            node = self._prev[node]

    def peek_front(self) -> int:
        """The LRU page id without removing it. Raises IndexError when empty."""
        if not self._len:
            raise IndexError("peek_front on an empty FreeQueue")
        return self._next[self._head]

    def push_back(self, page_id: int) -> None:
        """Enqueue at the MRU end (evicted last)."""
        self._insert(page_id, self._prev[self._tail], self._tail)

    def push_front(self, page_id: int) -> None:
        """Enqueue at the LRU end (handed out next)."""
        self._insert(page_id, self._head, self._next[self._head])

    def remove(self, page_id: int) -> None:
        """Unlink ``page_id`` from wherever it is, O(1). Raises ValueError if not queued."""
        if page_id not in self:
            raise ValueError(f"page {page_id} is not in the free queue")
        before, after = self._prev[page_id], self._next[page_id]
        self._next[before] = after
        self._prev[after] = before
        self._prev[page_id] = self._next[page_id] = _NONE
        self._queued[page_id] = False
        self._len -= 1

    def _insert(self, page_id: int, before: int, after: int) -> None:
        if not 0 <= page_id < self.num_pages:
            raise ValueError(f"page_id must be in [0, {self.num_pages}), got {page_id}")
        if self._queued[page_id]:
            raise ValueError(f"page {page_id} is already in the free queue")
        self._next[before] = page_id
        self._prev[page_id] = before
        self._next[page_id] = after
        self._prev[after] = page_id
        self._queued[page_id] = True
        self._len += 1

    def check_integrity(self) -> None:
        """Walk both directions; raise AssertionError on a broken link, duplicate or bad length."""
        limit = self.num_pages + 1  # a cycle must not hang the check
        forward = list(islice(self, limit))
        backward = list(islice(self.iter_reversed(), limit))
        if forward != backward[::-1]:
            raise AssertionError("free queue: forward and backward walks differ")
        if len(forward) != self._len or len(set(forward)) != len(forward):
            raise AssertionError(
                f"free queue: {len(forward)} nodes ({len(set(forward))} distinct), len {self._len}"
            )
        queued = {p for p in range(self.num_pages) if self._queued[p]}
        if queued != set(forward):
            raise AssertionError("free queue: membership flags disagree with the links")
