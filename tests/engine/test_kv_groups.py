"""The engine's layer-group setup: how a budget is shared between the groups."""

from __future__ import annotations

import pytest

from pagedattn.cache.layer_groups import LayerGroup
from pagedattn.engine.kv_groups import group_page_counts
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
