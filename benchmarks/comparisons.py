"""Named same-run comparisons with a peer ("decode tok/s vs llama.cpp"): each the ratio of two
figures measured in the same run, ours over the peer's.

A comparison names the metric, our side and the peer side of a run's results (the per-side
dicts ``benchmarks/compare.py`` collects from its workers). A comparison whose peer was not
measured in this run (llama.cpp absent, HF skipped) is reported as "not measured" with the
reason: never a stored number.
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
    """One ratio ``ours[key] / peer[key]``.

    Attributes:
        label: what is compared, e.g. ``"single-stream decode tok/s"``.
        key: the metric's key in both sides' result dicts (a ``"main.x"`` path goes one level
            down, as in the engine comparison's results).
        peer: a key of :data:`PEER_NAMES`.
    """

    label: str
    key: str
    peer: str

    @property
    def name(self) -> str:
        """``"<label> vs <peer>"``, as the table prints it."""
        return f"{self.label} vs {PEER_NAMES[self.peer]}"


@dataclass(frozen=True)
class ComparisonRow:
    """A comparison's outcome: ``ratio`` None and ``note`` "not measured: <why>" when
    unknown, ``note`` empty otherwise."""

    comparison: Comparison
    ratio: float | None
    note: str = ""


GENERATE_COMPARISONS = (
    Comparison("single-stream decode tok/s", "decode_tok_s", "llamacpp"),
    Comparison("prefill tok/s", "prefill_tok_s", "hf"),
    Comparison("prefill tok/s", "prefill_tok_s", "llamacpp"),
    # the KV figures: our pool's resident pages (pagemap), llama.cpp's own "KV buffer" report
    Comparison("peak RSS minus KV cache", "peak_rss_minus_kv_mib", "llamacpp"),
)
ENGINE_COMPARISONS = (
    Comparison("batched generated tok/s", "main.generated_tok_s", "hf"),
    # llama-cpp-python runs one sequence at a time: the batched peer is llama.cpp's own
    # llama-batched-bench (compare.py engine --llama-batched-bench PATH)
    Comparison("batched generated tok/s", "main.generated_tok_s", "llamacpp_batched"),
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
    """Each comparison's ratio from one run's results.

    Args:
        comparisons: e.g. :data:`GENERATE_COMPARISONS`.
        results: per side (``"ours"``, ``"hf"``, ``"llamacpp"``) the worker's result dict.

    Returns:
        One :class:`ComparisonRow` per comparison, in order: its ratio, or None with the note
        ``"not measured: <side> did not run"``.

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
        rows.append(ComparisonRow(c, ours / peer))
    return rows


def print_comparisons(
    console: Any, comparisons: Sequence[Comparison], results: Mapping[str, Mapping[str, Any]]
) -> None:
    """Print the comparisons as a table (``console``: a ``rich.console.Console``)."""
    from rich.table import Table

    table = Table(title="same-run comparisons (ours / peer)")
    for name in ("comparison", "ratio", ""):
        table.add_column(name, justify="right" if name == "ratio" else "left")
    for row in evaluate(comparisons, results):
        ratio = "-" if row.ratio is None else f"{row.ratio:.2f}x"
        table.add_row(row.comparison.name, ratio, row.note)
    console.print(table)
