"""`pagedattn eval report`: the lab's table, JSON and PNG from saved `eval ppl --json` files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from pagedattn.cli.errors import cli_errors
from pagedattn.cli.eval import eval_app
from pagedattn.cli.eval_table import print_table


@eval_app.command("report")
def eval_report(
    json_in: Annotated[
        list[Path], typer.Argument(help="JSON files written by `eval ppl --json` (merged).")
    ],
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write the merged records.")
    ] = None,
    plot: Annotated[Path | None, typer.Option(help="Write the two-panel PNG.")] = None,
    plot_budget: Annotated[
        int | None, typer.Option(help="Budget of the running-NLL panel (default: the smallest).")
    ] = None,
    title: Annotated[str, typer.Option(help="Title of the PNG.")] = "",
    markdown: Annotated[
        bool, typer.Option("--markdown", help="Print the table as a Markdown pipe table.")
    ] = False,
) -> None:
    """Table (and JSON / PNG) of records from earlier `eval ppl` runs, e.g. runs split over
    several processes; a later record of the same run (policy, position mode, budget, KV
    dtype, activations, method) wins."""
    import json

    from pagedattn.eval.plot import write_plot
    from pagedattn.eval.report import run_key, write_json

    with cli_errors():
        merged: dict[tuple[Any, ...], dict[str, Any]] = {}
        for path in json_in:
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
                raise ValueError(f"{path}: expected a JSON list of records")
            for r in data:
                missing = {"policy", "position_mode", "budget", "tokens", "perplexity"} - set(r)
                if missing:
                    raise ValueError(f"{path}: record without {sorted(missing)}")
                merged[run_key(r)] = r
        records = list(merged.values())
        if not records:
            raise ValueError("no records in the given files")
        print_table(records, markdown)
        if json_out is not None:
            write_json(json_out, records)
        if plot is not None:
            budgets = [r["budget"] for r in records if r["budget"] is not None]
            if not budgets:
                raise ValueError("--plot: needs records with a budget")
            write_plot(plot, records, plot_budget or min(budgets), title)
