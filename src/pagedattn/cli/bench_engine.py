"""`pagedattn bench engine`: offline throughput of many requests on our engine, with prefix
caching on and off for prompts sharing a prefix (the same beside HF transformers and
llama.cpp: ``benchmarks/compare.py engine`` in a source checkout)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from pagedattn.bench.backends import BackendsOption
from pagedattn.cli.app import bench_app
from pagedattn.cli.errors import cli_errors
from pagedattn.cli.options import ActivationsOption, KvCacheDtypeOption, ModelOption
from pagedattn.config import KV_CACHE_DTYPES

METHOD = (
    "Method: elapsed = wall time from queuing every request (all at once: continuous "
    "batching) to the last one finishing. Greedy, EOS ignored; every projection on the GGUF's "
    "memory-mapped quantized blocks (LlamaModel.from_loaded). Peak RSS = the measuring "
    "process's. 'shared': the first half of every prompt is a common prefix; cached tok = "
    "prompt tokens served from the prefix cache."
)


@bench_app.command("engine")
def bench_engine(
    model: ModelOption = None,
    prompt_file: Annotated[
        Path | None, typer.Option(help="UTF-8 text to cut prompts from (default: a novel).")
    ] = None,
    num_requests: Annotated[int, typer.Option(help="Requests (all queued at once).")] = 64,
    min_prompt_len: Annotated[int, typer.Option(help="Shortest prompt, tokens.")] = 128,
    max_prompt_len: Annotated[int, typer.Option(help="Longest prompt, tokens.")] = 512,
    output_len: Annotated[int, typer.Option(help="Generated tokens per request.")] = 128,
    kv_cache_mib: Annotated[float, typer.Option(help="Our KV cache budget, MiB.")] = 2048.0,
    max_num_seqs: Annotated[int, typer.Option(help="Our most sequences per step.")] = 64,
    page_size: Annotated[int, typer.Option(help="Tokens per KV page.")] = 16,
    shared_prefix: Annotated[
        bool,
        typer.Option(
            "--shared-prefix/--no-shared-prefix",
            help="Also run 50% shared prefix prompts with prefix caching on and off.",
        ),
    ] = True,
    threads: Annotated[int, typer.Option(help="numba / BLAS / torch threads.")] = 2,
    seed: Annotated[int, typer.Option(help="Seed of the prompt sampling.")] = 0,
    backend: BackendsOption = None,
    activations: ActivationsOption = "float32",
    kv_cache_dtype: KvCacheDtypeOption = "float32",
    compare_kv_dtype: Annotated[
        str | None,
        typer.Option(
            metavar="float32|float16|int8",
            help="Also run with this KV dtype on the same --kv-cache-mib (a smaller dtype "
            "holds more sequences at once) and print the tok/s ratio.",
        ),
    ] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write the raw figures to this file.")
    ] = None,
) -> None:
    """Generated tok/s and requests/s for --num-requests greedy requests (EOS ignored) whose
    prompts are cut from real prose, on our engine's continuous batching, in a process of its
    own (its peak RSS)."""
    import os

    from rich.console import Console
    from rich.table import Table

    from pagedattn.bench import backends as bench_backends
    from pagedattn.bench.cpu import cpu_line
    from pagedattn.bench.sides import engine_args, progress_display, run_sides
    from pagedattn.bench.worker import compile_note

    console = Console()
    with cli_errors():
        path, args = engine_args(
            model,
            prompt_file,
            num_requests=num_requests,
            min_prompt_len=min_prompt_len,
            max_prompt_len=max_prompt_len,
            output_len=output_len,
            threads=threads,
            seed=seed,
            shared_prefix=shared_prefix,
            kv_cache_mib=kv_cache_mib,
            max_num_seqs=max_num_seqs,
            page_size=page_size,
            activations=activations,
            kv_cache_dtype=kv_cache_dtype,
        )
        if compare_kv_dtype is not None and compare_kv_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"--compare-kv-dtype: expected one of {KV_CACHE_DTYPES}, got {compare_kv_dtype!r}"
            )
        specs = bench_backends.parse_backends(backend)
        args.update(bench_backends.backend_args(specs[0]))
        with progress_display(console) as progress:
            results: dict[str, Any] = run_sides(progress, [("ours", "engine-ours")], args, threads)
            if compare_kv_dtype is not None:
                other = {**args, "kv_cache_dtype": compare_kv_dtype, "shared_prompts": []}
                results[f"kv_{compare_kv_dtype}"] = run_sides(
                    progress, [("ours", "engine-ours")], other, threads
                )["ours"]
            by_backend = bench_backends.measure_backends(
                "engine-ours", args, specs, threads, progress, results["ours"]
            )
        load = os.getloadavg()
    if json_out is not None:
        extra = {"backends": by_backend} if len(by_backend) > 1 else {}
        json_out.write_text(json.dumps({**results, **extra}, indent=2), encoding="utf-8")

    lens = [len(p) for p in args["prompts"]]
    table = Table(
        title=f"bench engine: {path.name}, {specs[0]}\n{num_requests} requests, prompts "
        f"{min(lens)}-{max(lens)} tokens ({sum(lens)} in all), {output_len} output tokens, "
        f"{threads} threads\nload average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    for name in ("run", "gen tok/s", "req/s", "elapsed s", "cached tok", "RSS MiB"):
        table.add_column(name, justify="left" if name == "run" else "right")
    ours = results["ours"]
    rows = [("ours", ours["main"], ours["peak_rss_mib"])]
    for key, label in (("shared_on", "ours shared, cache on"), ("shared_off", "ours shared, off")):
        if key in ours:
            rows.append((label, ours[key], None))
    for label, r, rss in rows:
        table.add_row(
            label,
            f"{r['generated_tok_s']:.1f}",
            f"{r['requests_s']:.3f}",
            f"{r['elapsed_s']:.1f}",
            str(r.get("cached_tokens", "-")),
            "" if rss is None else f"{rss:.0f}",
        )
    console.print(table)
    if note := compile_note(ours):
        console.print(note)
    if len(by_backend) > 1:
        backend_rows = [
            ("generated tok/s", "main.generated_tok_s"),
            ("requests/s", "main.requests_s"),
        ]
        console.print(
            bench_backends.backend_table("ours per backend, same run", by_backend, backend_rows)
        )
    console.print(cpu_line())
    if "shared_on" in ours:
        speedup = ours["shared_on"]["generated_tok_s"] / ours["shared_off"]["generated_tok_s"]
        console.print(f"prefix caching on vs off (50% shared prefix): {speedup:.2f}x")
    if compare_kv_dtype is not None:
        _print_kv_budget(console, results, kv_cache_dtype, compare_kv_dtype, args, kv_cache_mib)
    console.print(METHOD)


def _print_kv_budget(
    console: Any,
    results: dict[str, Any],
    dtype: str,
    other: str,
    args: dict[str, Any],
    kv_cache_mib: float,
) -> None:
    """Each KV dtype's pages, longest requests that fit and tok/s on the same budget."""
    from rich.table import Table

    from pagedattn.bench.kv_budget import kv_budget_ratio, kv_budget_rows

    sides = {dtype: results["ours"], other: results[f"kv_{other}"]}
    max_prompt = max(len(p) for p in args["prompts"])
    table = Table(title=f"the same requests on {kv_cache_mib:g} MiB of KV, per KV dtype")
    for name in ("KV dtype", "pages", "longest requests that fit", "gen tok/s"):
        table.add_column(name, justify="left" if name == "KV dtype" else "right")
    for row in kv_budget_rows(sides, max_prompt, int(args["output_len"]), int(args["page_size"])):
        table.add_row(*row)
    console.print(table)
    console.print(kv_budget_ratio(sides))
