"""``pagedattn bench engine --compare-kv-dtype``: the same requests on the same KV budget
(``--kv-cache-mib``) with two KV dtypes, one worker process each. A smaller dtype holds more
pages, so more sequences run at once; the goal: int8 (about 1.9x float16's pages at head_dim
64, its 4 scale bytes per row included) generates >= 1.3x float16's tokens per second."""

from __future__ import annotations

import math
from typing import Any

KV_BUDGET_GOAL = 1.3  # int8 generated tok/s over float16's on the same --kv-cache-mib
GOAL_PAIR = ("int8", "float16")


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


def kv_budget_verdict(results: dict[str, dict[str, Any]]) -> str:
    """The first dtype's tok/s over the second's, with the goal when they are int8, float16."""
    (first, a), (second, b) = list(results.items())[:2]
    ratio = a["main"]["generated_tok_s"] / b["main"]["generated_tok_s"]
    line = f"{first} vs {second} KV on the same budget (generated tok/s): {ratio:.2f}x"
    if (first, second) == GOAL_PAIR:
        verdict = "met" if ratio >= KV_BUDGET_GOAL else "NOT met"
        line += f" (goal >= {KV_BUDGET_GOAL:.2f}x: {verdict})"
    return line
