"""Reports of the perplexity lab: a policy x budget table, JSON records, a two-panel PNG."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _label(record: dict[str, Any]) -> str:
    mode = record["position_mode"]
    return record["policy"] if mode == "absolute" else f"{record['policy']} ({mode})"


def _full(records: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    return next((r for r in records if r["policy"] == "full"), None)


def table_rows(records: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Header and rows: one row per (policy, position mode), one column per budget; a cell is
    ``perplexity (ratio to full)``; ``full`` (no eviction) gets one cell for every budget.

    Args:
        records: :meth:`PerplexityResult.record` dicts.
    """
    budgets = sorted({r["budget"] for r in records if r["budget"] is not None})
    full = _full(records)
    header = ["policy", *[f"budget {b}" for b in budgets]]
    rows: list[list[str]] = []
    labels = list(dict.fromkeys(_label(r) for r in records))
    for label in labels:
        mine = [r for r in records if _label(r) == label]
        row = [label]
        for b in budgets:
            hit = next((r for r in mine if r["budget"] in (b, None)), None)
            if hit is None:
                row.append("-")
                continue
            cell = f"{hit['perplexity']:.2f}"
            if full is not None:
                cell += f" ({hit['perplexity'] / full['perplexity']:.2f}x)"
            row.append(cell)
        rows.append(row)
    return header, rows


def write_json(path: Path, records: Sequence[dict[str, Any]]) -> None:
    """Write the records as a JSON list (UTF-8, indented)."""
    path.write_text(json.dumps(list(records), indent=1) + "\n", encoding="utf-8")


def write_plot(
    path: Path, records: Sequence[dict[str, Any]], curve_budget: int, title: str = ""
) -> None:
    """Two panels: perplexity vs budget per policy (log y; ``full`` as a dashed line) and the
    running mean NLL vs position at ``curve_budget`` (where a window-only collapse shows).

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
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    full = _full(records)
    labels = list(dict.fromkeys(_label(r) for r in records if r["policy"] != "full"))
    colors = {label: f"C{i + 1}" for i, label in enumerate(labels)}  # the same in both panels
    colors["full"] = "black"
    for label in labels:
        mine = sorted((r for r in records if _label(r) == label), key=lambda r: r["budget"])
        ax1.plot(
            [r["budget"] for r in mine],
            [r["perplexity"] for r in mine],
            marker="o",
            label=label,
            color=colors[label],
        )
    if full is not None:
        ax1.axhline(full["perplexity"], color="black", linestyle="--", label="full (no eviction)")
    ax1.set_xscale("log", base=2)
    ax1.set_yscale("log")
    ax1.set_xlabel("KV budget (tokens, sink pages included)")
    ax1.set_ylabel("perplexity")
    ax1.set_title("Perplexity vs KV budget")
    ax1.legend(fontsize=8)
    tail: list[float] = []  # values past the first budget's worth of tokens set the y range
    for r in records:
        if r["budget"] == curve_budget or r["policy"] == "full":
            curve = r["running_mean_nll"]
            style = "--" if r["policy"] == "full" else "-"
            ax2.plot(
                curve["position"], curve["value"], style, label=_label(r), color=colors[_label(r)]
            )
            tail += [v for p, v in zip(curve["position"], curve["value"], strict=True) if p > 64]
    if tail:
        ax2.set_ylim(min(tail) - 0.2, max(tail) + 0.2)
    ax2.axvline(curve_budget, color="grey", linewidth=0.8)
    ax2.set_xlabel("position (tokens)")
    ax2.set_ylabel("running mean NLL (nats)")
    ax2.set_title(f"Running mean NLL, budget {curve_budget}")
    ax2.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
