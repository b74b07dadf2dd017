"""Paged KV cache: storage (PagePool), allocation (PageAllocator), page tables (CacheManager)."""

from pagedattn.cache.allocator import OutOfPagesError, PageAllocator
from pagedattn.cache.eviction import EVICTION_POLICIES, EVICTION_REASONS
from pagedattn.cache.hashing import cache_namespace, hash_page_tokens, prefix_page_hashes
from pagedattn.cache.manager import CacheManager
from pagedattn.cache.page_pool import PagePool
from pagedattn.cache.prefix_index import CachedPage

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
