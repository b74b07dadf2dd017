"""The engine's KV cache managers: one set of page tables for every layer, or (a model mixing
full-attention and sliding-window layers) one per layer group (:mod:`pagedattn.cache.layer_groups`,
:class:`pagedattn.cache.hybrid_manager.HybridCacheManager`), and how the pool's pages are
shared between the groups."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pagedattn.cache import CacheManager, PagePool
from pagedattn.cache.group_pool import GroupPages
from pagedattn.cache.hybrid_manager import HybridCacheManager, group_namespace
from pagedattn.cache.layer_groups import LayerGroup, effective_window, group_of_layers, layer_groups
from pagedattn.cache.tier_pages import PageTier
from pagedattn.config import EngineConfig, ModelConfig

if TYPE_CHECKING:
    from pagedattn.storage import KVTier


@dataclass(frozen=True)
class KVLayout:
    """The cache manager an engine uses and the pool it needs.

    Attributes:
        manager: the page tables (a :class:`HybridCacheManager` with layer groups).
        pool_pages: page ids of the pool (every group's together).
        layer_groups: the group of each layer, None without layer groups.
        groups: the layer groups (one group of every layer without them).
    """

    manager: CacheManager
    pool_pages: int
    layer_groups: tuple[int, ...] | None
    groups: tuple[LayerGroup, ...]


def hybrid_groups(
    config: EngineConfig, mc: ModelConfig, has_store: bool = False
) -> tuple[LayerGroup, ...] | None:
    """The model's layer groups when the engine keeps pages per group, else None
    (``has_store``: the engine is handed a persistent tier's store). Only the numpy backend
    keeps pages per group: its pool's memory becomes resident as it is written, so a page id's
    rows in the other groups' layers cost nothing; another backend's pool is allocated whole.

    Raises:
        ValueError: an option the hybrid KV cache cannot honour, naming it and
            ``--disable-hybrid-kv-cache-manager``; ``--position-mode shifted`` on a model with
            sliding-window layers (in-cache positions are defined for one window).
    """
    groups = layer_groups(mc.num_layers, mc.layer_windows)
    cc = config.cache
    if not any(g.window for g in groups):
        return None
    if cc.position_mode == "shifted":
        raise ValueError(
            f"--position-mode shifted with --sliding-window {cc.sliding_window}: positions "
            f"counted inside one window have no meaning on a model whose layers keep their own "
            f"sliding windows ({sorted({g.window for g in groups if g.window})}); use "
            f"--position-mode absolute"
        )
    if len(groups) < 2 or cc.disable_hybrid_kv_cache_manager:
        return None
    if config.backend != "numpy":
        return None  # its pool is allocated whole: a group's unused rows would cost memory
    if has_store:
        raise ValueError(
            "kv_store: a store handed to the engine holds pages of every layer; pass a "
            "--kv-store path or URL (opened per layer group), or "
            "--disable-hybrid-kv-cache-manager"
        )
    return groups


def group_page_counts(
    num_pages: int, groups: tuple[LayerGroup, ...], config: EngineConfig
) -> tuple[int, ...]:
    """Pages of each group from a budget of ``num_pages`` pages of every layer: a sliding group
    gets what ``max_num_seqs`` sequences can hold inside its window (at most ``num_pages``),
    the full-attention group the rest of the budget's page-layers."""
    cc, sc = config.cache, config.scheduler
    ps = cc.page_size
    chunk = sc.prefill_chunk_size if sc.enable_chunked_prefill else sc.max_num_batched_tokens
    chunk += sc.num_speculative_tokens if sc.speculative else 0
    sink_pages = -(-cc.num_sink_tokens // ps)
    counts = [0]
    for group in groups[1:]:
        w = effective_window(cc.sliding_window, group.window)
        assert w is not None  # groups after the first have a window
        per_seq = sink_pages + -(-(w + chunk) // ps) + 1
        counts.append(min(num_pages, sc.max_num_seqs * per_seq))
    num_layers = sum(len(g.layers) for g in groups)
    rest = num_pages * num_layers - sum(
        c * len(g.layers) for c, g in zip(counts[1:], groups[1:], strict=True)
    )
    counts[0] = max(num_pages, rest // len(groups[0].layers))
    return tuple(counts)


def kv_layout(
    config: EngineConfig, mc: ModelConfig, groups: tuple[LayerGroup, ...] | None,
    num_pages: int, namespace: bytes, tier: PageTier | None,
    group_tiers: Sequence[PageTier] | None = None,
) -> KVLayout:  # fmt: skip
    """The engine's cache manager over a budget of ``num_pages`` pages of every layer, per
    layer group when ``groups`` (:func:`hybrid_groups`) is not None (then with
    ``group_tiers``, one per group, instead of ``tier``)."""
    cc = config.cache
    if groups is None:
        manager = CacheManager(
            num_pages, cc.page_size, namespace, sliding_window=cc.sliding_window,
            num_sink_tokens=cc.num_sink_tokens, enable_prefix_caching=cc.enable_prefix_caching,
            tier=tier,
        )  # fmt: skip
        every = (LayerGroup(cc.sliding_window, tuple(range(mc.num_layers))),)
        return KVLayout(manager, num_pages, None, every)
    counts = group_page_counts(num_pages, groups, config)
    hybrid = HybridCacheManager(
        groups, counts, cc.page_size, namespace, sliding_window=cc.sliding_window,
        num_sink_tokens=cc.num_sink_tokens, enable_prefix_caching=cc.enable_prefix_caching,
        tiers=group_tiers,
    )  # fmt: skip
    return KVLayout(hybrid, sum(counts), group_of_layers(groups, mc.num_layers), groups)


def group_usage(layout: KVLayout, pool: PagePool) -> list[dict[str, Any]]:
    """Each layer group's pages now: ``name`` (``"full"`` or ``"sliding_W"``), ``window``
    (None: full attention), ``num_layers``, ``num_pages`` (the group's share of the pool),
    ``resident_pages`` (referenced by a sequence) and ``resident_bytes`` (those pages' K and V
    in the group's layers)."""
    manager = layout.manager
    managers = manager.group_managers if isinstance(manager, HybridCacheManager) else (manager,)
    page_layer_bytes = pool.nbytes // (pool.num_layers * pool.num_pages)
    out = []
    for group, m in zip(layout.groups, managers, strict=True):
        held = m.num_pages - m.allocator.num_free_pages
        out.append(
            {
                "name": "full" if group.window is None else f"sliding_{group.window}",
                "window": group.window,
                "num_layers": len(group.layers),
                "num_pages": m.num_pages,
                "resident_pages": held,
                "resident_bytes": held * page_layer_bytes * len(group.layers),
            }
        )
    return out


def open_group_tiers(
    config: EngineConfig,
    namespace: bytes,
    pool: PagePool,
    groups: tuple[LayerGroup, ...],
    counts: Sequence[int],
) -> list[KVTier] | None:
    """One persistent tier per layer group over ``config.kv_store`` (None when unset): each
    group's records hold its own layers under its own namespace
    (:func:`pagedattn.cache.hybrid_manager.group_namespace`).

    Raises:
        ValueError: a store without prefix caching, or one that cannot be opened.
    """
    if config.kv_store is None:
        return None
    cc = config.cache
    if not cc.enable_prefix_caching:
        raise ValueError("kv_store: needs prefix caching (pages are named by prefix hash)")
    from pagedattn.storage import KVTier, open_store

    tiers: list[KVTier] = []
    base = 0
    try:
        for g, (group, n) in enumerate(zip(groups, counts, strict=True)):
            view = GroupPages(pool, group.layers, base, n)
            ns = group_namespace(namespace, g, effective_window(cc.sliding_window, group.window))
            store = open_store(
                config.kv_store, ns, view.page_shape, pool.dtype, key=config.kv_store_key
            )
            tiers.append(KVTier(store, view, lookup_deadline_s=config.kv_store_deadline_s))
            base += n
    except BaseException:
        for tier in tiers:
            tier.close()
        raise
    return tiers
