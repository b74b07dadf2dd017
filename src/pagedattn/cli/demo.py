"""`pagedattn demo`: stream random tokens through the paged KV cache, checked at every step."""

from __future__ import annotations

from typing import Annotated

import typer

from pagedattn.cli.app import app


@app.command("demo")
def demo(
    tokens: Annotated[
        int, typer.Option("--tokens", "-t", min=1, metavar="N", help="Tokens to stream.")
    ] = 512,
    page_size: Annotated[int, typer.Option(min=1, metavar="N", help="Tokens per page.")] = 16,
    num_pages: Annotated[
        int,
        typer.Option("--num-pages", "--max-pages", min=1, metavar="N", help="Pages in the pool."),
    ] = 8,
    sliding_window: Annotated[
        int,
        typer.Option(
            min=0,
            metavar="W",
            help="Window W in tokens; 0 = none (the pool's LRU page eviction bounds what is "
            "attended).",
        ),
    ] = 64,
    sinks: Annotated[int, typer.Option(min=0, metavar="S", help="Sink tokens S kept visible.")] = 0,
    num_heads: Annotated[int, typer.Option(min=1, metavar="N")] = 9,
    num_kv_heads: Annotated[int, typer.Option(min=1, metavar="N")] = 3,
    head_dim: Annotated[int, typer.Option(min=1, metavar="N")] = 64,
    seed: Annotated[int, typer.Option(metavar="N", help="Seed of the random tokens.")] = 0,
    backend: Annotated[
        str, typer.Option(help="numpy|torch|cupy: the array library of the page pool.")
    ] = "numpy",
    device: Annotated[
        str | None, typer.Option(help="cpu|cuda (default: numpy/torch cpu, cupy cuda).")
    ] = None,
) -> None:
    """Check every step against the dense reference; exit 1 on any mismatch above 1e-5 or if
    resident pages ever exceed --num-pages.

    A window needs ceil(W / page_size) + 1 pages plus the sink pages; a pool smaller than
    that is an error (exit 2) rather than a window silently cut to what the pool holds."""
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from pagedattn.backends import resolve_backend
    from pagedattn.cli.errors import cli_errors
    from pagedattn.stream.demo import run_demo

    if sliding_window:
        need = -(-sliding_window // page_size) + 1 + -(-sinks // page_size)
        if need > num_pages:
            raise typer.BadParameter(
                f"--sliding-window {sliding_window} with --sinks {sinks} needs {need} pages of "
                f"{page_size} tokens; --num-pages is {num_pages}",
                param_hint="--num-pages",
            )
    if num_heads % num_kv_heads:
        raise typer.BadParameter(
            f"--num-heads ({num_heads}) must be a multiple of --num-kv-heads ({num_kv_heads})"
        )
    with cli_errors():
        spec = resolve_backend(backend, device)
    console = Console()
    with Progress(console=console, transient=True, disable=tokens < 1000) as progress:
        task = progress.add_task("streaming", total=tokens)
        report = run_demo(
            tokens=tokens,
            page_size=page_size,
            max_pages=num_pages,
            sliding_window=sliding_window or None,
            num_sink_tokens=sinks,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            seed=seed,
            on_step=lambda: progress.advance(task),
            backend=spec.name,
            device=spec.device,
        )

    table = Table(
        title=f"pagedattn demo: {tokens} tokens, page_size {page_size}, backend {spec}",
        show_header=False,
    )
    table.add_row("pages resident (max / limit)", f"{report.max_pages_resident} / {num_pages}")
    table.add_row("pages resident (end)", str(report.final_pages_resident))
    table.add_row("pages evicted", str(report.pages_evicted))
    table.add_row("evictions by reason", ", ".join(f"{k}={v}" for k, v in report.evictions.items()))
    table.add_row(
        "tokens attended per step (min / mean / max)",
        f"{report.attended_min} / {report.attended_mean:.1f} / {report.attended_max}",
    )
    table.add_row("max abs error vs dense reference", f"{report.max_abs_error:.2e}")
    table.add_row(
        "per-token latency p50 / p99",
        f"{report.latency_p50_us:.1f} us / {report.latency_p99_us:.1f} us",
    )
    console.print(table)
    for failure in report.failures[:20]:
        console.print(f"[red]FAIL[/red] {failure}")
    if not report.ok:
        console.print(f"[red]{len(report.failures)} check(s) failed[/red]")
        raise typer.Exit(code=1)
    console.print("[green]all steps match the dense reference[/green]")
