"""`pagedattn bench generate`: single-stream prefill / decode tok/s vs HF transformers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from pagedattn.bench.backends import BackendsOption
from pagedattn.cli.app import bench_app
from pagedattn.cli.options import ActivationsOption, KvCacheDtypeOption, ModelOption, cli_errors


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
    hf: Annotated[bool, typer.Option("--hf/--no-hf", help="Measure HF transformers too.")] = True,
    startup: Annotated[
        bool, typer.Option(help='Also time cold `generate "Hi" --max-tokens 1` (2 s target).')
    ] = True,
    backend: BackendsOption = None,
    activations: ActivationsOption = "float32",
    kv_cache_dtype: KvCacheDtypeOption = "float32",
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write the raw figures to this file.")
    ] = None,
) -> None:
    """Prefill tok/s of one prompt and decode tok/s of one greedy stream, ours vs HF
    transformers on the same model file, each in its own process (peak RSS per side)."""
    import os

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from pagedattn.bench import backends as bench_backends
    from pagedattn.bench import llamacpp
    from pagedattn.bench.corpus import corpus_token_ids, load_tokenizer, resolve_model_path
    from pagedattn.bench.cpu import cpu_line
    from pagedattn.bench.targets import GENERATE_TARGETS, print_targets
    from pagedattn.bench.worker import compile_note, run_worker

    console = Console()
    with cli_errors():
        if prompt_len < 1 or output_len < 2 or repeats < 1 or threads < 1:
            raise ValueError(
                "expected --prompt-len >= 1, --output-len >= 2, --repeats >= 1, --threads >= 1"
            )
        path = resolve_model_path(model)
        ids = corpus_token_ids(load_tokenizer(model), prompt_file, prompt_len)[:prompt_len]
        args: dict[str, Any] = {
            "model": str(path),
            "model_path": str(path),
            "prompt_ids": ids,
            "output_len": output_len,
            "repeats": repeats,
            "activations": activations,
            "kv_cache_dtype": kv_cache_dtype,
        }
        specs = bench_backends.parse_backends(backend)
        args.update(bench_backends.backend_args(specs[0]))
        results: dict[str, dict[str, Any]] = {}
        columns = [
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
        ]
        with Progress(*columns, console=console, transient=True) as progress:
            peer = llamacpp.available() and path.suffix == ".gguf"
            for side in ["ours"] + (["hf"] if hf else []) + (["llamacpp"] if peer else []):
                task = progress.add_task(f"{side}: loading", total=repeats + 2)

                def update(phase: str, done: int, total: int, task: Any = task) -> None:
                    progress.update(task, description=phase, completed=done, total=total)

                results[side] = run_worker(f"generate-{side}", args, threads, update)
            by_backend = bench_backends.measure_backends(
                "generate-ours", args, specs, threads, progress, results["ours"]
            )
        load = os.getloadavg()
    if startup:  # issue 13: start-up row (its own table, see pagedattn.bench.startup)
        from pagedattn.bench.startup import report_startup

        with cli_errors():
            results["startup"] = report_startup(console, str(path), threads, repeats)
    if json_out is not None:
        extra = {"backends": by_backend} if len(by_backend) > 1 else {}
        json_out.write_text(json.dumps({**results, **extra}, indent=2), encoding="utf-8")

    table = Table(
        title=f"bench generate: {path.name}, {threads} threads, "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    for name in ("metric", "ours", "HF transformers", "ours / HF"):
        table.add_column(name, justify="right" if name != "metric" else "left")
    peer_result = results.get("llamacpp")
    peer_table = Table(title="llama.cpp, same GGUF and threads")
    for name in ("metric", "ours", "llama.cpp", "ours / llama.cpp"):
        peer_table.add_column(name, justify="right" if name != "metric" else "left")
    rows = [
        (f"prefill tok/s ({prompt_len}-token prompt)", "prefill_tok_s"),
        (f"decode tok/s ({output_len} tokens, greedy)", "decode_tok_s"),
        ("peak RSS MiB", "peak_rss_mib"),
    ]
    kv_rows = [
        ("KV cache MiB (resident)", "kv_cache_mib"),
        ("peak RSS minus KV cache MiB", "peak_rss_minus_kv_mib"),
    ]
    for label, key in rows:
        ours = results["ours"][key]
        ref = results["hf"][key] if hf else None
        ratio = "" if ref is None else f"{ours / ref:.2f}x"
        table.add_row(label, f"{ours:.1f}", "-" if ref is None else f"{ref:.1f}", ratio)
    for label, key in rows + kv_rows:
        if peer_result is not None:
            ours, lc = results["ours"].get(key), peer_result.get(key)
            ratio = "" if ours is None or not lc else f"{ours / lc:.2f}x"
            peer_table.add_row(label, _mib(ours), _mib(lc), ratio)
    console.print(table)
    if note := compile_note(results["ours"]):
        console.print(note)
    if peer_result is None:
        console.print("llama.cpp: not measured (the llama_cpp package is not importable).")
    else:
        console.print(peer_table)
    if len(by_backend) > 1:
        backend_rows = [("prefill tok/s", "prefill_tok_s"), ("decode tok/s", "decode_tok_s")]
        console.print(
            bench_backends.backend_table("ours per backend, same run", by_backend, backend_rows)
        )
    if hf:
        console.print(_fidelity_table(results, f"ours ({activations}, KV {kv_cache_dtype})"))
    print_targets(console, GENERATE_TARGETS, results)
    console.print(cpu_line())
    console.print(
        "Method. ours: prefill = median of --repeats requests (max_tokens=1), first scheduled -> "
        "first token; decode = (N-1)/(last token - first token) of one greedy request, prefix "
        "caching off. HF: prefill = median time of one forward on the prompt (use_cache=True); "
        "decode = (N-1)/(t(generate N) - t(generate 1)), min_new_tokens = max_new_tokens. "
        "Same GGUF, same prompt ids; HF float32, ours LlamaModel.from_loaded (every "
        "projection on the GGUF's memory-mapped quantized blocks). Peak RSS = each side's process, "
        "model load included. llama.cpp: llama-cpp-python on the same GGUF and thread count, "
        "prefill = median time of evaluating the prompt, decode = greedy argmax of its logits."
    )


def _mib(value: float | None) -> str:
    return "not reported" if value is None else f"{value:.1f}"


def _fidelity_table(results: dict[str, dict[str, Any]], ours_label: str) -> Any:
    """Each side against HF transformers float32 (:mod:`pagedattn.bench.fidelity`)."""
    from rich.table import Table

    from pagedattn.bench.fidelity import fidelity

    table = Table(title="fidelity vs HF transformers float32 (same prompt)")
    for name in ("side", "max |logprob diff|, first token", "same argmax", "greedy tokens equal"):
        table.add_column(name, justify="left" if name == "side" else "right")
    for key, label in (("ours", ours_label), ("llamacpp", "llama.cpp")):
        if key not in results:
            continue
        f = fidelity(results[key], results["hf"])
        if f is None:
            table.add_row(label, "not reported", "-", "-")
            continue
        table.add_row(
            label,
            f"{f.max_logprob_diff:.2e} (top {f.compared})",
            "yes" if f.same_argmax else "NO",
            f"{f.greedy_prefix} of {f.greedy_len}",
        )
    return table
