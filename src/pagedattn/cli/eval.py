"""`pagedattn eval ppl`: perplexity per KV dtype, eviction policy and budget on a long text."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from pagedattn.cli.app import PlainHelpTyper, app
from pagedattn.cli.errors import cli_errors
from pagedattn.cli.options import ActivationsOption, ModelOption

eval_app = PlainHelpTyper(
    help="The perplexity lab: what KV eviction and KV dtypes cost in model quality.",
    no_args_is_help=True,
)
app.add_typer(eval_app, name="eval")

METHODS = ("stream", "chunks")


def parse_list(option: str, value: str, kind: Any) -> list[Any]:
    """``"a,b"`` -> ``[kind(a), kind(b)]``.

    Raises:
        ValueError: an empty list or an item ``kind`` rejects, naming the option.
    """
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        raise ValueError(f"--{option}: expected a comma-separated list, got {value!r}")
    try:
        return [kind(v) for v in items]
    except ValueError:
        raise ValueError(f"--{option}: expected {kind.__name__} values, got {value!r}") from None


@eval_app.command("ppl")
def eval_ppl(
    model: ModelOption = None,
    policy: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated: full, window, sinks, h2o, random (default: all; without h2o "
            "on a model whose layers keep their own sliding windows)."
        ),
    ] = None,
    position_mode: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated position modes for sinks: absolute, shifted (default: both; "
            "absolute on a model whose layers keep their own sliding windows)."
        ),
    ] = None,
    budget: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated KV budgets in tokens (sink pages included); default "
            "128,256,512,1024 unless --budget-bytes is given."
        ),
    ] = None,
    budget_bytes: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated KV budgets in bytes of K and V (512KiB, 2MiB, ...): as many "
            "whole pages as fit in each dtype's page bytes."
        ),
    ] = None,
    kv_cache_dtype: Annotated[
        str,
        typer.Option(
            "--kv-cache-dtype",
            help="Comma-separated storage dtypes of the KV pool: float32, float16, int8 (the "
            "pool dtypes the kernels hold; an unknown one is an error listing them).",
        ),
    ] = "float32",
    activations: ActivationsOption = "float32",
    method: Annotated[
        str,
        typer.Option(
            help="stream: every next token, fed through the cache (StreamingLLM); chunks: "
            "llama-perplexity's method (non-overlapping chunks of --chunk-tokens, each scored on "
            "its second half; full cache only)."
        ),
    ] = "stream",
    chunk_tokens: Annotated[int, typer.Option(help="Chunk length of --method chunks.")] = 512,
    tokens: Annotated[int, typer.Option(help="Tokens of the text to score.")] = 4096,
    text: Annotated[
        Path | None,
        typer.Option(help="UTF-8 text file; default: the novel shipped in the package."),
    ] = None,
    page_size: Annotated[int, typer.Option(help="Tokens per KV page.")] = 16,
    sinks: Annotated[int, typer.Option("--sinks", help="Sink tokens of the sinks policy.")] = 4,
    seed: Annotated[int, typer.Option(help="Seed of the random policy.")] = 0,
    fast: Annotated[
        bool,
        typer.Option(
            "--fast/--token-by-token",
            help="Chunked prefill for policies that do not read attention (same numbers).",
        ),
    ] = True,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write every record.")] = None,
    plot: Annotated[Path | None, typer.Option(help="Write a two-panel PNG (matplotlib).")] = None,
    plot_budget: Annotated[
        int | None, typer.Option(help="Budget of the running-NLL panel (default: the smallest).")
    ] = None,
) -> None:
    """Perplexity of the model over --tokens tokens of a text under each KV dtype, policy and
    budget, fed through the paged cache as StreamingLLM measured it (arXiv 2309.17453, Sec. 4.1),
    or by llama-perplexity's chunks (--method chunks)."""
    from rich.console import Console

    from pagedattn.bench.corpus import corpus_token_ids
    from pagedattn.cli.eval_table import print_table
    from pagedattn.eval.chunks import run_chunked_perplexity
    from pagedattn.eval.grid import plan_grid, run_grid
    from pagedattn.eval.group_tables import is_hybrid
    from pagedattn.eval.kv_pools import check_kv_cache_dtype, parse_bytes
    from pagedattn.eval.plot import write_plot
    from pagedattn.eval.report import write_json
    from pagedattn.model.llama import LlamaModel
    from pagedattn.model.loader import load_model

    console = Console(stderr=True)
    with cli_errors():
        from pagedattn.eval.policies import POLICIES

        policies = parse_list("policy", policy or ",".join(POLICIES), str)
        modes = parse_list("position-mode", position_mode or "absolute,shifted", str)
        default = "128,256,512,1024" if budget_bytes is None else None
        spelled = budget if budget is not None else default
        budgets = [] if spelled is None else parse_list("budget", spelled, int)
        sizes = [
            parse_bytes(v)
            for v in ([] if budget_bytes is None else parse_list("budget-bytes", budget_bytes, str))
        ]
        dtypes = [
            check_kv_cache_dtype(d, "--kv-cache-dtype")
            for d in parse_list("kv-cache-dtype", kv_cache_dtype, str)
        ]
        if method not in METHODS:
            raise ValueError(f"--method: expected one of {', '.join(METHODS)}, got {method!r}")
        if method == "chunks" and policies != ["full"]:
            raise ValueError(
                f"--method chunks: scores the full cache only (--policy full), got {policy!r}"
            )
        if tokens < 2:
            raise ValueError(f"--tokens: expected an int >= 2, got {tokens}")
        if page_size < 1:
            raise ValueError(f"--page-size: expected an int >= 1, got {page_size}")
        if plot_budget is not None and plot_budget not in budgets:
            raise ValueError(
                f"--plot-budget: expected one of --budget {budgets}, got {plot_budget}"
            )
        if plot is not None:
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                raise ValueError(
                    "--plot: needs matplotlib (pip install 'pagedattn[plot]'; make run installs it)"
                ) from None
        loaded = load_model(model)
        ids = corpus_token_ids(loaded.tokenizer, text, tokens)[:tokens]
        bos = loaded.tokenizer.bos_token_id if loaded.tokenizer.adds_bos else None
        # streamed as the engine encodes a prompt: after the BOS token when the vocabulary adds one
        stream_ids = ids if bos is None else [bos, *ids[: tokens - 1]]
        net = LlamaModel.from_loaded(loaded, activations)
        if is_hybrid(net):  # the defaults hold what runs per layer group
            policies = policies if policy else [p for p in policies if p != "h2o"]
            modes = modes if position_mode else ["absolute"]
        plan = plan_grid(
            net,
            policies,
            modes,
            budgets,
            page_size=page_size,
            sinks=sinks,
            seed=seed,
            dtypes=dtypes,
            budget_bytes=sizes,
        )

        done: list[dict[str, Any]] = []

        def progress(r: Any) -> None:
            done.append(r.record())
            if json_out is not None:  # after every run, so a long sweep keeps what it measured
                write_json(json_out, done)
            groups = "".join(
                f"  {g['name']} {g['peak_pages']} pages {g['peak_bytes'] / 2**20:.1f} MiB"
                for g in r.extra.get("kv_groups", ())
            )
            console.print(
                f"{r.kv_cache_dtype:>8} {r.policy:>6} {r.position_mode:>8} budget {r.budget!s:>5}: "
                f"ppl {r.perplexity:.3f}  peak pages {r.peak_pages}{groups}  ({r.seconds:.0f} s)"
            )

        if method == "chunks":
            for dtype in dtypes:
                progress(
                    run_chunked_perplexity(
                        net,
                        ids,
                        chunk_tokens=chunk_tokens,
                        page_size=page_size,
                        kv_cache_dtype=dtype,
                        bos_token_id=bos,
                    )
                )
            records = done
        else:
            records = run_grid(
                net, stream_ids, plan, page_size=page_size, fast=fast, progress=progress
            )
        print_table(records)
        if json_out is not None:
            write_json(json_out, records)
        if plot is not None:
            name = loaded.source.name
            title = f"{name}, {len(ids)} tokens, page size {page_size}"
            bounded = [r["budget"] for r in records if r["budget"] is not None]
            write_plot(plot, records, plot_budget or min(bounded, default=0), title)
