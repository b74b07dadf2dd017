"""deploy/: the Grafana KV-store panels query metrics a server with a tier exposes; the
README documents the Redis settings."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from pagedattn.server.app import build_app
from tests.server.conftest import TINY_OPTIONS, serve_app
from tests.server.tiny_folder import write_tiny_folder

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def test_kv_store_panels_query_exposed_metrics(tmp_path: Path) -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "pagedattn-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"pagedattn:kv_store_[a-z0-9_]+", e)}
    assert len(used) >= 8
    app = build_app(
        str(write_tiny_folder(tmp_path / "tiny")), kv_store=str(tmp_path / "kv"), **TINY_OPTIONS
    )
    with serve_app(app) as srv:
        samples = set()
        for family in text_string_to_metric_families(httpx.get(f"{srv.url}/metrics").text):
            samples.update(s.name for s in family.samples)
    assert used - samples == set()


def test_readme_documents_redis_settings() -> None:
    text = (DEPLOY / "README.md").read_text()
    for needle in ("--kv-store redis://", "maxmemory", "allkeys-lru", 'save ""', "appendonly no"):
        assert needle in text, needle
