"""The engine's layer-group setup: how a budget is shared between the groups, and fork copies
that touch only a page's own group's layers."""

from __future__ import annotations

import numpy as np
import pytest

from pagedattn.cache import PagePool
from pagedattn.cache.hybrid_manager import HybridCacheManager
from pagedattn.cache.layer_groups import LayerGroup, group_of_layers
from pagedattn.engine.kv_groups import KVLayout, group_page_counts, page_copier
from pagedattn.engine.llm import engine_config

GROUPS = (LayerGroup(None, (5, 11, 17)), LayerGroup(512, tuple(i for i in range(18) if i % 6 != 5)))


@pytest.mark.parametrize(
    ("max_num_seqs", "expected"),
    [
        # per sequence the window holds ceil((512 + 512) / 16) + 1 = 65 pages; the full group
        # gets the rest of 455 pages x 18 layers over its 3 layers
        (1, ((455 * 18 - 65 * 15) // 3, 65)),
        (4, ((455 * 18 - 260 * 15) // 3, 260)),
        (64, (455, 455)),  # the window share would pass the budget's pages: capped
    ],
)
def test_budget_shares(max_num_seqs: int, expected: tuple[int, int]) -> None:
    config = engine_config(
        None, page_size=16, max_num_seqs=max_num_seqs, max_num_batched_tokens=2048,
        long_prefill_token_threshold=512, speculative="none",
    )  # fmt: skip
    assert config.scheduler.prefill_chunk_size == 512
    assert group_page_counts(455, GROUPS, config) == expected


def test_fork_copies_touch_only_the_pages_own_group() -> None:
    groups = (LayerGroup(None, (2,)), LayerGroup(8, (0, 1)))
    pool = PagePool(3, 8, 1, 4, 4)
    manager = HybridCacheManager(groups, (4, 4), 4, b"ns")
    layout = KVLayout(manager, 8, group_of_layers(groups, 3), groups)
    pool.kv[...] = np.random.default_rng(0).standard_normal(pool.kv.shape)
    before = pool.kv.copy()
    copy = page_copier(layout, pool)
    copy([(1, 2), (5, 6)])
    want = before.copy()
    want[2, :, 2] = before[2, :, 1]  # the full group's page 1 -> 2, its layer only
    want[:2, :, 6] = before[:2, :, 5]  # the sliding group's page 5 -> 6, its layers only
    np.testing.assert_array_equal(pool.kv, want)
    with pytest.raises(ValueError, match="not two of one group"):
        copy([(1, 5)])
