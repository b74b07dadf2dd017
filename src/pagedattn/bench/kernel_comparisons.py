"""The decode-attention comparisons ``pagedattn bench kernels`` prints for a row: the paged
kernel vs the read-only pass over the same pages ("vs read pass": the share of its bandwidth)
and vs torch SDPA on dense float32 K/V ("vs torch SDPA": the speedup), both same-run figures."""

from __future__ import annotations


def kernel_comparisons(pct_read: float, speedup: float | None) -> list[tuple[str, str]]:
    """The comparisons of one ``bench kernels`` row.

    Args:
        pct_read: the paged kernel's KV GB/s as a percentage of the read-only pass's.
        speedup: SDPA time / paged time, or None when torch is absent.

    Returns:
        (comparison, measured) rows; the SDPA row says ``"not measured: torch absent"`` when
        torch is not installed.
    """
    sdpa = "not measured: torch absent" if speedup is None else f"{speedup:.2f}x"
    return [("vs read pass (% of its GB/s)", f"{pct_read:.0f}%"), ("vs torch SDPA (speedup)", sdpa)]
