"""Paged KV cache: storage (PagePool), allocation (PageAllocator), page tables (CacheManager).

``PagePool`` is imported on first use: it brings in the kernels (Numba), which a front end that
only hashes prompts or reads snapshots never needs.
"""

from typing import TYPE_CHECKING, Any

from pagedattn.cache.allocator import OutOfPagesError, PageAllocator
from pagedattn.cache.eviction import EVICTION_POLICIES, EVICTION_REASONS
from pagedattn.cache.hashing import cache_namespace, hash_page_tokens, prefix_page_hashes
from pagedattn.cache.manager import CacheManager
from pagedattn.cache.prefix_index import CachedPage

if TYPE_CHECKING:
    from pagedattn.cache.page_pool import PagePool

__all__ = [
    "EVICTION_POLICIES",
    "EVICTION_REASONS",
    "CacheManager",
    "CachedPage",
    "OutOfPagesError",
    "PageAllocator",
    "PagePool",
    "cache_namespace",
    "hash_page_tokens",
    "prefix_page_hashes",
]


def __getattr__(name: str) -> Any:
    if name == "PagePool":
        from pagedattn.cache.page_pool import PagePool

        return PagePool
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
