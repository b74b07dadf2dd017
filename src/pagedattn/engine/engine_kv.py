"""The engine's KV storage and bookkeeping built together: the page pool, its cache manager
(per layer group with a hybrid KV cache, :mod:`pagedattn.engine.kv_groups`), the persistent
tier (one per group then) and its restores (:mod:`pagedattn.engine.kv_restores`), and the
pool's snapshot per group."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from pagedattn.backends import BackendSpec
from pagedattn.cache import PagePool
from pagedattn.cache.pool_snapshot import pool_snapshot
from pagedattn.config import EngineConfig, ModelConfig
from pagedattn.engine import engine_setup
from pagedattn.engine.kv_groups import (
    KVLayout,
    group_page_counts,
    hybrid_groups,
    kv_layout,
    open_group_tiers,
)
from pagedattn.engine.kv_restores import KVRestores

if TYPE_CHECKING:
    from pagedattn.storage import KVStore, KVTier


@dataclass(frozen=True)
class EngineKV:
    """What :func:`build_engine_kv` built.

    Attributes:
        pool: the page pool (every group's page ids).
        layout: the cache manager and the layer groups.
        tier: the persistent tier (group 0's with layer groups), None without one.
        tiers: every tier (one per layer group with a hybrid KV cache).
        restores: the requests waiting for their KV from the tier, None without one.
    """

    pool: PagePool
    layout: KVLayout
    tier: KVTier | None
    tiers: tuple[KVTier, ...]
    restores: KVRestores | None = None


def build_engine_kv(
    config: EngineConfig,
    mc: ModelConfig,
    num_pages: int,
    namespace: bytes,
    backend: BackendSpec,
    kv_store: KVStore | None,
) -> EngineKV:
    """The pool, cache manager and tiers of an engine over a budget of ``num_pages`` pages of
    every layer.

    Raises:
        ValueError: see :func:`pagedattn.engine.kv_groups.hybrid_groups` and
            :func:`pagedattn.engine.engine_setup.open_tier`.
    """
    cc = config.cache
    groups = hybrid_groups(config, mc, has_store=kv_store is not None)
    counts = None if groups is None else group_page_counts(num_pages, groups, config)
    pool = PagePool(
        mc.num_layers, num_pages if counts is None else sum(counts), mc.num_kv_heads,
        cc.page_size, mc.head_dim, dtype=np.dtype(cc.kv_cache_dtype), backend=backend,
    )  # fmt: skip
    if groups is None or counts is None:
        tier = engine_setup.open_tier(kv_store, config, namespace, pool)
        layout = kv_layout(config, mc, None, num_pages, namespace, tier)
        tiers = [] if tier is None else [tier]
    else:
        tiers = open_group_tiers(config, namespace, pool, groups, counts) or []
        layout = kv_layout(config, mc, groups, num_pages, namespace, None, tiers or None)
    if not tiers:
        return EngineKV(pool, layout, None, ())
    manager = layout.manager
    restores = KVRestores(manager, tiers[0], config.kv_store_deadline_s, manager.tier_errors)
    return EngineKV(pool, layout, tiers[0], tuple(tiers), restores)


def group_snapshots(
    layout: KVLayout, pool: PagePool, seq_ids: Sequence[Hashable], max_table: int
) -> list[dict[str, Any]]:
    """Per layer group: its ``pool`` snapshot (:func:`pool_snapshot`, its own page ids) with
    the tables of ``seq_ids``, its ``first_layer``, ``num_layers`` and ``bytes_per_page``."""
    page_layer_bytes = pool.nbytes // (pool.num_pages * pool.num_layers)
    managers = getattr(layout.manager, "group_managers", (layout.manager,))
    return [
        {
            "pool": pool_snapshot(m, seq_ids, max_table),
            "first_layer": group.layers[0],
            "num_layers": len(group.layers),
            "bytes_per_page": page_layer_bytes * len(group.layers),
        }
        for m, group in zip(managers, layout.groups, strict=True)
    ]
