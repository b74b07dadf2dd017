"""The perplexity lab's PNG: perplexity vs KV memory (a colour per policy, a line style per KV
dtype) and the running mean NLL vs position at one budget."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pagedattn.eval.report import DTYPE_STYLES, label, normalized


def _kv_mib(record: dict[str, Any]) -> float:
    return float(record["budget"] / record["page_size"] * record["page_bytes"] / 2**20)


def write_plot(
    path: Path, records: Sequence[dict[str, Any]], curve_budget: int, title: str = ""
) -> None:
    """Two panels: perplexity vs KV budget (in MiB of K and V when every record knows its page
    bytes, else in tokens; log axes; ``full`` as a horizontal line per dtype) and the running
    mean NLL vs position at the token budget ``curve_budget``.

    Raises:
        ImportError: matplotlib missing (the ``plot`` extra).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "--plot needs matplotlib: pip install 'pagedattn[plot]' (make run installs it)"
        ) from exc
    recs = [normalized(r) for r in records]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = list(dict.fromkeys(label(r) for r in recs if r["policy"] != "full"))
    colors = {name: f"C{i + 1}" for i, name in enumerate(names)}  # the same in both panels
    dtypes = list(dict.fromkeys(r["kv_cache_dtype"] for r in recs))
    styles = {d: DTYPE_STYLES.get(d, "-.") for d in dtypes}
    bounded = [r for r in recs if r["budget"] is not None]
    in_mib = bool(bounded) and all(r.get("page_bytes") for r in bounded)
    for name in names:
        for dtype in dtypes:
            mine = [r for r in bounded if label(r) == name and r["kv_cache_dtype"] == dtype]
            mine = list({r["budget"]: r for r in mine}.values())  # a byte budget = its tokens
            mine.sort(key=lambda r: r["budget"])
            if not mine:
                continue
            ax1.plot(
                [_kv_mib(r) if in_mib else r["budget"] for r in mine],
                [r["perplexity"] for r in mine],
                styles[dtype],
                marker="o",
                markersize=3,
                color=colors[name],
                label=f"{name} [{dtype}]" if len(dtypes) > 1 else name,
            )
    for r in recs:
        if r["policy"] == "full" and r["method"] == "stream":
            ax1.axhline(
                r["perplexity"],
                color="black",
                linestyle=styles[r["kv_cache_dtype"]],
                linewidth=0.9,
                label=f"full (no eviction) [{r['kv_cache_dtype']}]",
            )
    ax1.set_xscale("log", base=2)
    ax1.set_yscale("log")
    unit = "MiB of K and V" if in_mib else "tokens"
    ax1.set_xlabel(f"KV budget ({unit}, sink pages included)")
    ax1.set_ylabel("perplexity")
    ax1.set_title("Perplexity vs KV budget (line style: KV dtype)")
    ax1.legend(fontsize=7)
    tail: list[float] = []  # values past the first budget's worth of tokens set the y range
    for r in recs:
        by_tokens = r["budget"] == curve_budget
        if r["method"] == "stream" and (by_tokens or r["policy"] == "full"):
            curve = r["running_mean_nll"]
            color = "black" if r["policy"] == "full" else colors[label(r)]
            ax2.plot(
                curve["position"],
                curve["value"],
                styles[r["kv_cache_dtype"]],
                label=f"{label(r)} [{r['kv_cache_dtype']}]",
                color=color,
            )
            tail += [v for p, v in zip(curve["position"], curve["value"], strict=True) if p > 64]
    if tail:
        ax2.set_ylim(min(tail) - 0.2, max(tail) + 0.2)
    ax2.axvline(curve_budget, color="grey", linewidth=0.8)
    ax2.set_xlabel("position (tokens)")
    ax2.set_ylabel("running mean NLL (nats)")
    ax2.set_title(f"Running mean NLL, budget {curve_budget} tokens")
    ax2.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
