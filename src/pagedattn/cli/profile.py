"""`pagedattn profile`: where the time of a workload goes, and which page / pool size serve it
best (``--sweep``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from pagedattn.cli.app import app
from pagedattn.cli.errors import cli_errors
from pagedattn.cli.options import ModelOption

SWEEP_KEYS = ("page_size", "kv_cache_mib", "num_pages", "max_num_seqs", "max_num_batched_tokens")


def _value(key: str, text: str) -> int | float:
    try:
        return float(text) if key == "kv_cache_mib" else int(text)
    except ValueError:
        raise ValueError(f"--sweep {key}: expected a number, got {text!r}") from None


def workload_prompts(
    tokenizer: Any, workload: str, prompt_len: int, num_requests: int, seed: int
) -> list[list[int]]:
    """``generate``: one prompt of ``prompt_len`` tokens of the shipped novel; ``engine``:
    ``num_requests`` prompts of ``prompt_len / 2 .. prompt_len`` tokens whose first halves are
    one shared prefix (as ``bench engine``'s shared-prefix run).

    Raises:
        ValueError: an unknown workload or non-positive sizes.
    """
    from pagedattn.bench.corpus import corpus_token_ids, sample_prompts, shared_prefix_prompts

    if workload not in ("generate", "engine"):
        raise ValueError(f"--workload: expected 'generate' or 'engine', got {workload!r}")
    if prompt_len < 2 or num_requests < 1:
        raise ValueError(
            f"--prompt-len >= 2, --num-requests >= 1 expected, got {prompt_len}, {num_requests}"
        )
    ids = corpus_token_ids(tokenizer, None, prompt_len * (num_requests + 2))
    if workload == "generate":
        return [ids[:prompt_len]]
    prompts = sample_prompts(ids[prompt_len:], num_requests, prompt_len // 2, prompt_len, seed)
    return shared_prefix_prompts(prompts, ids[:prompt_len])


def _print_profile(console: Any, r: Any, unfused: bool) -> None:
    from rich.table import Table

    steps, total = len(r.step_seconds), sum(r.step_seconds)
    table = Table(title=f"time per phase over {steps} steps, {r.generated_tokens} tokens")
    for col in ("phase", "seconds", "% of steps", "ms / step", "ms / token"):
        table.add_column(col, justify="right" if col != "phase" else "left")
    for name, sec in r.phases.items():
        table.add_row(
            name,
            f"{sec:.3f}",
            f"{100 * sec / total:.1f}" if total else "-",
            f"{1e3 * sec / max(steps, 1):.2f}",
            f"{1e3 * sec / max(r.generated_tokens, 1):.2f}",
        )
    console.print(table)
    if unfused:
        console.print(
            "unfused profiling mode: a timer around every op of the model (totals include them)"
        )
        ops = Table(title="model time per kind of op (unfused)")
        ops.add_column("op")
        ops.add_column("seconds", justify="right")
        for name, sec in sorted(r.by_op.items(), key=lambda kv: -kv[1]):
            ops.add_row(name, f"{sec:.3f}")
        console.print(ops)
        layers = Table(title="model time per layer (unfused)")
        layers.add_column("layer", justify="right")
        layers.add_column("seconds", justify="right")
        for li, sec in sorted(r.by_layer.items()):
            layers.add_row(str(li), f"{sec:.3f}")
        console.print(layers)
    console.print(
        f"per-token latency p50 {1e3 * r.latency_percentile(50):.1f} ms, "
        f"p99 {1e3 * r.latency_percentile(99):.1f} ms; throughput {r.throughput:.1f} tok/s; "
        f"prefix-cache hit ratio {r.prefix_hit_ratio:.3f}; "
        f"peak pages {r.peak_pages} of {r.num_pages}"
    )


@app.command("profile")
def profile(
    model: ModelOption = None,
    workload: Annotated[
        str, typer.Option(help="'generate' (one prompt) or 'engine' (a batch, shared prefix).")
    ] = "generate",
    prompt_len: Annotated[int, typer.Option(help="Prompt tokens (cut from the novel).")] = 256,
    max_tokens: Annotated[int, typer.Option(help="Generated tokens per request.")] = 64,
    num_requests: Annotated[int, typer.Option(help="Requests of the engine workload.")] = 16,
    page_size: Annotated[int, typer.Option(help="Tokens per KV page.")] = 16,
    kv_cache_mib: Annotated[float, typer.Option(help="KV cache budget in MiB.")] = 256.0,
    seed: Annotated[int, typer.Option(help="Seed of the prompt sampling.")] = 0,
    unfused: Annotated[
        bool, typer.Option("--unfused", help="Also time every op of every layer (labelled).")
    ] = False,
    cprofile: Annotated[
        Path | None, typer.Option("--cprofile", help="Write a cProfile dump of the steps.")
    ] = None,
    sweep: Annotated[
        list[str] | None,
        typer.Option(help="key=v1,v2 (repeatable): one run per configuration, then a table."),
    ] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the figures.")] = None,
) -> None:
    """Run a workload greedily (EOS ignored) with timers around each step phase and print where
    the time goes, per-token latency p50/p99, prefix-cache hit ratio and peak pages."""
    import cProfile
    import json

    from rich.console import Console
    from rich.table import Table

    from pagedattn.bench.profile import parse_sweep, profile_engine, sweep_rows
    from pagedattn.bench.unfused import UnfusedProfiler
    from pagedattn.engine.llm import engine_config
    from pagedattn.engine.llm_engine import LLMEngine
    from pagedattn.model.llama import LlamaModel
    from pagedattn.model.loader import load_model
    from pagedattn.sampling_params import SamplingParams

    console = Console()
    with cli_errors():
        grid = parse_sweep(sweep or [], SWEEP_KEYS)
        configs = [{k: _value(k, v) for k, v in g.items()} for g in grid]
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        loaded = load_model(model)
        net = LlamaModel.from_loaded(loaded)
        prompts = workload_prompts(loaded.tokenizer, workload, prompt_len, num_requests, seed)
        # Warm-up on a throwaway engine (JIT kernels load on first use; counters stay clean).
        warm = LLMEngine(engine_config(model, page_size=page_size, num_pages=64), net)
        warm.add_request(prompts[0][:40], SamplingParams(temperature=0.0, max_tokens=3))
        while warm.has_unfinished_requests():
            warm.step()
        results = []
        for config in configs:
            options: dict[str, Any] = {
                "page_size": page_size,
                "kv_cache_mib": kv_cache_mib,
                "speculative": "none",  # plain decoding's profile (bench spec measures drafts)
            }
            options.update(config)
            if "num_pages" in options:
                options.pop("kv_cache_mib")
            engine = LLMEngine(
                engine_config(model, **options),
                UnfusedProfiler(net) if unfused else net,
                loaded.tokenizer,
                model_fingerprint=loaded.fingerprint,
            )
            prof = cProfile.Profile() if cprofile is not None and not sweep else None
            r = profile_engine(engine, prompts, params, profiler=prof)
            if prof is not None and cprofile is not None:
                prof.dump_stats(str(cprofile))
            results.append(({k: str(v) for k, v in config.items()}, r))
        if not sweep:
            _print_profile(console, results[0][1], unfused)
            figures: Any = {
                "phases": results[0][1].phases,
                "p50_s": results[0][1].latency_percentile(50),
                "p99_s": results[0][1].latency_percentile(99),
                "throughput_tok_s": results[0][1].throughput,
                "prefix_hit_ratio": results[0][1].prefix_hit_ratio,
                "peak_pages": results[0][1].peak_pages,
                "by_op_unfused": results[0][1].by_op,
            }
        else:
            figures = rows = sweep_rows(results)
            table = Table(title=f"sweep: {workload} workload (machine load affects absolutes)")
            keys = list(grid[0])
            for col in [*keys, "tok/s", "TTFT s", "hit ratio", "peak pages", "KV MiB", "best"]:
                table.add_column(col)
            for row in rows:
                table.add_row(
                    *[str(row[k]) for k in keys],
                    f"{row['throughput_tok_s']:.1f}",
                    f"{row['ttft_s']:.3f}",
                    f"{row['prefix_hit_ratio']:.3f}",
                    f"{row['peak_pages']} / {row['num_pages']}",
                    f"{row['kv_mib']:.1f}",
                    "*" if row["best"] else "",
                )
            console.print(table)
        if json_out is not None:
            json_out.write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
