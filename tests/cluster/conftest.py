"""Cluster fixtures: one local Ray cluster (2 CPUs) with the cluster app per test module, on a
private redis-server, serving the tiny GGUF model with 2 single-threaded replicas."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures import metric_samples, tiny_gguf
from tests.redis_server import RedisServer, free_port

__all__ = ["tiny_gguf"]

# The local cluster listens on 127.0.0.1 only (read by Ray at import) and reports no usage
# statistics anywhere, as `pagedattn serve --replicas` starts it.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

OPTIONS: dict[str, Any] = {"page_size": 4, "num_pages": 256, "max_num_seqs": 16}


@dataclass
class Cluster:
    url: str
    redis: RedisServer
    model: str

    def chat(self, messages: list[dict[str, str]], **fields: Any) -> httpx.Response:
        body = {"messages": messages, "max_tokens": 8, "temperature": 0, **fields}
        return httpx.post(f"{self.url}/v1/chat/completions", json=body, timeout=120)

    def metrics(self) -> dict[str, float]:
        """Every sample of the ingress's /metrics, keyed ``name{label="v",...}`` (labels
        sorted, model_name dropped)."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        return metric_samples(text)

    def replicas(self) -> set[str]:
        """Replica ids whose families /metrics shows now."""
        out = set()
        for key in self.metrics():
            if key.startswith("pagedattn:num_pages{"):
                out.add(key.split('replica="')[1].split('"')[0])
        return out


def replica_actor(replica: str) -> Any:
    from pagedattn.cluster.app import APP_NAME, ENGINE_DEPLOYMENT

    name = f"SERVE_REPLICA::{APP_NAME}#{ENGINE_DEPLOYMENT}#{replica}"
    return ray.get_actor(name, namespace="serve")


def wait_for(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.25)


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest, tiny_gguf: Path) -> Iterator[Cluster]:
    """The cluster app with 2 replicas on a fresh local Ray cluster and redis-server; a
    module may set ``CLUSTER_OPTIONS`` (build_cluster_app keywords, ``autoscaling``
    instead of 2 replicas included)."""
    from pagedattn.cluster.app import build_cluster_app, run_cluster

    redis = RedisServer()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        port = free_port()
        options = {**OPTIONS, **getattr(request.module, "CLUSTER_OPTIONS", {})}
        scaling = options.get("autoscaling")
        if scaling is None:
            options.setdefault("replicas", 2)
        first = options.get("replicas") or scaling.get("initial_replicas", scaling["min_replicas"])
        app = build_cluster_app(str(tiny_gguf), kv_store=redis.url, **options)
        run_cluster(app, port=port, blocking=False)
        c = Cluster(f"http://127.0.0.1:{port}", redis, str(tiny_gguf))
        assert c.chat([{"role": "user", "content": "warm up"}]).status_code == 200
        wait_for(lambda: len(c.replicas()) == first, 30, "every replica's report")
        yield c
    finally:
        serve.shutdown()
        ray.shutdown()
        redis.stop()
