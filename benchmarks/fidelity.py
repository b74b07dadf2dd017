"""How far a side's output is from HF transformers float32 on the bench's prompt: the
first generated position's log-probabilities, and how many greedy tokens agree.

Each side reports ``first_logprobs`` (top-20 at the first generated position, token id as
text -> log-probability) and ``greedy_ids`` (its greedy continuation). ``compare.py generate``
prints it for our side (``--activations int8`` measures the faster, less exact path) and for
llama.cpp's own int8 path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Fidelity:
    """A side against the reference.

    Attributes:
        max_logprob_diff: max |log p_side - log p_ref| over the reference's top tokens that the
            side also reports (``compared`` of them).
        compared: how many tokens that maximum is over.
        same_argmax: both put the same token first at the first generated position.
        greedy_prefix: leading greedy tokens identical to the reference's, of ``greedy_len``.
    """

    max_logprob_diff: float
    compared: int
    same_argmax: bool
    greedy_prefix: int
    greedy_len: int


def fidelity(side: Mapping[str, Any], reference: Mapping[str, Any]) -> Fidelity | None:
    """``side`` against ``reference`` (both bench result dicts); None when either lacks the
    figures (an older worker, or a side that did not run)."""
    ours, ref = side.get("first_logprobs"), reference.get("first_logprobs")
    ours_ids, ref_ids = side.get("greedy_ids"), reference.get("greedy_ids")
    if not ours or not ref or ours_ids is None or ref_ids is None:
        return None
    shared = [t for t in ref if t in ours]
    diff = max((abs(float(ours[t]) - float(ref[t])) for t in shared), default=float("nan"))
    top_ours = max(ours, key=lambda t: float(ours[t]))
    top_ref = max(ref, key=lambda t: float(ref[t]))
    return Fidelity(
        diff, len(shared), top_ours == top_ref, _common_prefix(ours_ids, ref_ids), len(ref_ids)
    )


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if int(x) != int(y):
            break
        n += 1
    return n


def fidelity_table(results: Mapping[str, Mapping[str, Any]], ours_label: str) -> Any:
    """A rich Table: ours and llama.cpp (when they ran) against ``results["hf"]``."""
    from rich.table import Table

    table = Table(title="fidelity vs HF transformers float32 (same prompt)")
    for name in ("side", "max |logprob diff|, first token", "same argmax", "greedy tokens equal"):
        table.add_column(name, justify="left" if name == "side" else "right")
    for key, label in (("ours", ours_label), ("llamacpp", "llama.cpp")):
        if key not in results:
            continue
        f = fidelity(results[key], results["hf"])
        if f is None:
            table.add_row(label, "not reported", "-", "-")
            continue
        table.add_row(
            label,
            f"{f.max_logprob_diff:.2e} (top {f.compared})",
            "yes" if f.same_argmax else "NO",
            f"{f.greedy_prefix} of {f.greedy_len}",
        )
    return table
