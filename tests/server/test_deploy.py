"""deploy/: the Grafana dashboard only queries metrics the server exposes; the Prometheus
example scrapes /metrics."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import RunningServer

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def test_dashboard_queries_exposed_metrics(server: RunningServer) -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "pagedattn-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(dashboard["panels"]) >= 10 and all(
        p["gridPos"]["w"] > 0 for p in dashboard["panels"]
    )
    samples = set()
    for family in text_string_to_metric_families(httpx.get(f"{server.url}/metrics").text):
        samples.update(s.name for s in family.samples)
    used = {m for e in exprs for m in re.findall(r"pagedattn:[a-z0-9_]+", e)}
    # tier-only (tests/storage checks them) and cluster-only (tests/cluster checks them)
    used = {m for m in used if not re.search(r":(kv_store|router|ingress)_", m)}
    assert used - samples == set()
    assert sum("histogram_quantile(0.99" in e for e in exprs) >= 3
    for needle in (
        "model_forward_time_seconds",
        "kv_cache_usage_perc",
        "prefix_cache_hits",
        "num_preemptions",
        "evictions",
    ):
        assert any(needle in e for e in exprs), needle


def test_prometheus_example_scrapes_metrics() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == ["127.0.0.1:8000"]
