"""`pagedattn serve`: the OpenAI-compatible HTTP server (FastAPI + uvicorn)."""

from __future__ import annotations

from typing import Annotated

import typer

from pagedattn.cli.app import app


@app.command("serve")
def serve(
    model: Annotated[
        str | None, typer.Option(help="GGUF file or HF folder; default: the embedded SmolLM2.")
    ] = None,
    served_model_name: Annotated[
        list[str] | None,
        typer.Option(
            help="Name clients pass as `model`; repeat for several names; default: the file name."
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port.")] = 8000,
    api_key: Annotated[
        str | None,
        typer.Option(envvar="PAGEDATTN_API_KEY", help="Require `Authorization: Bearer KEY`."),
    ] = None,
    page_size: Annotated[int, typer.Option(min=1, help="Tokens per KV page.")] = 16,
    num_pages: Annotated[
        int | None, typer.Option(min=1, help="Pages in the KV pool (overrides --kv-cache-mib).")
    ] = None,
    kv_cache_mib: Annotated[
        float | None, typer.Option(min=0.001, help="KV memory budget in MiB (default 256).")
    ] = None,
    sliding_window: Annotated[
        int | None, typer.Option(min=1, help="Sliding window W in tokens; default: none.")
    ] = None,
    sinks: Annotated[int, typer.Option(min=0, help="Sink tokens kept with a window.")] = 0,
    max_num_seqs: Annotated[int, typer.Option(min=1, help="Most sequences per step.")] = 64,
    max_num_batched_tokens: Annotated[
        int, typer.Option(min=1, help="Token budget of one step.")
    ] = 2048,
    max_model_len: Annotated[
        int | None, typer.Option(min=1, help="Most tokens per request; default: model context.")
    ] = None,
    prefix_caching: Annotated[bool, typer.Option(help="Reuse cached prompt pages.")] = True,
    default_max_tokens: Annotated[
        int, typer.Option(min=1, help="Cap on a chat request's default max_tokens.")
    ] = 1024,
    seed: Annotated[int, typer.Option(min=0, help="Engine seed for unseeded requests.")] = 0,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
) -> None:
    """Serve /v1/models, /v1/completions, /v1/chat/completions, /health and /metrics."""
    try:
        import uvicorn

        from pagedattn.server.app import build_app
    except ImportError as exc:
        typer.echo(
            f"error: serve needs the server extra ({exc.name} is missing): "
            "pip install 'pagedattn[model,server]'",
            err=True,
        )
        raise typer.Exit(code=2) from exc
    try:
        server_app = build_app(
            model,
            served_model_name=served_model_name,
            api_key=api_key,
            default_max_tokens=default_max_tokens,
            page_size=page_size,
            num_pages=num_pages,
            kv_cache_mib=kv_cache_mib,
            sliding_window=sliding_window,
            num_sink_tokens=sinks,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            enable_prefix_caching=prefix_caching,
            seed=seed,
        )
    except (FileNotFoundError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from exc
    uvicorn.run(server_app, host=host, port=port, log_level=log_level)
