"""`pagedattn bench store`: TTFT of a long prompt recomputed vs restored from disk / Redis."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from pagedattn.cli.app import bench_app
from pagedattn.cli.errors import cli_errors
from pagedattn.cli.options import ModelOption


@bench_app.command("store")
def bench_store(
    model: ModelOption = None,
    prompt_file: Annotated[
        Path | None, typer.Option(help="UTF-8 text to cut the prompt from (default: a novel).")
    ] = None,
    prompt_len: Annotated[int, typer.Option(min=2, help="Prompt tokens.")] = 2000,
    page_size: Annotated[int, typer.Option(min=1, help="Tokens per KV page.")] = 16,
    repeats: Annotated[int, typer.Option(min=1, help="TTFT runs per row (median).")] = 3,
    redis: Annotated[
        str | None,
        typer.Option(
            help="redis://HOST:PORT/DB of a Redis to measure the Redis row on (its pages are "
            "written under a namespace of their own); without it the row is skipped."
        ),
    ] = None,
    threads: Annotated[
        int, typer.Option(min=1, help="numba / BLAS threads of the measuring process.")
    ] = 2,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write the raw figures to this file.")
    ] = None,
) -> None:
    """Time to first token of one --prompt-len prompt on a fresh engine: recomputed vs restored
    from the disk tier vs from Redis, as same-run ratios, and the tier's write
    throughput vs the same run's raw file-write bandwidth."""
    from rich.console import Console
    from rich.table import Table

    from pagedattn.bench.worker import compile_note, run_worker

    console = Console()
    with cli_errors():
        args = {
            "model": model,
            "prompt_file": None if prompt_file is None else str(prompt_file),
            "prompt_len": prompt_len,
            "page_size": page_size,
            "repeats": repeats,
            "redis_url": redis,
        }
        figures = run_worker(
            "store", args, threads, lambda what, *_: console.print(f"[dim]{what}...[/dim]")
        )
    recompute = figures["rows"]["recompute"]["ttft_s"]
    table = Table(
        title=f"bench store: {figures['model_name']}, {figures['prompt_tokens']}-token prompt, "
        f"page_size {page_size}, {figures['threads']} threads (numba and BLAS), median of "
        f"{repeats}"
    )
    for name in ("time to first token", "ms", "prompt tokens restored", "speedup vs recompute"):
        table.add_column(name, justify="right")
    for name, row in figures["rows"].items():
        speedup = recompute / row["ttft_s"]
        label = "recomputed" if name == "recompute" else f"restored from {name}"
        table.add_row(
            label, f"{row['ttft_s'] * 1e3:.1f}", str(row["cached_tokens"]), f"{speedup:.1f}x"
        )
    console.print(table)
    if note := compile_note(figures):
        console.print(note)
    for name, row in figures["rows"].items():
        if row.get("errors"):
            console.print(f"[yellow]{name} tier errors (misses): {row['errors']}[/yellow]")
    raw = figures["raw_write_bytes_s"]
    writes = Table(title="tier writes (synchronous put of the prompt's pages) vs raw file write")
    for name in ("writer", "MB/s", "% of raw file write"):
        writes.add_column(name, justify="right")
    writes.add_row("raw: one file, one fsync", f"{raw / 1e6:.0f}", "100%")
    for name, w in figures["write"].items():
        writes.add_row(
            f"{name} ({w['pages']} pages)",
            f"{w['bytes_s'] / 1e6:.0f}",
            f"{100 * w['bytes_s'] / raw:.0f}%",
        )
    console.print(writes)
    if redis is None:
        console.print(
            "redis: not measured; add --redis redis://HOST:PORT/DB to include it (e.g. "
            "redis-server --port 6390 --save '' & then --redis redis://127.0.0.1:6390/0)."
        )
    if json_out is not None:
        json_out.write_text(json.dumps(figures, indent=2), encoding="utf-8")
