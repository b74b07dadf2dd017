"""`pagedattn bench spec`: decode tok/s with n-gram speculation against without, same process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from pagedattn.cli.app import bench_app
from pagedattn.cli.errors import cli_errors
from pagedattn.cli.options import ActivationsOption, ModelOption

METHOD = (
    "Method: each request alone, greedy, prefix caching off; decode tok/s = tokens after the "
    "first / (last token - first token), summed per workload; each round runs every request "
    "without, then with speculation (one process, one model); cpu: the same ratio in process "
    "CPU time, steadier than wall time on a shared machine. Ceiling: the speedup with free "
    "verify rows and perfect draft lengths, from the plain output replayed through the n-gram "
    "lookup (a token the lookup cannot predict takes a step of its own). Goals: >= 2x on "
    "grounded requests, >= 0.95x on free chat."
)


@bench_app.command("spec")
def bench_spec(
    model: ModelOption = None,
    rounds: Annotated[int, typer.Option(min=1, metavar="N", help="Interleaved rounds.")] = 2,
    max_tokens: Annotated[
        int, typer.Option(min=2, metavar="N", help="Tokens generated per request.")
    ] = 128,
    num_speculative_tokens: Annotated[
        int, typer.Option(min=1, max=64, metavar="N", help="Most drafts per step.")
    ] = 8,
    threads: Annotated[int, typer.Option(min=1, metavar="N", help="numba threads.")] = 2,
    activations: ActivationsOption = "float32",
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write the figures to this file.")
    ] = None,
) -> None:
    """Decode tok/s of our engine with `--speculative ngram` against without, on grounded
    requests (quote, summarise a novel's passage, rewrite JSON, edit code) and on free chat."""
    import numba

    from pagedattn.bench.cpu import cpu_line
    from pagedattn.bench.spec import report, run_spec_bench

    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]
    with cli_errors():
        results = run_spec_bench(
            model, rounds=rounds, max_tokens=max_tokens,
            num_speculative_tokens=num_speculative_tokens, activations=activations,
        )  # fmt: skip
    typer.echo(f"bench spec: {threads} threads, activations {activations}, {cpu_line()}")
    typer.echo(report(results))
    typer.echo(METHOD)
    if json_out is not None:
        json_out.write_text(json.dumps(results, indent=2), encoding="utf-8")
