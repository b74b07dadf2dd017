"""``pagedattn bench engine --compare-kv-dtype``: the same requests on the same KV budget
(``--kv-cache-mib``) with two KV dtypes, one worker process each. A smaller dtype holds more
pages, so more sequences run at once (int8 holds about 1.9x float16's pages at head_dim 64, its
4 scale bytes per row included); the ratio of their generated tokens per second is printed."""

from __future__ import annotations

import math
from typing import Any


def sequences_that_fit(num_pages: int, max_prompt_len: int, output_len: int, page_size: int) -> int:
    """How many of the longest requests (prompt + output) the pool's pages hold at once."""
    return num_pages // math.ceil((max_prompt_len + output_len) / page_size)


def kv_budget_rows(
    results: dict[str, dict[str, Any]], max_prompt_len: int, output_len: int, page_size: int
) -> list[tuple[str, str, str, str]]:
    """(KV dtype, pages, longest requests that fit, generated tok/s) per side."""
    rows = []
    for dtype, r in results.items():
        pages = int(r["main"]["num_pages"])
        fit = sequences_that_fit(pages, max_prompt_len, output_len, page_size)
        rows.append((dtype, str(pages), str(fit), f"{r['main']['generated_tok_s']:.1f}"))
    return rows


def kv_budget_ratio(results: dict[str, dict[str, Any]]) -> str:
    """The first dtype's generated tok/s over the second's, as one line."""
    (first, a), (second, b) = list(results.items())[:2]
    ratio = a["main"]["generated_tok_s"] / b["main"]["generated_tok_s"]
    return f"{first} vs {second} KV on the same budget (generated tok/s): {ratio:.2f}x"
