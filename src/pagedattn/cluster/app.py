"""The Ray Serve application: an ingress deployment in front of an engine deployment.

``build_cluster_app`` binds both; :func:`run_cluster` starts it on a Ray cluster (a local one
by default) behind Serve's HTTP proxy, which is what ``pagedattn serve --replicas N`` runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from ray import serve
from ray.serve.config import RequestRouterConfig

from pagedattn.cluster.baselines import BASELINES, ROUTER_NAMES
from pagedattn.cluster.ingress import ClusterIngress
from pagedattn.cluster.replica import EngineReplica
from pagedattn.cluster.router import PrefixAwareRouter

APP_NAME = "pagedattn"
ENGINE_DEPLOYMENT = "PagedAttnEngine"
INGRESS_DEPLOYMENT = "PagedAttnIngress"
ROUTERS = ("prefix", *ROUTER_NAMES)


def default_model_name(model: str | None) -> str:
    return "SmolLM2-135M-Instruct" if model is None else Path(model).name.removesuffix(".gguf")


def build_cluster_app(
    model: str | None = None,
    *,
    replicas: int = 2,
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
    **engine_options: Any,
) -> Any:
    """The bound application (a ``ray.serve.Application``).

    Args:
        model, served_model_name, api_key, default_max_tokens: as ``pagedattn serve``.
        replicas: engine replicas (each one LLMEngine with its own page pool).
        router: ``prefix`` (:class:`PrefixAwareRouter`), ``pow2`` (Ray's power of two
            choices) or ``prefix_tree`` (Ray's PrefixCacheAffinityRouter, a character tree of
            the prompts it routed).
        max_load_spread: the prefix router's load guard (see :class:`PrefixIndex`).
        routing_stats_period_s: how often each replica reports its cached pages and metrics.
        replica_cpus: Ray CPUs each replica reserves; replica_threads: its Numba threads.
        max_ongoing_requests: requests one replica accepts at once (Serve queues the rest).
        autoscaling: Serve's ``autoscaling_config`` (then ``replicas`` is ignored).
        engine_options: :func:`pagedattn.engine.llm.engine_config` keywords, ``kv_store``
            (the tier every replica shares) included.

    Raises:
        ValueError: an unknown router, fewer than one replica.
    """
    if router not in ROUTERS:
        raise ValueError(f"router: expected one of {', '.join(ROUTERS)}, got {router!r}")
    if replicas < 1:
        raise ValueError(f"replicas: expected >= 1, got {replicas}")
    names = served_model_name or [default_model_name(model)]
    names = [names] if isinstance(names, str) else list(names)
    router_cls = PrefixAwareRouter if router == "prefix" else BASELINES[router]
    kwargs = {"max_load_spread": max_load_spread} if router == "prefix" else {}
    threads = str(replica_threads)
    scaling: dict[str, Any] = (
        {"autoscaling_config": autoscaling} if autoscaling else {"num_replicas": replicas}
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
        engine.bind(model, engine_options, names[0]),
        ENGINE_DEPLOYMENT,
        model,
        engine_options,
        names,
        api_key,
        default_max_tokens,
    )


def run_cluster(
    app: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    ray_address: str | None = None,
    blocking: bool = True,
) -> Any:
    """Start ``app`` behind Serve's HTTP proxy on ``host:port``: on the Ray cluster at
    ``ray_address`` (``auto``: the one on this machine), else on a new local one. Returns the
    ingress handle when not ``blocking``."""
    import ray

    if not ray.is_initialized():
        ray.init(address=ray_address)
    serve.start(http_options={"host": host, "port": port})
    return serve.run(app, name=APP_NAME, route_prefix="/", blocking=blocking)
