"""Named same-run comparisons with a peer ("decode tok/s vs llama.cpp"): each the ratio of two
figures measured in the same run, its goal, and whether it is met.

A comparison names the metric, our side and the peer side of a run's results (the per-side
dicts ``benchmarks/compare.py`` collects from its workers), the goal ratio and which way is
better. A comparison whose peer was not measured in this run (llama.cpp absent, HF skipped) is
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
class Comparison:
    """One ratio ``ours[key] / peer[key]`` against ``goal``.

    Attributes:
        label: what is compared, e.g. ``"single-stream decode tok/s"``.
        key: the metric's key in both sides' result dicts (a ``"main.x"`` path goes one level
            down, as in the engine comparison's results).
        peer: a key of :data:`PEER_NAMES`.
        goal: the ratio to reach (>= goal, or <= goal when ``lower_is_better``).
        lower_is_better: True for memory, False for speed.
    """

    label: str
    key: str
    peer: str
    goal: float
    lower_is_better: bool = False

    @property
    def name(self) -> str:
        """``"<label> vs <peer>"``, as the table prints it."""
        return f"{self.label} vs {PEER_NAMES[self.peer]}"


@dataclass(frozen=True)
class ComparisonRow:
    """A comparison's outcome: ``ratio`` None and ``verdict`` "not measured: <why>" when
    unknown."""

    comparison: Comparison
    ratio: float | None
    verdict: str


GENERATE_COMPARISONS = (
    Comparison("single-stream decode tok/s", "decode_tok_s", "llamacpp", 1.0),
    Comparison("single-stream decode tok/s (stretch)", "decode_tok_s", "llamacpp", 1.5),
    Comparison("prefill tok/s", "prefill_tok_s", "hf", 1.5),
    Comparison("prefill tok/s", "prefill_tok_s", "llamacpp", 1.5),
    # the KV figures: our pool's resident pages (pagemap), llama.cpp's own "KV buffer" report
    Comparison("peak RSS minus KV cache", "peak_rss_minus_kv_mib", "llamacpp", 1.5, True),
)
ENGINE_COMPARISONS = (
    Comparison("batched generated tok/s", "main.generated_tok_s", "hf", 3.0),
    # llama-cpp-python runs one sequence at a time: the batched peer is llama.cpp's own
    # llama-batched-bench (compare.py engine --llama-batched-bench PATH)
    Comparison("batched generated tok/s", "main.generated_tok_s", "llamacpp_batched", 2.0),
)


def _figure(side: Mapping[str, Any], key: str) -> float | None:
    value: Any = side
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return float(value)


def evaluate(
    comparisons: Sequence[Comparison], results: Mapping[str, Mapping[str, Any]]
) -> list[ComparisonRow]:
    """Each comparison's ratio and verdict from one run's results.

    Args:
        comparisons: e.g. :data:`GENERATE_COMPARISONS`.
        results: per side (``"ours"``, ``"hf"``, ``"llamacpp"``) the worker's result dict.

    Returns:
        One :class:`ComparisonRow` per comparison, in order: verdict ``"met"`` /
        ``"NOT met"``, or ``"not measured: <side> did not run"``.

    Raises:
        ValueError: a comparison with an unknown peer.
    """
    rows = []
    for c in comparisons:
        if c.peer not in PEER_NAMES:
            raise ValueError(
                f"comparison peer: expected one of {sorted(PEER_NAMES)}, got {c.peer!r}"
            )
        ours = _figure(results.get("ours", {}), c.key)
        peer = _figure(results.get(c.peer, {}), c.key)
        if ours is None or peer is None or peer <= 0:
            missing = "ours" if ours is None else PEER_NAMES[c.peer]
            rows.append(ComparisonRow(c, None, f"not measured: {missing} did not run"))
            continue
        ratio = ours / peer
        met = ratio <= c.goal if c.lower_is_better else ratio >= c.goal
        rows.append(ComparisonRow(c, ratio, "met" if met else "NOT met"))
    return rows


def print_comparisons(
    console: Any, comparisons: Sequence[Comparison], results: Mapping[str, Mapping[str, Any]]
) -> None:
    """Print the comparisons as a table (``console``: a ``rich.console.Console``)."""
    from rich.table import Table

    table = Table(title="same-run comparisons (ours / peer)")
    for name in ("comparison", "ratio", "goal", "met"):
        table.add_column(name, justify="left" if name in ("comparison", "met") else "right")
    for row in evaluate(comparisons, results):
        c = row.comparison
        goal = f"{'<=' if c.lower_is_better else '>='} {c.goal}x"
        ratio = "-" if row.ratio is None else f"{row.ratio:.2f}x"
        table.add_row(c.name, ratio, goal, row.verdict)
    console.print(table)
