"""`pagedattn serve --replicas N`: the Ray Serve application (see :mod:`pagedattn.cluster`)."""

from __future__ import annotations

import os
from typing import Any

import typer

from pagedattn.cli.errors import flag_message

#: Read by Ray when it is imported: false makes a local Ray cluster bind its services to
#: 127.0.0.1 rather than this machine's outward address (single-machine mode).
LOOPBACK_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
#: Ray reports usage statistics to its project's server unless this is 0.
USAGE_STATS_ENV = "RAY_USAGE_STATS_ENABLED"


def serve_cluster(
    model: str | None,
    engine_options: dict[str, Any],
    *,
    replicas: int,
    ray_address: str | None,
    router: str,
    max_load_spread: int,
    replica_threads: int,
    served_model_name: list[str] | None,
    api_key: str | None,
    default_max_tokens: int,
    host: str,
    port: int,
    health_stall_s: float,
    max_request_bytes: int,
    log_level: str,
    webui: bool = True,
) -> None:
    """Build the cluster app and serve it on ``host:port`` until interrupted. Errors in the
    options print one line to stderr and exit 2.

    Without ``ray_address`` the local Ray cluster it starts listens on loopback only and
    sends no usage statistics (set RAY_USAGE_STATS_ENABLED=1 to send them)."""
    if ray_address is None:
        os.environ.setdefault(LOOPBACK_ONLY_ENV, "0")
        os.environ.setdefault(USAGE_STATS_ENV, "0")
    try:
        from pagedattn.cluster.app import build_cluster_app, run_cluster
    except ImportError as exc:
        typer.echo(
            f"error: --replicas needs the ray extra ({exc.name} is missing): "
            "pip install 'pagedattn[ray]'",
            err=True,
        )
        raise typer.Exit(code=2) from exc
    if replicas > 1 and engine_options.get("kv_store") is None:
        typer.echo(
            "warning: replicas without --kv-store share no pages: a session moved to another "
            "replica recomputes its prompt",
            err=True,
        )
    try:
        from pagedattn.engine.llm import engine_config

        engine_config(model, **engine_options)  # option errors before Ray starts
        app = build_cluster_app(
            model,
            replicas=replicas,
            served_model_name=served_model_name,
            api_key=api_key,
            default_max_tokens=default_max_tokens,
            router=router,
            max_load_spread=max_load_spread,
            replica_cpus=float(replica_threads),
            replica_threads=replica_threads,
            health_stall_s=health_stall_s,
            max_request_bytes=max_request_bytes,
            webui=webui,
            **engine_options,
        )
    except (FileNotFoundError, ValueError) as exc:
        typer.echo(f"error: {flag_message(str(exc).splitlines()[0])}", err=True)
        raise typer.Exit(code=2) from exc
    run_cluster(
        app, host=host, port=port, ray_address=ray_address, blocking=True, log_level=log_level
    )
