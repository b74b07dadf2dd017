"""`pagedattn eval ppl`: perplexity per KV eviction policy and budget on a long text."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from pagedattn.cli.app import app
from pagedattn.cli.errors import cli_errors
from pagedattn.cli.options import ModelOption

eval_app = typer.Typer(
    help="The perplexity lab: what KV eviction costs in model quality.", no_args_is_help=True
)
app.add_typer(eval_app, name="eval")


def parse_list(option: str, value: str, kind: type) -> list[Any]:
    """``"a,b"`` -> ``[kind(a), kind(b)]``.

    Raises:
        ValueError: an empty list or an item ``kind`` rejects, naming the option.
    """
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        raise ValueError(f"--{option}: expected a comma-separated list, got {value!r}")
    try:
        return [kind(v) for v in items]
    except ValueError:
        raise ValueError(f"--{option}: expected {kind.__name__} values, got {value!r}") from None


def run_grid(
    model: Any,
    ids: list[int],
    policies: list[str],
    modes: list[str],
    budgets: list[int],
    *,
    page_size: int,
    sinks: int,
    seed: int,
    fast: bool,
    progress: Any = None,
) -> list[dict[str, Any]]:
    """Every (policy, position mode, budget) run as JSON records, ``full`` first (once).

    The position mode changes only what sink keys see (inside a window RoPE scores depend on
    distances alone), so it is swept for ``sinks``; ``window`` and ``full`` run in absolute
    positions (the same numbers in both), ``h2o`` / ``random`` support absolute only.
    """
    from pagedattn.eval.perplexity import run_perplexity
    from pagedattn.eval.policies import make_policy

    plan: list[tuple[str, str, int | None]] = []
    if "full" in policies:
        plan.append(("full", "absolute", None))
    for name in policies:
        if name == "full":
            continue
        for mode in modes if name == "sinks" else ["absolute"]:
            plan.extend((name, mode, b) for b in budgets)
    # Build every policy first: a bad name or budget fails before any model work.
    built = [
        make_policy(
            name,
            page_size=page_size,
            budget=budget,
            position_mode=mode,
            num_sinks=sinks,
            seed=seed,
        )
        for name, mode, budget in plan
    ]
    records = []
    for (_, _, budget), policy in zip(plan, built, strict=True):
        result = run_perplexity(model, ids, policy, page_size=page_size, budget=budget, fast=fast)
        records.append(result.record())
        if progress is not None:
            progress(result)
    return records


@eval_app.command("ppl")
def eval_ppl(
    model: ModelOption = None,
    policy: Annotated[
        str, typer.Option(help="Comma-separated: full, window, sinks, h2o, random.")
    ] = "full,window,sinks,h2o,random",
    position_mode: Annotated[
        str, typer.Option(help="Comma-separated position modes for sinks: absolute, shifted.")
    ] = "absolute,shifted",
    budget: Annotated[
        str, typer.Option(help="Comma-separated KV budgets in tokens (sink pages included).")
    ] = "128,256,512,1024",
    tokens: Annotated[int, typer.Option(help="Tokens of the text to score.")] = 4096,
    text: Annotated[
        Path | None,
        typer.Option(help="UTF-8 text file; default: the novel shipped in the package."),
    ] = None,
    page_size: Annotated[int, typer.Option(help="Tokens per KV page.")] = 16,
    sinks: Annotated[int, typer.Option("--sinks", help="Sink tokens of the sinks policy.")] = 4,
    seed: Annotated[int, typer.Option(help="Seed of the random policy.")] = 0,
    fast: Annotated[
        bool,
        typer.Option(
            "--fast/--token-by-token",
            help="Chunked prefill for policies that do not read attention (same numbers).",
        ),
    ] = True,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write every record.")] = None,
    plot: Annotated[Path | None, typer.Option(help="Write a two-panel PNG (matplotlib).")] = None,
    plot_budget: Annotated[
        int | None, typer.Option(help="Budget of the running-NLL panel (default: the smallest).")
    ] = None,
) -> None:
    """Perplexity of the model over --tokens tokens of a text under each KV policy and budget,
    fed through the paged cache as StreamingLLM measured it (arXiv 2309.17453, Sec. 4.1)."""
    from rich.console import Console

    from pagedattn.bench.corpus import corpus_token_ids
    from pagedattn.eval.report import write_json, write_plot
    from pagedattn.model.llama import LlamaModel
    from pagedattn.model.loader import load_model

    console = Console(stderr=True)
    with cli_errors():
        policies = parse_list("policy", policy, str)
        modes = parse_list("position-mode", position_mode, str)
        budgets = parse_list("budget", budget, int)
        if tokens < 2:
            raise ValueError(f"--tokens: expected an int >= 2, got {tokens}")
        if page_size < 1:
            raise ValueError(f"--page-size: expected an int >= 1, got {page_size}")
        if plot_budget is not None and plot_budget not in budgets:
            raise ValueError(
                f"--plot-budget: expected one of --budget {budgets}, got {plot_budget}"
            )
        if plot is not None:
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                raise ValueError(
                    "--plot: needs matplotlib (pip install 'pagedattn[plot]'; make run installs it)"
                ) from None
        loaded = load_model(model)
        ids = corpus_token_ids(loaded.tokenizer, text, tokens)[:tokens]
        net = LlamaModel.from_loaded(loaded)

        done: list[dict[str, Any]] = []

        def progress(r: Any) -> None:
            done.append(r.record())
            if json_out is not None:  # after every run, so a long sweep keeps what it measured
                write_json(json_out, done)
            console.print(
                f"{r.policy:>6} {r.position_mode:>8} budget {r.budget!s:>5}: "
                f"ppl {r.perplexity:.3f}  peak pages {r.peak_pages}  ({r.seconds:.0f} s)"
            )

        records = run_grid(
            net,
            ids,
            policies,
            modes,
            budgets,
            page_size=page_size,
            sinks=sinks,
            seed=seed,
            fast=fast,
            progress=progress,
        )
        print_table(records)
        if json_out is not None:
            write_json(json_out, records)
        if plot is not None:
            name = loaded.source.name
            title = f"{name}, {len(ids)} tokens, page size {page_size}"
            write_plot(plot, records, plot_budget or min(budgets), title)


def print_table(records: list[dict[str, Any]]) -> None:
    """The policy x budget table (perplexity, ratio to full) on stdout."""
    from rich.console import Console
    from rich.table import Table

    from pagedattn.eval.report import table_rows

    tokens = sorted({r["tokens"] for r in records})
    header, rows = table_rows(records)
    table = Table(title=f"perplexity over {', '.join(map(str, tokens))} tokens (ratio to full)")
    for h in header:
        table.add_column(h)
    for row in rows:
        table.add_row(*row)
    Console().print(table)


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
) -> None:
    """Table (and JSON / PNG) of records from earlier `eval ppl` runs, e.g. runs split over
    several processes; a later record of the same (policy, position mode, budget) wins."""
    import json

    from pagedattn.eval.report import write_json, write_plot

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
                merged[(r["policy"], r["position_mode"], r["budget"], r["tokens"])] = r
        records = list(merged.values())
        if not records:
            raise ValueError("no records in the given files")
        print_table(records)
        if json_out is not None:
            write_json(json_out, records)
        if plot is not None:
            budgets = [r["budget"] for r in records if r["budget"] is not None]
            if not budgets:
                raise ValueError("--plot: needs records with a budget")
            write_plot(plot, records, plot_budget or min(budgets), title)
