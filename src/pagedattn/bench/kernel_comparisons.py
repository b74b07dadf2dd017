"""The decode-attention comparisons ``pagedattn bench kernels`` prints for a row: the paged
kernel vs the read-only pass over the same pages ("vs read pass": the share of its bandwidth)
and vs torch SDPA on dense float32 K/V ("vs torch SDPA": the speedup), each against its goal.

The goals are set at batch 32 (>= 80 % of the read pass, >= 1.5x SDPA) and batch 1 (not
slower than SDPA); other batch sizes have none.
"""

from __future__ import annotations


def kernel_comparisons(
    batch: int, pct_read: float, speedup: float | None
) -> list[tuple[str, str, str, str]]:
    """The comparisons of one ``bench kernels`` row.

    Args:
        batch: the row's batch size.
        pct_read: the paged kernel's KV GB/s as a percentage of the read-only pass's.
        speedup: SDPA time / paged time, or None when torch is absent.

    Returns:
        (comparison, measured, goal, verdict) rows: verdict ``"met"``, ``"NOT met"`` or
        ``"not measured: torch absent"``; none for batch sizes without a goal.
    """
    checks: list[tuple[str, float | None, float, str]] = []
    if batch == 32:
        checks.append(("vs read pass (% of its GB/s)", pct_read, 80.0, "%"))
        checks.append(("vs torch SDPA (speedup)", speedup, 1.5, "x"))
    elif batch == 1:
        checks.append(("vs torch SDPA (speedup)", speedup, 1.0, "x"))
    rows: list[tuple[str, str, str, str]] = []
    for label, value, goal, unit in checks:
        fmt = "{:.0f}%" if unit == "%" else "{:.2f}x"
        if value is None:
            rows.append((label, "-", f">= {fmt.format(goal)}", "not measured: torch absent"))
        else:
            verdict = "met" if value >= goal else "NOT met"
            rows.append((label, fmt.format(value), f">= {fmt.format(goal)}", verdict))
    return rows
