"""Issue 13's speed and memory targets, each a ratio of two figures measured in the same run,
and whether it is met.

A target names the metric, our side and the peer side of a bench's results (the per-side dicts
``bench generate`` / ``bench engine`` collect from their workers), the goal ratio and which way
is better. A target whose peer was not measured in this run (llama.cpp absent, HF skipped), or
whose figures no bench measures yet, is reported as "not measured" with the reason: never a
stored number.
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
        unmeasured: set when no bench measures this target's figures yet: the reason printed.
    """

    label: str
    key: str
    peer: str
    goal: float
    lower_is_better: bool = False
    unmeasured: str = ""


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
    Target(
        "peak RSS minus KV pool",
        "peak_rss_mib",
        "llamacpp",
        2.0,
        lower_is_better=True,
        unmeasured="neither side reports its KV pool size yet",
    ),
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
        if t.unmeasured:
            rows.append(TargetRow(t, None, f"not measured: {t.unmeasured}"))
            continue
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
