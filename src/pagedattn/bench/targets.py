"""Issue 13's speed and memory targets, each a ratio of two figures measured in the same run,
and whether it is met.

A target names the metric, our side and the peer side of a bench's results (the per-side dicts
``bench generate`` / ``bench engine`` collect from their workers), the goal ratio and which way
is better. A target whose peer was not measured in this run (llama.cpp absent, HF skipped) is
reported as "not measured" with the reason: never a stored number.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PEER_NAMES = {
    "hf": "HF transformers",
    "llamacpp": "llama.cpp",
    "llamacpp_batched": "llama.cpp (llama-batched-bench)",
}


@dataclass(frozen=True)
class Target:
    """One ratio target: ``ours[key] / peer[key]`` against ``goal``.

    Attributes:
        label: what is compared, e.g. ``"single-stream decode tok/s"``.
        key: the metric's key in both sides' result dicts (a ``"main.x"`` path goes one level
            down, as in ``bench engine``'s results).
        peer: a key of :data:`PEER_NAMES`.
        goal: the ratio to reach (>= goal, or <= goal when ``lower_is_better``).
        lower_is_better: True for memory, False for speed.
    """

    label: str
    key: str
    peer: str
    goal: float
    lower_is_better: bool = False


@dataclass(frozen=True)
class TargetRow:
    """A target's outcome: ``ratio`` None and ``verdict`` "not measured: <why>" when unknown."""

    target: Target
    ratio: float | None
    verdict: str


GENERATE_TARGETS = (
    Target("single-stream decode tok/s", "decode_tok_s", "llamacpp", 1.0),
    Target("single-stream decode tok/s (stretch)", "decode_tok_s", "llamacpp", 1.5),
    Target("prefill tok/s", "prefill_tok_s", "hf", 1.5),
    # the KV figures: our pool's resident pages (smaps), llama.cpp's own "KV buffer" report
    Target("peak RSS minus KV cache", "peak_rss_minus_kv_mib", "llamacpp", 2.0, True),
)
ENGINE_TARGETS = (
    Target("batched generated tok/s", "main.generated_tok_s", "hf", 3.0),
    # llama-cpp-python runs one sequence at a time: the batched peer is llama.cpp's own
    # llama-batched-bench (bench engine --llama-batched-bench PATH)
    Target("batched generated tok/s", "main.generated_tok_s", "llamacpp_batched", 2.0),
)


def _figure(side: Mapping[str, Any], key: str) -> float | None:
    value: Any = side
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return float(value)


def evaluate(
    targets: Sequence[Target], results: Mapping[str, Mapping[str, Any]]
) -> list[TargetRow]:
    """Each target's ratio and verdict from one run's results.

    Args:
        targets: e.g. :data:`GENERATE_TARGETS`.
        results: per side (``"ours"``, ``"hf"``, ``"llamacpp"``) the worker's result dict.

    Returns:
        One :class:`TargetRow` per target, in order: verdict ``"met"`` / ``"NOT met"``, or
        ``"not measured: ..."`` (the target's own reason, or the side that did not run).

    Raises:
        ValueError: a target with an unknown peer.
    """
    rows = []
    for t in targets:
        if t.peer not in PEER_NAMES:
            raise ValueError(f"target peer: expected one of {sorted(PEER_NAMES)}, got {t.peer!r}")
        ours = _figure(results.get("ours", {}), t.key)
        peer = _figure(results.get(t.peer, {}), t.key)
        if ours is None or peer is None or peer <= 0:
            missing = "ours" if ours is None else PEER_NAMES[t.peer]
            rows.append(TargetRow(t, None, f"not measured: {missing} did not run"))
            continue
        ratio = ours / peer
        met = ratio <= t.goal if t.lower_is_better else ratio >= t.goal
        rows.append(TargetRow(t, ratio, "met" if met else "NOT met"))
    return rows


def print_targets(
    console: Any, targets: Sequence[Target], results: Mapping[str, Mapping[str, Any]]
) -> None:
    """Print issue 13's targets as a table (``console``: a ``rich.console.Console``)."""
    from rich.table import Table

    table = Table(title="issue 13 targets (ratios measured in this run)")
    for name in ("target", "vs", "ratio", "goal", "met"):
        table.add_column(name, justify="left" if name in ("target", "met") else "right")
    for row in evaluate(targets, results):
        t = row.target
        goal = f"{'<=' if t.lower_is_better else '>='} {t.goal}x"
        ratio = "-" if row.ratio is None else f"{row.ratio:.2f}x"
        table.add_row(t.label, PEER_NAMES[t.peer], ratio, goal, row.verdict)
    console.print(table)


def kernel_targets(
    batch: int, pct_read: float, speedup: float | None
) -> list[tuple[str, str, str, str]]:
    """Issue 13's decode-attention targets for one ``bench kernels`` row.

    Args:
        batch: the row's batch size; the targets are set for batch 32 (>= 80% of the same
            run's read-only bandwidth, >= 1.5x torch SDPA) and batch 1 (not slower than SDPA).
        pct_read: the paged kernel's KV GB/s as a percentage of the read-only pass's.
        speedup: SDPA time / paged time, or None when torch is absent.

    Returns:
        (target, measured, goal, verdict) rows; none for other batch sizes.
    """
    rows: list[tuple[str, str, str, str]] = []
    checks: list[tuple[str, float | None, float, str]] = []
    if batch == 32:
        checks.append(("% of read-only bandwidth", pct_read, 80.0, "%"))
        checks.append(("speedup vs torch SDPA", speedup, 1.5, "x"))
    elif batch == 1:
        checks.append(("speedup vs torch SDPA", speedup, 1.0, "x"))
    for label, value, goal, unit in checks:
        fmt = "{:.0f}%" if unit == "%" else "{:.2f}x"
        if value is None:
            rows.append((label, "-", f">= {fmt.format(goal)}", "not measured: torch absent"))
        else:
            verdict = "met" if value >= goal else "NOT met"
            rows.append((label, fmt.format(value), f">= {fmt.format(goal)}", verdict))
    return rows
