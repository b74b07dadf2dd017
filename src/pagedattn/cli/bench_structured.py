"""`pagedattn bench structured`: per-token cost of a JSON-schema token mask vs unconstrained."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from pagedattn.cli.app import bench_app
from pagedattn.cli.errors import cli_errors
from pagedattn.cli.options import ModelOption, PageSizeOption


@bench_app.command("structured")
def bench_structured(
    model: ModelOption = None,
    num_requests: Annotated[int, typer.Option(metavar="N", help="Requests decoded together.")] = 8,
    max_tokens: Annotated[
        int, typer.Option(metavar="N", help="Cap on each constrained output.")
    ] = 256,
    page_size: PageSizeOption = 16,
    json_out: Annotated[
        Path | None,
        typer.Option("--json", metavar="PATH", help="Also write the raw figures to this file."),
    ] = None,
) -> None:
    """Decode the same batch with and without a JSON-schema mask (llguidance) and report the
    time per generated token of each and their ratio (same engine, same token counts)."""
    from rich.console import Console
    from rich.table import Table

    from pagedattn.bench.structured import run_structured_bench
    from pagedattn.cli.engine_options import EngineOptions

    console = Console()
    with cli_errors():
        options = EngineOptions(model=model, page_size=page_size, prefix_caching=False)
        engine = options.build_engine()
        result = run_structured_bench(engine, num_requests, max_tokens)
    if json_out is not None:
        json_out.write_text(json.dumps(result.as_dict(), indent=2), encoding="utf-8")
    load = os.getloadavg()
    table = Table(
        title=f"bench structured: {num_requests} requests, {result.tokens_generated} tokens, "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    for name in ("metric", "value"):
        table.add_column(name, justify="left" if name == "metric" else "right")
    table.add_row("constrained ms / token", f"{result.constrained_ms_per_token:.2f}")
    table.add_row("unconstrained ms / token", f"{result.unconstrained_ms_per_token:.2f}")
    table.add_row("constrained / unconstrained", f"{result.ratio:.3f}x")
    table.add_row("mask ms / token (inside the processor)", f"{result.mask_ms_per_token:.3f}")
    table.add_row("every output valid JSON of the schema", "yes" if result.all_valid else "NO")
    console.print(table)
    console.print(
        "Method: greedy chat requests ask for a bounded JSON list; the constrained run stops "
        "when each grammar completes, the unconstrained run generates exactly as many tokens "
        "per request (ignore_eos), prefix caching off, one warm-up request first."
    )
