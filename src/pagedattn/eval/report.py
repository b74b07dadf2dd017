"""Reports of the perplexity lab: a (policy, KV dtype) x budget table, JSON records, a PNG.

Records written before the dtype axis existed read as float32 KV, float32 activations and the
streaming method. A byte budget (``budget_bytes``) is a column of its own, whose cells also say
how many tokens the bytes bought in that row's dtype, so one column compares dtypes at equal
memory.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DTYPE_STYLES = {"float32": "-", "float16": "--", "int8": ":"}


def normalized(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with the fields older records lack at their values of the time."""
    defaults = {
        "kv_cache_dtype": "float32",
        "activations": "float32",
        "method": "stream",
        "budget_bytes": None,
    }
    return {**defaults, **record}


def label(record: dict[str, Any]) -> str:
    """Row label: policy, position mode unless absolute, activations and method unless default."""
    r = normalized(record)
    out = (
        r["policy"] if r["position_mode"] == "absolute" else f"{r['policy']} ({r['position_mode']})"
    )
    if r["activations"] != "float32":
        out += f", activations {r['activations']}"
    if r["method"] == "chunks":
        out += f", chunks of {r.get('chunk_tokens')}"
    return out


def run_key(record: dict[str, Any]) -> tuple[Any, ...]:
    """What makes two records the same run (a later one replaces an earlier one on merge)."""
    r = normalized(record)
    return (
        r["policy"],
        r["position_mode"],
        r["budget"],
        r["budget_bytes"],
        r["tokens"],
        r["kv_cache_dtype"],
        r["activations"],
        r["method"],
        r.get("chunk_tokens"),
    )


def _reference(record: dict[str, Any], records: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The ``full`` run a record's ratio divides by: float32 KV, else the record's own dtype,
    with the same tokens, activations and method."""
    r = normalized(record)
    same = [
        f
        for f in map(normalized, records)
        if f["policy"] == "full"
        and (f["tokens"], f["activations"], f["method"])
        == (r["tokens"], r["activations"], r["method"])
    ]
    for dtype in ("float32", r["kv_cache_dtype"]):
        hit = next((f for f in same if f["kv_cache_dtype"] == dtype), None)
        if hit is not None:
            return hit
    return None


def format_bytes(size: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size % scale == 0:
            return f"{size / scale:g} {unit}"
    return f"{size} B"


def table_rows(records: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Header and rows: one row per (policy, position mode, KV dtype), rows of one policy next to
    each other; one column per token budget, then one per byte budget. A cell is ``perplexity
    (ratio to full with float32 KV)``, a byte budget's cell adds the tokens it bought
    (``@ 512 tok``); a run fills its token budget's column whether it was given tokens or bytes;
    ``full`` (no eviction) gets one cell for every budget.

    Args:
        records: :meth:`PerplexityResult.record` dicts.
    """
    recs = [normalized(r) for r in records]
    budgets = sorted(
        {r["budget"] for r in recs if r["budget"] is not None and r["budget_bytes"] is None}
    )
    sizes = sorted({r["budget_bytes"] for r in recs if r["budget_bytes"] is not None})
    header = [
        "policy",
        "KV dtype",
        *[f"budget {b}" for b in budgets],
        *[f"budget {format_bytes(s)}" for s in sizes],
    ]
    dtypes = list(dict.fromkeys(r["kv_cache_dtype"] for r in recs))
    rows: list[list[str]] = []
    for name in dict.fromkeys(label(r) for r in recs):
        for dtype in dtypes:
            mine = [r for r in recs if label(r) == name and r["kv_cache_dtype"] == dtype]
            if not mine:
                continue
            row = [name, dtype]
            for b in budgets:
                hit = next((r for r in mine if r["budget"] in (b, None)), None)
                row.append(_cell(hit, recs, False))
            for s in sizes:
                row.append(_cell(_at_bytes(mine, s), recs, True))
            rows.append(row)
    return header, rows


def _at_bytes(mine: Sequence[dict[str, Any]], size: int) -> dict[str, Any] | None:
    """The run of ``mine`` (one row) at a byte budget: one given that budget, else one given the
    token budget those bytes buy (whole pages of the record's ``page_bytes``), else ``full``."""
    hit = next((r for r in mine if r["budget_bytes"] == size or r["budget"] is None), None)
    if hit is not None:
        return hit
    for r in mine:
        if r.get("page_bytes") and r["budget"] == size // r["page_bytes"] * r["page_size"]:
            return r
    return None


def _cell(hit: dict[str, Any] | None, records: Sequence[dict[str, Any]], by_bytes: bool) -> str:
    if hit is None:
        return "-"
    cell = f"{hit['perplexity']:.2f}"
    ref = _reference(hit, records)
    if ref is not None:
        cell += f" ({hit['perplexity'] / ref['perplexity']:.2f}x)"
    if by_bytes and hit["budget"] is not None:
        cell += f" @ {hit['budget']} tok"
    return cell


def write_json(path: Path, records: Sequence[dict[str, Any]]) -> None:
    """Write the records as a JSON list (UTF-8, indented)."""
    path.write_text(json.dumps(list(records), indent=1) + "\n", encoding="utf-8")
