"""`pagedattn serve`: the OpenAI-compatible HTTP server (FastAPI + uvicorn)."""

from __future__ import annotations

import gc
from typing import Annotated

import typer

from pagedattn.cli.app import app
from pagedattn.cli.engine_options import EngineOptions
from pagedattn.cli.errors import flag_message
from pagedattn.cli.option_groups import option_group

SERVER = "Server"
CLUSTER = "Cluster (Ray Serve)"


@app.command("serve")
@option_group(EngineOptions)
def serve(
    engine_options: EngineOptions,
    served_model_name: Annotated[
        list[str] | None,
        typer.Option(
            metavar="NAME",
            help="Name clients pass as `model`; repeat for several names; default: the file name.",
            rich_help_panel=SERVER,
        ),
    ] = None,
    host: Annotated[
        str,
        typer.Option(
            metavar="ADDR", help="Address to bind (loopback by default).", rich_help_panel=SERVER
        ),
    ] = "127.0.0.1",
    port: Annotated[
        int,
        typer.Option(min=0, max=65535, metavar="PORT", help="TCP port.", rich_help_panel=SERVER),
    ] = 8000,
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar="PAGEDATTN_API_KEY",
            metavar="KEY",
            help="Require `Authorization: Bearer KEY`.",
            rich_help_panel=SERVER,
        ),
    ] = None,
    default_max_tokens: Annotated[
        int,
        typer.Option(
            min=1,
            metavar="N",
            help="Cap on a chat request's default max_tokens.",
            rich_help_panel=SERVER,
        ),
    ] = 1024,
    health_stall_s: Annotated[
        float,
        typer.Option(
            min=0.001,
            metavar="SECONDS",
            help="/health is a 503 after this long without progress.",
            rich_help_panel=SERVER,
        ),
    ] = 60.0,
    max_request_bytes: Annotated[
        int,
        typer.Option(
            min=1,
            metavar="BYTES",
            help="Largest request body; a larger one is a 413 (read in chunks, never whole).",
            rich_help_panel=SERVER,
        ),
    ] = 4 * 1024 * 1024,
    max_logprobs: Annotated[
        int,
        typer.Option(
            min=-1,
            metavar="N",
            help="Most logprobs per token a request may ask for; -1: the whole vocabulary.",
            rich_help_panel=SERVER,
        ),
    ] = 20,
    enable_server_load_tracking: Annotated[
        bool,
        typer.Option(
            help="GET /load counts the generation requests in flight.",
            rich_help_panel=SERVER,
        ),
    ] = False,
    webui: Annotated[
        bool,
        typer.Option(
            "--webui/--no-webui",
            help="Serve the chat page at / and the live KV-cache page at /kv.",
            rich_help_panel=SERVER,
        ),
    ] = True,
    max_seqs_per_request: Annotated[
        int | None,
        typer.Option(
            min=1,
            metavar="N",
            help="Most sequences (prompts x n) one request may ask for; more is a 400. "
            "Default: 4 x --max-num-seqs.",
            rich_help_panel=SERVER,
        ),
    ] = None,
    header_timeout_s: Annotated[
        float | None,
        typer.Option(
            "--header-timeout",
            min=0.001,
            metavar="SECONDS",
            help="Seconds a client has to send a request's headers; then a 408 and the "
            "connection is closed (slow-header clients cannot hold connections). Default 10. "
            "One process only: with --replicas, Ray Serve's HTTP proxy reads the headers.",
            rich_help_panel=SERVER,
        ),
    ] = None,
    log_level: Annotated[
        str, typer.Option(metavar="LEVEL", help="uvicorn log level.", rich_help_panel=SERVER)
    ] = "info",
    replicas: Annotated[
        int,
        typer.Option(
            min=1,
            metavar="N",
            help="Engine replicas on Ray Serve (> 1: the cluster app; share a --kv-store).",
            rich_help_panel=CLUSTER,
        ),
    ] = 1,
    ray_address: Annotated[
        str | None,
        typer.Option(
            metavar="ADDR",
            help="Run on this Ray cluster (`auto`: the one on this machine); default: a local one.",
            rich_help_panel=CLUSTER,
        ),
    ] = None,
    router: Annotated[
        str,
        typer.Option(
            metavar="NAME",
            help="Request router: prefix (longest cached prefix), pow2, prefix_tree (Ray's).",
            rich_help_panel=CLUSTER,
        ),
    ] = "prefix",
    max_load_spread: Annotated[
        int,
        typer.Option(
            min=0,
            metavar="N",
            help="Most requests a prefix's replica may run above the least loaded one.",
            rich_help_panel=CLUSTER,
        ),
    ] = 4,
    replica_threads: Annotated[
        int,
        typer.Option(
            min=1,
            metavar="N",
            help="CPUs (and Numba threads) per replica.",
            rich_help_panel=CLUSTER,
        ),
    ] = 1,
) -> None:
    """Serve /v1/models, /v1/completions, /v1/chat/completions, /v1/responses, /tokenize,
    /detokenize, /tokenizer_info, /version, /invocations, /load, /health, /metrics,
    /v1/kv/state, and the browser pages / (chat) and /kv (the KV cache, live).

    With --replicas > 1 or --ray-address, N engine replicas run on Ray Serve behind one
    ingress with the same routes (see deploy/README.md).

    Errors in the options print one line to stderr and exit 2."""
    model = engine_options.model
    try:
        engine_kwargs = engine_options.engine_kwargs()
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from exc
    if replicas > 1 or ray_address is not None:
        if max_logprobs != 20 or enable_server_load_tracking:
            flag = "--max-logprobs" if max_logprobs != 20 else "--enable-server-load-tracking"
            typer.echo(f"error: {flag} is served by one process only (no --replicas)", err=True)
            raise typer.Exit(code=2)
        if header_timeout_s is not None:
            typer.echo(
                "error: --header-timeout is served by one process only (no --replicas): Ray "
                "Serve's HTTP proxy reads the headers and has no such timeout; put a proxy with "
                "one in front of it (nginx's client_header_timeout)",
                err=True,
            )
            raise typer.Exit(code=2)
        from pagedattn.cli.serve_cluster import serve_cluster

        serve_cluster(
            model,
            engine_kwargs,
            replicas=replicas,
            ray_address=ray_address,
            router=router,
            max_load_spread=max_load_spread,
            replica_threads=replica_threads,
            served_model_name=served_model_name,
            api_key=api_key,
            default_max_tokens=default_max_tokens,
            host=host,
            port=port,
            health_stall_s=health_stall_s,
            max_request_bytes=max_request_bytes,
            log_level=log_level,
            webui=webui,
        )
        return
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
            health_stall_s=health_stall_s,
            max_request_bytes=max_request_bytes,
            max_logprobs=max_logprobs,
            enable_server_load_tracking=enable_server_load_tracking,
            webui=webui,
            max_seqs_per_request=max_seqs_per_request,
            **engine_kwargs,
        )
    except (FileNotFoundError, ValueError) as exc:
        typer.echo(f"error: {flag_message(str(exc).splitlines()[0])}", err=True)
        raise typer.Exit(code=2) from exc
    from pagedattn.server.header_timeout import DEFAULT_HEADER_TIMEOUT_S, header_timeout_protocol

    if header_timeout_s is None:
        header_timeout_s = DEFAULT_HEADER_TIMEOUT_S
    # The start-up heap (modules, model, tokenizer) lives as long as the server: kept out of
    # the collector's full passes, which a large reply's allocations trigger and which hold
    # the GIL (the event loop, the engine thread) while they walk every object.
    gc.collect()
    gc.freeze()

    uvicorn.run(
        server_app,
        host=host,
        port=port,
        log_level=log_level,
        http=header_timeout_protocol(header_timeout_s),
    )
