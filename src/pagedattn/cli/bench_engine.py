"""`pagedattn bench engine`: offline throughput of many requests vs HF transformers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from pagedattn.bench.backends import BackendsOption
from pagedattn.cli.app import bench_app
from pagedattn.cli.options import (
    ActivationsOption,
    KvCacheDtypeOption,
    ModelOption,
    cli_errors,
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
    hf_batch_size: Annotated[int, typer.Option(help="HF generate batch size.")] = 32,
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
    hf: Annotated[bool, typer.Option("--hf/--no-hf", help="Measure HF transformers too.")] = True,
    backend: BackendsOption = None,
    activations: ActivationsOption = "float32",
    kv_cache_dtype: KvCacheDtypeOption = "float32",
    llama_batched_bench: Annotated[
        str | None,
        typer.Option(
            envvar="LLAMA_BATCHED_BENCH",
            help="llama.cpp's llama-batched-bench binary: measure llama.cpp's batched decoding "
            "(--hf-batch-size sequences of the mean prompt length) in the same run.",
        ),
    ] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write the raw figures to this file.")
    ] = None,
) -> None:
    """Generated tok/s and requests/s for --num-requests greedy requests (EOS ignored) whose
    prompts are cut from real prose, ours (continuous batching) vs HF transformers generate
    (batches of --hf-batch-size, left padding), each side in its own process."""
    import os

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from pagedattn.bench import backends as bench_backends
    from pagedattn.bench import llamacpp
    from pagedattn.bench.corpus import (
        corpus_token_ids,
        load_tokenizer,
        resolve_model_path,
        sample_prompts,
        shared_prefix_prompts,
    )
    from pagedattn.bench.cpu import cpu_line
    from pagedattn.bench.targets import ENGINE_TARGETS, print_targets
    from pagedattn.bench.worker import compile_note, run_worker

    console = Console()
    with cli_errors():
        for name, value in (
            ("num-requests", num_requests),
            ("output-len", output_len),
            ("hf-batch-size", hf_batch_size),
            ("threads", threads),
        ):
            if value < 1:
                raise ValueError(f"--{name}: expected an int >= 1, got {value}")
        path = resolve_model_path(model)
        tokenizer = load_tokenizer(model)
        need = num_requests * max_prompt_len + max_prompt_len
        ids = corpus_token_ids(tokenizer, prompt_file, need)
        prompts = sample_prompts(
            ids[max_prompt_len:], num_requests, min_prompt_len, max_prompt_len, seed
        )
        shared = shared_prefix_prompts(prompts, ids[:max_prompt_len]) if shared_prefix else []
        pad = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
        args: dict[str, Any] = {
            "model": str(path),
            "model_path": str(path),
            "prompts": prompts,
            "shared_prompts": shared,
            "output_len": output_len,
            "kv_cache_mib": kv_cache_mib,
            "max_num_seqs": max_num_seqs,
            "page_size": page_size,
            "batch_size": hf_batch_size,
            "pad_token_id": pad,
            "activations": activations,
            "kv_cache_dtype": kv_cache_dtype,
        }
        specs = bench_backends.parse_backends(backend)
        args.update(bench_backends.backend_args(specs[0]))
        results: dict[str, dict[str, Any]] = {}
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=console, transient=True) as progress:
            peer = llamacpp.available() and path.suffix == ".gguf"
            for side in ["ours"] + (["hf"] if hf else []) + (["llamacpp"] if peer else []):
                task = progress.add_task(f"{side}: loading the model", total=None)

                def update(phase: str, done: int, total: int, task: Any = task) -> None:
                    progress.update(
                        task, description=f"{phase} (requests)", completed=done, total=total
                    )

                results[side] = run_worker(f"engine-{side}", args, threads, update)
            if llama_batched_bench:
                progress.add_task("llama-batched-bench", total=None)
                mean_prompt = round(sum(len(p) for p in prompts) / len(prompts))
                results["llamacpp_batched"] = llamacpp.measure_batched(
                    llama_batched_bench, str(path), mean_prompt, output_len, hf_batch_size, threads
                )
            by_backend = bench_backends.measure_backends(
                "engine-ours", args, specs, threads, progress, results["ours"]
            )
        load = os.getloadavg()
    if json_out is not None:
        extra = {"backends": by_backend} if len(by_backend) > 1 else {}
        json_out.write_text(json.dumps({**results, **extra}, indent=2), encoding="utf-8")

    lens = [len(p) for p in prompts]
    table = Table(
        title=f"bench engine: {path.name}\n{num_requests} requests, prompts {min(lens)}-"
        f"{max(lens)} tokens ({sum(lens)} in all), {output_len} output tokens, {threads} "
        f"threads\nload average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    for name in ("run", "gen tok/s", "req/s", "elapsed s", "cached tok", "RSS MiB", "vs HF"):
        table.add_column(name, justify="left" if name == "run" else "right")
    ref = results["hf"]["main"]["generated_tok_s"] if hf else None
    rows = [("ours", results["ours"]["main"], results["ours"]["peak_rss_mib"])]
    if hf:
        rows.append(
            (f"HF bs={hf_batch_size}", results["hf"]["main"], results["hf"]["peak_rss_mib"])
        )
    if "llamacpp" in results:
        rows.append(
            (
                "llama.cpp (sequential)",
                results["llamacpp"]["main"],
                results["llamacpp"]["peak_rss_mib"],
            )
        )
    if "llamacpp_batched" in results:
        rows.append(
            (f"llama.cpp batched bs={hf_batch_size}", results["llamacpp_batched"]["main"], None)
        )
    for key, label in (("shared_on", "ours shared, cache on"), ("shared_off", "ours shared, off")):
        if key in results["ours"]:
            rows.append((label, results["ours"][key], None))
    for label, r, rss in rows:
        table.add_row(
            label,
            f"{r['generated_tok_s']:.1f}",
            f"{r['requests_s']:.3f}",
            f"{r['elapsed_s']:.1f}",
            str(r.get("cached_tokens", "-")),
            "" if rss is None else f"{rss:.0f}",
            "" if ref is None else f"{r['generated_tok_s'] / ref:.2f}x",
        )
    console.print(table)
    if note := compile_note(results["ours"]):
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
    if "llamacpp" in results:
        lc = results["llamacpp"]["main"]["generated_tok_s"]
        ours_tok_s = results["ours"]["main"]["generated_tok_s"]
        console.print(f"ours vs llama.cpp (sequential requests): {ours_tok_s / lc:.2f}x")
    else:
        console.print("llama.cpp: not measured (the llama_cpp package is not importable).")
    print_targets(console, ENGINE_TARGETS, results)
    if "shared_on" in results["ours"]:
        on, off = results["ours"]["shared_on"], results["ours"]["shared_off"]
        speedup = on["generated_tok_s"] / off["generated_tok_s"]
        console.print(f"prefix caching on vs off (50% shared prefix): {speedup:.2f}x")
    console.print(
        "Method: elapsed = wall time from queuing every request to the last one finishing "
        "(ours: continuous batching, all queued at once; HF: sequential generate calls on "
        "batches in prompt order, left padded, min_new_tokens = max_new_tokens). Greedy, EOS "
        "ignored, same model file, same prompt ids; HF float32, ours LlamaModel.from_loaded "
        "(every projection on the GGUF's memory-mapped quantized blocks). Peak RSS = each "
        "side's process. "
        "'shared': the first half of every prompt is a common prefix; cached tok = prompt "
        "tokens served from the prefix cache."
    )
