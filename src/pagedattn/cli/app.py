"""The typer applications every subcommand module registers itself on."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="pagedattn",
    help="CPU-first paged-attention inference engine.",
    no_args_is_help=True,
    add_completion=False,
)
bench_app = typer.Typer(
    help="Benchmarks, reported as ratios against a reference measured in the same run.",
    no_args_is_help=True,
)
app.add_typer(bench_app, name="bench")
