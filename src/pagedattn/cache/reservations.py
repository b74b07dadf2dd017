"""Reserved is not written: the pages a sequence registered in the prefix index before the
forward that fills them ran, and how they become written or are taken back.

:meth:`CacheManager.append_slots` hands out slots and registers the pages that became full so
that requests admitted in the same step can share them (the forward writes every layer's KV
before any attention reads it). :func:`commit_written`, invoked once the forward that wrote
those slots succeeded, marks them written. :func:`unreserve` takes back a step's reservation
that never ran, and a sequence freed with registered pages that were never committed (its step
failed) takes those entries back out of the index first (:func:`unregister_unwritten`): a later
request can never be served KV that was not computed.
"""

from __future__ import annotations

from pagedattn.cache.allocator import PageAllocator
from pagedattn.cache.sequence_pages import SequencePages


def registered_here(seq: SequencePages, index: int, allocator: PageAllocator) -> bool:
    """The page at ``index`` is in the index under this sequence's own entry, not written yet
    (not a page it got from a prefix hit, which is written already)."""
    record = allocator.cached_page(seq.page_table[index])
    return (
        record is not None
        and index < len(seq.serials)
        and record.serial == seq.serials[index]
        and not allocator.is_written(seq.page_table[index])
    )


def check_reserved_range(seq: SequencePages, num_tokens: int) -> None:
    """Raises ValueError unless ``num_written_tokens <= num_tokens <= num_tokens reserved``."""
    if not seq.num_written_tokens <= num_tokens <= seq.num_tokens:
        raise ValueError(
            f"num_tokens: expected {seq.num_written_tokens} <= n <= {seq.num_tokens}, "
            f"got {num_tokens}"
        )


def commit_written(
    seq: SequencePages, upto: int, allocator: PageAllocator, page_size: int
) -> list[int]:
    """Mark the sequence's tokens up to ``upto`` written (a checked range): the pages it
    registered that are now full of written tokens are marked written in the allocator.

    Returns:
        Those page ids, in position order.
    """
    check_reserved_range(seq, upto)
    first = seq.num_written_tokens // page_size
    seq.num_written_tokens = upto
    written: list[int] = []
    for i in range(first, upto // page_size):
        page_id = seq.page_table[i]
        if page_id != -1 and registered_here(seq, i, allocator):
            allocator.mark_written(page_id)
            written.append(page_id)
    return written


def unreserve(
    seq: SequencePages,
    num_tokens: int,
    allocator: PageAllocator,
    page_size: int,
    prefix_caching: bool,
) -> None:
    """Take back the slots reserved past ``num_tokens`` (a checked range): pages registered
    past it leave the prefix index, pages past the new last page go back to the pool."""
    check_reserved_range(seq, num_tokens)
    ps, keep = page_size, -(-num_tokens // page_size)
    for i in range(num_tokens // ps, len(seq.page_table)):
        if seq.page_table[i] != -1 and registered_here(seq, i, allocator):
            allocator.unregister(seq.page_table[i])  # reserved, never written
    for page_id in reversed(seq.page_table[keep:]):
        if page_id != -1:
            allocator.release(page_id)
    del seq.page_table[keep:]
    seq.num_tokens = num_tokens
    if prefix_caching:
        del seq.token_ids[num_tokens:]
        del seq.page_hashes[num_tokens // ps :]
        del seq.serials[num_tokens // ps :]


def unregister_unwritten(seq: SequencePages, allocator: PageAllocator, page_size: int) -> None:
    """Take the pages the sequence registered but never committed out of the prefix index
    (before the sequence is freed)."""
    for i in range(seq.num_written_tokens // page_size, len(seq.page_table)):
        if seq.page_table[i] != -1 and registered_here(seq, i, allocator):
            allocator.unregister(seq.page_table[i])  # registered, never written
