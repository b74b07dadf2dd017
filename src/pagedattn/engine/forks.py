"""Forks: a request's other completions (``n`` / ``best_of`` > 1) start from its parent's pages
once the parent sampled its first token.

A child shares the parent's full pages by reference count and gets a copy of the parent's
partially filled last page (``CacheManager.fork``). The copy is applied at once, in the step
that forks: the source page holds KV the step's forward just wrote, and the destination page
is the child's alone. A copy never waits for a later step, so no page can be freed, reused or
restored from the persistent tier between the moment a copy is decided and the moment it lands.
A child that finds no page for its copy waits and is recomputed like a preempted sequence
(its prompt's full pages are prefix-cache hits).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from pagedattn.cache import CacheManager, OutOfPagesError
from pagedattn.engine.sequence import Sequence, SequenceStatus

#: Applies ``(src_page, dst_page)`` KV copies to the page pool (:meth:`PagePool.copy_pages`).
CopyPages = Callable[[Iterable[tuple[int, int]]], None]


@dataclass
class Forked:
    """The outcome of :func:`fork_children`.

    Attributes:
        running: children that hold pages now (their KV equals the parent's), in index order.
        waiting: children that found no page for their copy (status WAITING, nothing computed).
    """

    running: list[Sequence] = field(default_factory=list)
    waiting: list[Sequence] = field(default_factory=list)


def fork_children(
    parent: Sequence, children: list[Sequence], cache: CacheManager, copy_pages: CopyPages
) -> Forked:
    """Start ``children`` from ``parent``'s pages and KV, copy-on-write applied now.

    Called after the step's KV was committed (the parent's last page holds what the forward
    wrote) and before the parent appends its sampled token or can be freed.

    Raises:
        Whatever ``copy_pages`` raises: every child forked by this call is freed again first
        and all of them are left WAITING with nothing computed (no page leaks).
    """
    out = Forked()
    try:
        for child in children:
            try:
                copies = cache.fork(parent.seq_id, child.seq_id)
            except OutOfPagesError:
                child.num_computed_tokens = 0
                child.status = SequenceStatus.WAITING
                out.waiting.append(child)
                continue
            out.running.append(child)
            if copies:
                copy_pages(copies)
            child.num_computed_tokens = parent.num_computed_tokens
            child.num_cached_tokens = parent.num_cached_tokens
            child.status = SequenceStatus.RUNNING
    except BaseException:
        for child in out.running:
            cache.free_sequence(child.seq_id)
            child.num_computed_tokens = 0
            child.status = SequenceStatus.WAITING
        raise
    return out
