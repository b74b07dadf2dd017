"""`pagedattn bench generate`: single-stream prefill / decode tok/s, peak RSS and start-up of
our engine (the same figures beside HF transformers and llama.cpp: ``benchmarks/compare.py
generate`` in a source checkout)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from pagedattn.bench.backends import BackendsOption
from pagedattn.cli.app import bench_app
from pagedattn.cli.errors import cli_errors
from pagedattn.cli.options import ActivationsOption, KvCacheDtypeOption, ModelOption

METHOD = (
    "Method: prefill = median of --repeats requests (max_tokens=1), first scheduled -> first "
    "token; decode = (N-1)/(last token - first token) of one greedy request, prefix caching "
    "off; every projection on the GGUF's memory-mapped quantized blocks "
    "(LlamaModel.from_loaded). Peak RSS = the measuring process's, model load included; KV "
    "cache = the pool's resident pages."
)


@bench_app.command("generate")
def bench_generate(
    model: ModelOption = None,
    prompt_file: Annotated[
        Path | None, typer.Option(help="UTF-8 text to cut the prompt from (default: a novel).")
    ] = None,
    prompt_len: Annotated[int, typer.Option(help="Prompt tokens.")] = 512,
    output_len: Annotated[int, typer.Option(help="Generated tokens for decode (>= 2).")] = 128,
    repeats: Annotated[int, typer.Option(help="Timed prefills (median).")] = 3,
    threads: Annotated[int, typer.Option(help="numba / BLAS / torch threads.")] = 2,
    startup: Annotated[
        bool, typer.Option(help='Also time cold `generate "Hi" --max-tokens 1` beside its floors.')
    ] = True,
    backend: BackendsOption = None,
    activations: ActivationsOption = "float32",
    kv_cache_dtype: KvCacheDtypeOption = "float32",
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write the raw figures to this file.")
    ] = None,
) -> None:
    """Prefill tok/s of one prompt and decode tok/s of one greedy stream on our engine, in a
    process of its own (its peak RSS), and the cold start-up of `generate`."""
    import os

    from rich.console import Console
    from rich.table import Table

    from pagedattn.bench import backends as bench_backends
    from pagedattn.bench.cpu import cpu_line
    from pagedattn.bench.sides import generate_args, progress_display, run_sides
    from pagedattn.bench.worker import compile_note

    console = Console()
    with cli_errors():
        path, args = generate_args(
            model,
            prompt_file,
            prompt_len=prompt_len,
            output_len=output_len,
            repeats=repeats,
            threads=threads,
            activations=activations,
            kv_cache_dtype=kv_cache_dtype,
        )
        specs = bench_backends.parse_backends(backend)
        args.update(bench_backends.backend_args(specs[0]))
        with progress_display(console) as progress:
            results: dict[str, Any] = run_sides(
                progress, [("ours", "generate-ours")], args, threads
            )
            by_backend = bench_backends.measure_backends(
                "generate-ours", args, specs, threads, progress, results["ours"]
            )
        load = os.getloadavg()
    if startup:  # the start-up table (see pagedattn.bench.startup)
        from pagedattn.bench.startup import report_startup

        with cli_errors():
            results["startup"] = report_startup(console, str(path), threads, repeats)
    if json_out is not None:
        extra = {"backends": by_backend} if len(by_backend) > 1 else {}
        json_out.write_text(json.dumps({**results, **extra}, indent=2), encoding="utf-8")

    table = Table(
        title=f"bench generate: {path.name}, {threads} threads, {specs[0]}, activations "
        f"{activations}, KV {kv_cache_dtype}, load average {load[0]:.2f} {load[1]:.2f} "
        f"{load[2]:.2f}"
    )
    table.add_column("metric")
    table.add_column("ours", justify="right")
    rows = [
        (f"prefill tok/s ({prompt_len}-token prompt)", "prefill_tok_s"),
        (f"decode tok/s ({output_len} tokens, greedy)", "decode_tok_s"),
        ("peak RSS MiB", "peak_rss_mib"),
        ("KV cache MiB (resident)", "kv_cache_mib"),
        ("peak RSS minus KV cache MiB", "peak_rss_minus_kv_mib"),
    ]
    for label, key in rows:
        value = results["ours"].get(key)
        table.add_row(label, "not reported" if value is None else f"{value:.1f}")
    console.print(table)
    if note := compile_note(results["ours"]):
        console.print(note)
    if len(by_backend) > 1:
        backend_rows = [("prefill tok/s", "prefill_tok_s"), ("decode tok/s", "decode_tok_s")]
        console.print(
            bench_backends.backend_table("ours per backend, same run", by_backend, backend_rows)
        )
    console.print(cpu_line())
    if activations == "int8":
        from pagedattn.model.int8_ir import INSTRUCTIONS, int8_path

        console.print(f"int8 dot products: {INSTRUCTIONS[int8_path()]} (the CPU compiled for)")
    console.print(METHOD)
