"""The Ray Serve application: an ingress deployment in front of an engine deployment.

``build_cluster_app`` binds both; :func:`run_cluster` starts it on a Ray cluster (a local one
by default) behind Serve's HTTP proxy, which is what ``pagedattn serve --replicas N`` runs.
"""

from __future__ import annotations

import signal
import time
from typing import Any, cast

from pydantic import ValidationError
from ray import serve
from ray.serve.config import AutoscalingConfig, RequestRouterConfig

from pagedattn.cluster.baselines import BASELINES, ROUTER_NAMES
from pagedattn.cluster.ingress import ClusterIngress
from pagedattn.cluster.replica import EngineReplica
from pagedattn.cluster.router import PrefixAwareRouter
from pagedattn.server.app import DEFAULT_MAX_REQUEST_BYTES, default_served_names

APP_NAME = "pagedattn"
ENGINE_DEPLOYMENT = "PagedAttnEngine"
INGRESS_DEPLOYMENT = "PagedAttnIngress"
ROUTERS = ("prefix", *ROUTER_NAMES)


def autoscaling_config(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` checked as Serve's ``AutoscalingConfig``, which would drop a key it does
    not know (a typo such as ``max_replica`` would leave the deployment unscaled).

    Raises:
        ValueError: an unknown key (naming the known ones), a value Serve refuses.
    """
    known = set(AutoscalingConfig.model_fields)
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(
            f"autoscaling: unknown option(s) {', '.join(unknown)}; "
            f"Ray Serve's autoscaling_config takes {', '.join(sorted(known))}"
        )
    try:
        AutoscalingConfig(**options)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}" for e in exc.errors()
        )
        raise ValueError(f"autoscaling: {problems}") from exc
    return dict(options)


def build_cluster_app(
    model: str | None = None,
    *,
    replicas: int | None = None,
    served_model_name: str | list[str] | None = None,
    api_key: str | None = None,
    default_max_tokens: int = 1024,
    router: str = "prefix",
    max_load_spread: int = 4,
    routing_stats_period_s: float = 0.5,
    replica_cpus: float = 1.0,
    replica_threads: int = 1,
    max_ongoing_requests: int = 64,
    autoscaling: dict[str, Any] | None = None,
    health_stall_s: float = 60.0,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    webui: bool = True,
    **engine_options: Any,
) -> Any:
    """The bound application (a ``ray.serve.Application``).

    Args:
        model, served_model_name, api_key, default_max_tokens, health_stall_s,
            max_request_bytes, webui: as ``pagedattn serve`` (the stall limit is each
            replica's health check, the body limit and the pages the ingress's).
        replicas: engine replicas (each one LLMEngine with its own page pool); default 2,
            or what ``autoscaling`` decides.
        router: ``prefix`` (:class:`PrefixAwareRouter`), ``pow2`` (Ray's power of two
            choices) or ``prefix_tree`` (Ray's PrefixCacheAffinityRouter, a character tree of
            the prompts it routed).
        max_load_spread: the prefix router's load guard (see :class:`PrefixIndex`).
        routing_stats_period_s: how often each replica reports its cached pages and metrics.
        replica_cpus: Ray CPUs each replica reserves; replica_threads: its Numba threads.
        max_ongoing_requests: requests one replica accepts at once (Serve queues the rest).
        autoscaling: Serve's ``autoscaling_config`` (``min_replicas``, ``max_replicas``,
            ``initial_replicas``, ``target_ongoing_requests``, ``upscale_delay_s``...): the
            replica count follows the requests in flight instead of ``replicas``.
        engine_options: :func:`pagedattn.engine.llm.engine_config` keywords, ``kv_store``
            (the tier every replica shares) included.

    Raises:
        ValueError: an unknown router, fewer than one replica, both ``replicas`` and
            ``autoscaling``, an autoscaling option Serve does not know or a bad value.
    """
    if router not in ROUTERS:
        raise ValueError(f"router: expected one of {', '.join(ROUTERS)}, got {router!r}")
    if autoscaling is not None and replicas is not None:
        raise ValueError(
            "replicas: give either a fixed number of replicas or autoscaling "
            "(min_replicas / max_replicas), not both"
        )
    replicas = 2 if replicas is None else replicas
    if replicas < 1:
        raise ValueError(f"replicas: expected >= 1, got {replicas}")
    names = served_model_name or default_served_names(model)
    names = [names] if isinstance(names, str) else list(names)
    router_cls = PrefixAwareRouter if router == "prefix" else BASELINES[router]
    kwargs = {"max_load_spread": max_load_spread} if router == "prefix" else {}
    threads = str(replica_threads)
    scaling: dict[str, Any] = (
        {"num_replicas": replicas}
        if autoscaling is None
        else {"autoscaling_config": autoscaling_config(autoscaling)}
    )
    router_config: Any = RequestRouterConfig
    engine = cast(Any, serve.deployment(EngineReplica, name=ENGINE_DEPLOYMENT)).options(
        **scaling,
        max_ongoing_requests=max_ongoing_requests,
        ray_actor_options={
            "num_cpus": replica_cpus,
            "runtime_env": {"env_vars": {"NUMBA_NUM_THREADS": threads, "OMP_NUM_THREADS": threads}},
        },
        request_router_config=router_config(
            request_router_class=router_cls,
            request_router_kwargs=kwargs,
            request_routing_stats_period_s=routing_stats_period_s,
            request_routing_stats_timeout_s=max(1.0, 4 * routing_stats_period_s),
        ),
        health_check_period_s=2.0,
        health_check_timeout_s=30.0,
    )
    ingress_cls = serve.ingress()(ClusterIngress)
    ingress = cast(Any, serve.deployment(ingress_cls, name=INGRESS_DEPLOYMENT)).options(
        ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1024
    )
    return ingress.bind(
        engine.bind(model, engine_options, names[0], health_stall_s),
        ENGINE_DEPLOYMENT,
        names,
        api_key,
        default_max_tokens,
        max_request_bytes,
        webui,
    )


def run_cluster(
    app: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    ray_address: str | None = None,
    blocking: bool = True,
    log_level: str = "info",
) -> Any:
    """Start ``app`` behind Serve's HTTP proxy on ``host:port``: on the Ray cluster at
    ``ray_address`` (``auto``: the one on this machine), else on a new local one. Returns the
    ingress handle when not ``blocking``.

    ``blocking`` serves until SIGINT or SIGTERM, then removes what it started: the application
    from an existing cluster, or Serve and the whole local Ray cluster (replicas included)."""
    import ray

    own_ray = not ray.is_initialized() and ray_address is None
    if not ray.is_initialized():
        ray.init(address=ray_address)
    http = {"host": host, "port": port}
    logging = {"log_level": log_level.upper()}
    if not blocking:
        serve.start(http_options=http, logging_config=logging)
        return serve.run(app, name=APP_NAME, route_prefix="/")

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        serve.start(http_options=http, logging_config=logging)
        serve.run(app, name=APP_NAME, route_prefix="/")
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        if own_ray:
            serve.shutdown()  # type: ignore[no-untyped-call]
            ray.shutdown()
        else:
            serve.delete(APP_NAME)
    return None
