"""Our engine beside its peers in one run: ``python benchmarks/compare.py generate|engine|gpu``.

Run from a source checkout (the repository root). Our side is the package's bench worker
(``pagedattn.bench.worker``: the same measurement as ``pagedattn bench generate`` / ``bench
engine``); each peer runs in a process of its own through ``benchmarks/peers`` on the same
model file, prompt ids and thread count. Every ratio is of figures measured in this run, ours
over the peer's; a peer that cannot run here (``llama_cpp`` not importable, ``--no-hf``) is
"not measured", never a stored number.

* ``generate``: prefill / decode tok/s, peak RSS and KV of one stream vs HF transformers and
  llama.cpp (llama-cpp-python), and each side's fidelity to HF float32.
* ``engine``: offline throughput of many requests vs HF ``generate`` in batches, llama.cpp's
  requests one after another, and llama.cpp's own batched decoding (``--llama-batched-bench``).
* ``gpu``: the torch backend vs HF on one device (``benchmarks/peers/gpu.py``; its options).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import typer  # noqa: E402

from benchmarks.comparisons import (  # noqa: E402
    ENGINE_COMPARISONS,
    GENERATE_COMPARISONS,
    print_comparisons,
)
from benchmarks.peers import TASKS  # noqa: E402
from benchmarks.peers import llamacpp as llamacpp_peer  # noqa: E402
from pagedattn.cli.options import ActivationsOption, KvCacheDtypeOption, ModelOption  # noqa: E402

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.split("\n")[0])
PromptFile = Annotated[
    Path | None, typer.Option(help="UTF-8 text to cut prompts from (default: a novel).")
]
Threads = Annotated[int, typer.Option(help="numba / BLAS / torch threads of every side.")]
Hf = Annotated[bool, typer.Option("--hf/--no-hf", help="Measure HF transformers.")]
LlamaCpp = Annotated[
    bool, typer.Option("--llamacpp/--no-llamacpp", help="Measure llama.cpp when importable.")
]
JsonOut = Annotated[Path | None, typer.Option("--json", help="Also write the raw figures here.")]


def _run(
    console: Any, sides: list[tuple[str, str]], args: dict[str, Any], threads: int
) -> dict[str, Any]:
    from pagedattn.bench.sides import progress_display, run_sides

    with progress_display(console) as progress:
        return run_sides(progress, sides, args, threads, tasks=TASKS, pythonpath=[REPO_ROOT])


def _peers(hf: bool, llamacpp: bool, path: Path) -> list[str]:
    """The peers to run: HF unless --no-hf, llama.cpp on a GGUF when importable."""
    gguf = path.suffix == ".gguf"
    return (["hf"] if hf else []) + (
        ["llamacpp"] if llamacpp and gguf and llamacpp_peer.available() else []
    )


def _cell(value: float | None) -> str:
    return "not reported" if value is None else f"{value:.1f}"


@app.command()
def generate(
    model: ModelOption = None,
    prompt_file: PromptFile = None,
    prompt_len: Annotated[int, typer.Option(help="Prompt tokens.")] = 512,
    output_len: Annotated[int, typer.Option(help="Generated tokens for decode (>= 2).")] = 128,
    repeats: Annotated[int, typer.Option(help="Timed prefills (median).")] = 3,
    threads: Threads = 2,
    hf: Hf = True,
    llamacpp: LlamaCpp = True,
    activations: ActivationsOption = "float32",
    kv_cache_dtype: KvCacheDtypeOption = "float32",
    json_out: JsonOut = None,
) -> None:
    """One stream: prefill and decode tok/s, peak RSS, KV cache, fidelity, vs HF and llama.cpp."""
    from rich.console import Console
    from rich.table import Table

    from benchmarks.fidelity import fidelity_table
    from pagedattn.bench.cpu import cpu_line
    from pagedattn.bench.sides import generate_args
    from pagedattn.bench.worker import compile_note
    from pagedattn.cli.errors import cli_errors

    console = Console()
    with cli_errors():
        path, args = generate_args(
            model, prompt_file, prompt_len=prompt_len, output_len=output_len, repeats=repeats,
            threads=threads, activations=activations, kv_cache_dtype=kv_cache_dtype,
        )  # fmt: skip
        peers = _peers(hf, llamacpp, path)
        sides = [(side, f"generate-{side}") for side in ["ours", *peers]]
        results = _run(console, sides, args, threads)
    if json_out is not None:
        json_out.write_text(json.dumps(results, indent=2), encoding="utf-8")
    load = os.getloadavg()
    table = Table(
        title=f"compare generate: {path.name}, {threads} threads, ours with activations "
        f"{activations} and KV {kv_cache_dtype}, load average {load[0]:.2f}"
    )
    table.add_column("metric")
    for name in ("ours", "HF transformers", "ours / HF", "llama.cpp", "ours / llama.cpp"):
        table.add_column(name, justify="right")
    for label, key in (
        (f"prefill tok/s ({prompt_len}-token prompt)", "prefill_tok_s"),
        (f"decode tok/s ({output_len} tokens, greedy)", "decode_tok_s"),
        ("peak RSS MiB", "peak_rss_mib"),
        ("KV cache MiB (resident)", "kv_cache_mib"),
        ("peak RSS minus KV cache MiB", "peak_rss_minus_kv_mib"),
    ):
        ours = results["ours"].get(key)
        row = [label, _cell(ours)]
        for peer in ("hf", "llamacpp"):
            if peer not in results:
                row += ["not measured", ""]
                continue
            theirs = results[peer].get(key)
            ratio = "" if ours is None or not theirs else f"{ours / theirs:.2f}x"
            row += [_cell(theirs), ratio]
        table.add_row(*row)
    console.print(table)
    if note := compile_note(results["ours"]):
        console.print(note)
    if "llamacpp" not in results:
        console.print("llama.cpp: not measured (llama_cpp is not importable, or --no-llamacpp).")
    if "hf" in results:
        console.print(fidelity_table(results, f"ours ({activations}, KV {kv_cache_dtype})"))
    print_comparisons(console, GENERATE_COMPARISONS, results)
    console.print(cpu_line())
    console.print(
        "Method. ours: as `pagedattn bench generate`. HF: float32, prefill = median time of "
        "one forward on the prompt (use_cache=True); decode = (N-1)/(t(generate N) - "
        "t(generate 1)), min_new_tokens = max_new_tokens. llama.cpp: llama-cpp-python, "
        "prefill = median time of evaluating the prompt, decode = greedy argmax of its "
        "logits, KV = its own report. Same GGUF, prompt ids and threads; peak RSS = each "
        "side's process, model load included."
    )


@app.command()
def engine(
    model: ModelOption = None,
    prompt_file: PromptFile = None,
    num_requests: Annotated[int, typer.Option(help="Requests (ours: all queued at once).")] = 64,
    min_prompt_len: Annotated[int, typer.Option(help="Shortest prompt, tokens.")] = 128,
    max_prompt_len: Annotated[int, typer.Option(help="Longest prompt, tokens.")] = 512,
    output_len: Annotated[int, typer.Option(help="Generated tokens per request.")] = 128,
    batch_size: Annotated[
        int, typer.Option(help="HF generate's and llama-batched-bench's batch size.")
    ] = 32,
    kv_cache_mib: Annotated[float, typer.Option(help="Our KV cache budget, MiB.")] = 2048.0,
    max_num_seqs: Annotated[int, typer.Option(help="Our most sequences per step.")] = 64,
    page_size: Annotated[int, typer.Option(help="Our tokens per KV page.")] = 16,
    threads: Threads = 2,
    seed: Annotated[int, typer.Option(help="Seed of the prompt sampling.")] = 0,
    hf: Hf = True,
    llamacpp: LlamaCpp = True,
    llama_batched_bench: Annotated[
        str | None,
        typer.Option(
            envvar="LLAMA_BATCHED_BENCH",
            help="llama.cpp's llama-batched-bench binary: its batched decoding (--batch-size "
            "sequences of the mean prompt length) in the same run.",
        ),
    ] = None,
    activations: ActivationsOption = "float32",
    kv_cache_dtype: KvCacheDtypeOption = "float32",
    json_out: JsonOut = None,
) -> None:
    """Offline throughput: ours (continuous batching) vs HF generate, llama.cpp, and
    llama-batched-bench."""
    from rich.console import Console
    from rich.table import Table

    from pagedattn.bench.cpu import cpu_line
    from pagedattn.bench.sides import engine_args
    from pagedattn.bench.worker import compile_note
    from pagedattn.cli.errors import cli_errors

    console = Console()
    with cli_errors():
        if batch_size < 1:
            raise ValueError(f"--batch-size: expected an int >= 1, got {batch_size}")
        path, args = engine_args(
            model, prompt_file, num_requests=num_requests, min_prompt_len=min_prompt_len,
            max_prompt_len=max_prompt_len, output_len=output_len, threads=threads, seed=seed,
            shared_prefix=False, kv_cache_mib=kv_cache_mib, max_num_seqs=max_num_seqs,
            page_size=page_size, batch_size=batch_size, activations=activations,
            kv_cache_dtype=kv_cache_dtype,
        )  # fmt: skip
        peers = _peers(hf, llamacpp, path)
        results = _run(console, [(s, f"engine-{s}") for s in ["ours", *peers]], args, threads)
        lens = [len(p) for p in args["prompts"]]
        if llama_batched_bench:
            results["llamacpp_batched"] = llamacpp_peer.measure_batched(
                llama_batched_bench, str(path), round(sum(lens) / len(lens)), output_len,
                batch_size, threads,
            )  # fmt: skip
    if json_out is not None:
        json_out.write_text(json.dumps(results, indent=2), encoding="utf-8")
    table = Table(
        title=f"compare engine: {path.name}, {num_requests} requests, prompts {min(lens)}-"
        f"{max(lens)} tokens, {output_len} output tokens, {threads} threads"
    )
    for name in ("run", "gen tok/s", "req/s", "elapsed s", "RSS MiB", "ours / run"):
        table.add_column(name, justify="left" if name == "run" else "right")
    ours = results["ours"]["main"]["generated_tok_s"]
    names = {
        "ours": "ours (continuous batching)",
        "hf": f"HF generate bs={batch_size}",
        "llamacpp": "llama.cpp (sequential)",
        "llamacpp_batched": f"llama-batched-bench bs={batch_size}",
    }
    for side, label in names.items():
        if side not in results:
            table.add_row(label, "not measured", "", "", "", "")
            continue
        r, rss = results[side]["main"], results[side].get("peak_rss_mib")
        table.add_row(
            label, f"{r['generated_tok_s']:.1f}", f"{r['requests_s']:.3f}",
            f"{r['elapsed_s']:.1f}", "" if rss is None else f"{rss:.0f}",
            f"{ours / r['generated_tok_s']:.2f}x",
        )  # fmt: skip
    console.print(table)
    if note := compile_note(results["ours"]):
        console.print(note)
    print_comparisons(console, ENGINE_COMPARISONS, results)
    console.print(cpu_line())
    console.print(
        "Method: elapsed = wall time of all requests, greedy, EOS ignored, same model file "
        "and prompt ids. ours: as `pagedattn bench engine`; HF: float32, sequential generate "
        "calls on batches in prompt order, left padded, min_new_tokens = max_new_tokens; "
        "llama.cpp: one request after another; llama-batched-bench: its own end-to-end time."
    )


@app.command(
    add_help_option=False,
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def gpu(ctx: typer.Context) -> None:
    """Ours on the torch backend vs HF transformers on one device (gpu --help: its options)."""
    from benchmarks.peers.gpu import main

    raise typer.Exit(main(list(ctx.args)))


if __name__ == "__main__":
    app()
