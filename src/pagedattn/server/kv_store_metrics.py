"""Prometheus families of the persistent KV tier, from ``LLMEngine.get_stats()["kv_store"]``.

Under the ``pagedattn:`` prefix, label ``backend`` (``disk`` / ``redis``):

- counters: ``kv_store_restored_tokens`` (prompt tokens restored from the tier instead of
  recomputed), ``kv_store_pages_hit`` / ``kv_store_pages_missed`` (pages asked for),
  ``kv_store_pages_written``, ``kv_store_bytes_read`` / ``kv_store_bytes_written``,
  ``kv_store_dropped_writes`` (pages dropped because the write-through queue was full),
  ``kv_store_errors{kind}`` (bad records by check: truncated, checksum, bad_magic, namespace,
  hash, parent, tokens, shape; backend failures: io, timeout, unavailable, circuit_open);
- gauge ``kv_store_up`` (1 = reachable; 0 while Redis's circuit breaker is open);
- histograms ``kv_store_get_latency_seconds`` / ``kv_store_put_latency_seconds`` (one
  observation per batched call).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from pagedattn.storage.record import ERROR_KINDS

PREFIX = "pagedattn:"
BACKEND_ERROR_KINDS = ("io", "timeout", "unavailable", "circuit_open")


def kv_store_metrics(stats: Mapping[str, Any], model_name: str) -> Iterable[Metric]:
    """The tier's families; nothing when the engine has no tier."""
    s = stats.get("kv_store")
    if s is None:
        return
    labels = [model_name, s["backend"]]

    def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(PREFIX + name, doc, labels=["model_name", "backend"])
        c.add_metric(labels, value)
        return c

    yield counter(
        "kv_store_restored_tokens",
        "Prompt tokens restored from the KV tier instead of recomputed.",
        stats.get("tier_restored_tokens", 0),
    )
    yield counter("kv_store_pages_hit", "Pages found valid in the KV tier.", s["pages_hit"])
    yield counter("kv_store_pages_missed", "Pages asked for and not served.", s["pages_missed"])
    yield counter("kv_store_pages_written", "Pages written to the KV tier.", s["pages_written"])
    yield counter("kv_store_bytes_read", "Record bytes read from the KV tier.", s["bytes_read"])
    yield counter("kv_store_bytes_written", "Record bytes written.", s["bytes_written"])
    yield counter(
        "kv_store_dropped_writes",
        "Pages dropped because the write-through queue was full.",
        s["writes_dropped"],
    )
    errors = CounterMetricFamily(
        PREFIX + "kv_store_errors",
        "KV tier errors by kind (a bad record is a counted miss, then deleted).",
        labels=["model_name", "backend", "kind"],
    )
    counts: Mapping[str, int] = s["errors"]
    for kind in sorted({*ERROR_KINDS, *BACKEND_ERROR_KINDS, *counts}):
        errors.add_metric([*labels, kind], counts.get(kind, 0))
    yield errors
    up = GaugeMetricFamily(
        PREFIX + "kv_store_up",
        "1 while the KV tier is reachable.",
        labels=["model_name", "backend"],
    )
    up.add_metric(labels, 1.0 if s["up"] else 0.0)
    yield up
    for op in ("get", "put"):
        snap = s[f"{op}_latency"]
        h = HistogramMetricFamily(
            PREFIX + f"kv_store_{op}_latency_seconds",
            f"Latency of one batched {op} on the KV tier (s).",
            labels=["model_name", "backend"],
        )
        h.add_metric(
            labels, buckets=[(b, float(c)) for b, c in snap["buckets"]], sum_value=snap["sum"]
        )
        yield h
