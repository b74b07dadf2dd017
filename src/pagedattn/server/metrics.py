"""Prometheus metrics of one server, in its own ``CollectorRegistry`` (no global state).

Names follow vLLM's (``vllm/v1/metrics/loggers.py``) under a ``pagedattn:`` prefix. Counters and
gauges are read from the engine's plain ``get_stats()`` snapshot at scrape time by a custom
collector (so they can never drift from the engine); histograms are observed by the engine
thread as outputs arrive:

- gauges: ``num_requests_running``, ``num_requests_waiting``, ``kv_cache_usage_perc`` (0..1,
  fraction of pages referenced by a sequence), ``num_free_pages``, ``num_used_pages``,
  ``num_pages``; per layer group (label ``group``: ``full``, or ``sliding_W`` for the
  sliding-window layers of a hybrid KV cache) ``kv_group_pages``, ``kv_group_resident_pages``
  (held by sequences) and ``kv_group_resident_bytes`` (their K and V in the group's layers);
- counters (``_total``): ``prompt_tokens``, ``generation_tokens``, ``prefix_cache_queries``
  and ``prefix_cache_hits`` (tokens; a recompute after preemption is neither), ``num_preemptions``,
  ``request_success{finished_reason}`` (every finished request by finish reason: "stop" and
  "length" completed, "abort", "error" and the rejections ``context_length_exceeded`` /
  ``cache_capacity_exceeded`` each their own, the rejections counted whether the server
  refused the request before the engine saw it or the engine did),
  ``page_evictions{reason}`` (lru / sliding_window / lossy);
- histograms: ``time_to_first_token_seconds`` (first token time - arrival, once per request
  that produced a token), ``inter_token_latency_seconds`` (gap between consecutive tokens of a
  request: one per generated token after a request's first), ``e2e_request_latency_seconds``
  (finish - arrival, every request that was scheduled), ``iteration_tokens_total`` and
  ``iteration_num_seqs`` (per model step). Arrival is when the server received the request,
  so TTFT and e2e include the time it queued behind running steps;
  ``model_forward_time_seconds`` (wall time of each model forward, timed around the model from
  outside by :meth:`ServerMetrics.instrument`).
- ``unexpected_errors_total``: requests (or streams) that ended in an unexpected 500 (an
  exception no handler expected; a request the engine failed is ``request_success`` with
  reason ``error`` instead);
- the persistent KV tier's families (``kv_store_*``, see :mod:`pagedattn.server.kv_store_metrics`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client import Counter as PromCounter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pagedattn.engine.outputs import FINISH_REASONS, RequestOutput
from pagedattn.server.kv_store_metrics import kv_store_metrics

if TYPE_CHECKING:
    from pagedattn.engine.step_report import StepReport

PREFIX = "pagedattn:"
LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


class EngineStatsCollector(Collector):
    """Counters and gauges from ``stats_fn()`` (an ``LLMEngine.get_stats()`` dict).

    Args:
        stats_fn: returns the latest stats snapshot; called at every scrape.
        model_name: value of the ``model_name`` label on every sample.
    """

    def __init__(self, stats_fn: Callable[[], Mapping[str, Any]], model_name: str) -> None:
        self.stats_fn = stats_fn
        self.model_name = model_name

    def collect(self) -> Iterable[Metric]:
        s = self.stats_fn()
        m = self.model_name

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(PREFIX + name, doc, labels=["model_name"])
            g.add_metric([m], value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(PREFIX + name, doc, labels=["model_name"])
            c.add_metric([m], value)
            return c

        pages, free = s["num_pages"], s["num_free_pages"]
        yield gauge("num_requests_running", "Requests in the running batch.", s["num_running"])
        yield gauge("num_requests_waiting", "Requests waiting to be scheduled.", s["num_waiting"])
        yield gauge(
            "num_requests_waiting_for_kv",
            "Of the waiting requests, those whose prefix is being read from the KV store.",
            s.get("num_waiting_for_kv", 0),
        )
        yield gauge(
            "kv_cache_usage_perc",
            "Fraction of KV pages referenced by a sequence (1 = full).",
            s["kv_cache_usage"],
        )
        yield gauge("num_pages", "KV pages in the pool.", pages)
        yield gauge("num_free_pages", "KV pages allocatable now (cached ones too).", free)
        yield gauge("num_used_pages", "KV pages held by sequences.", pages - free)
        yield from kv_group_gauges(s.get("kv_groups") or [], m)
        yield counter(
            "prompt_tokens", "Prompt tokens of admitted requests.", s["num_prompt_tokens"]
        )
        yield counter("generation_tokens", "Generated tokens.", s["num_generation_tokens"])
        yield counter(
            "prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache.",
            s["prefix_cache_queries"],
        )
        yield counter(
            "prefix_cache_hits",
            "Prompt tokens served from the prefix cache.",
            s["prefix_cache_hits"],
        )
        yield counter(
            "num_preemptions", "Sequences preempted for lack of pages.", s["num_preemptions"]
        )
        yield counter(
            "spec_decode_num_draft_tokens",
            "Tokens drafted by speculative decoding.",
            s.get("spec_num_drafted_tokens", 0),
        )
        yield counter(
            "spec_decode_num_accepted_tokens",
            "Drafted tokens the sampled tokens confirmed.",
            s.get("spec_num_accepted_tokens", 0),
        )
        yield gauge(
            "spec_decode_draft_acceptance_rate",
            "Accepted over drafted tokens since start (0 before any draft).",
            s.get("spec_acceptance_ratio", 0.0),
        )
        finished = CounterMetricFamily(
            PREFIX + "request_success",
            "Finished requests by finish reason.",
            labels=["model_name", "finished_reason"],
        )
        counts: Mapping[str, int] = s["num_finished"]
        for reason in sorted({*FINISH_REASONS, *counts}):
            finished.add_metric([m, reason], counts.get(reason, 0))
        yield finished
        evictions = CounterMetricFamily(
            PREFIX + "page_evictions",
            "KV pages evicted, by reason.",
            labels=["model_name", "reason"],
        )
        for reason, count in sorted(s["evictions"].items()):
            evictions.add_metric([m, reason], count)
        yield evictions
        yield from kv_store_metrics(s, m)  # the persistent tier, when there is one


class ServerMetrics:
    """The registry of one server: engine counters/gauges plus latency and batch histograms.

    Args:
        stats_fn: the engine stats snapshot (see :class:`EngineStatsCollector`).
        model_name: the served model name (``model_name`` label).
    """

    def __init__(self, stats_fn: Callable[[], Mapping[str, Any]], model_name: str) -> None:
        self.registry = CollectorRegistry()
        self.rejected: Counter[str] = Counter()  # refused by the server before the engine

        def stats() -> Mapping[str, Any]:
            s = dict(stats_fn())
            s["num_finished"] = Counter(s["num_finished"]) + self.rejected
            return s

        self.registry.register(EngineStatsCollector(stats, model_name))

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            h = Histogram(
                PREFIX + name, doc, ["model_name"], registry=self.registry, buckets=buckets
            )
            return h

        self.ttft = hist(
            "time_to_first_token_seconds", "Arrival to first token (s).", LATENCY_BUCKETS
        ).labels(model_name)
        self.itl = hist(
            "inter_token_latency_seconds", "Gap between consecutive tokens (s).", LATENCY_BUCKETS
        ).labels(model_name)
        self.e2e = hist(
            "e2e_request_latency_seconds", "Arrival to finish (s).", LATENCY_BUCKETS
        ).labels(model_name)
        self.iteration_tokens = hist(
            "iteration_tokens_total", "New tokens per model step.", BATCH_BUCKETS
        ).labels(model_name)
        self.iteration_num_seqs = hist(
            "iteration_num_seqs", "Sequences per model step.", BATCH_BUCKETS
        ).labels(model_name)
        self.model_forward = hist(
            "model_forward_time_seconds",
            "Wall time of one model forward (all layers, attention included) per step (s).",
            LATENCY_BUCKETS,
        ).labels(model_name)

        self.unexpected_errors = PromCounter(
            PREFIX + "unexpected_errors",
            "Requests or streams that ended in an unexpected 500.",
            ["model_name"],
            registry=self.registry,
        ).labels(model_name)

    def count_unexpected(self, exc: BaseException) -> None:
        """One request (or stream) ended by an exception nothing expected."""
        self.unexpected_errors.inc()

    def count_rejection(self, reason: str) -> None:
        """A request the server refused before the engine saw it, by finish reason."""
        self.rejected[reason] += 1

    def observe_step(self, report: StepReport) -> None:
        """One engine step, as its report tells it: its batch size in new tokens and in
        sequences, and its model forward's wall time (steps that ran no forward are not
        observed)."""
        if not report.ran_model:
            return
        self.iteration_tokens.observe(report.num_scheduled_tokens)
        self.iteration_num_seqs.observe(report.num_seqs)
        self.model_forward.observe(report.timings.run.forward_s)

    def observe_output(self, out: RequestOutput, last_token_time: float | None) -> float | None:
        """Observe one request output; returns the request's latest token time.

        Args:
            out: the output.
            last_token_time: what the previous call returned for this request (None at first).
        """
        m = out.metrics
        token_ids = [t for c in out.outputs for t in c.token_ids]
        if token_ids and m.last_token_time is not None:
            if last_token_time is None and m.first_token_time is not None:
                self.ttft.observe(m.first_token_time - m.arrival_time)
            elif last_token_time is not None:
                gap = (m.last_token_time - last_token_time) / len(token_ids)
                for _ in token_ids:
                    self.itl.observe(gap)
            last_token_time = m.last_token_time
        if out.finished and m.finish_time is not None and m.first_scheduled_time is not None:
            self.e2e.observe(m.finish_time - m.arrival_time)
        return last_token_time

    def render(self) -> bytes:
        """The Prometheus text exposition of the registry."""
        return bytes(generate_latest(self.registry))


def kv_group_gauges(groups: list[Mapping[str, Any]], model_name: str) -> Iterable[Metric]:
    """The per-layer-group gauges of a ``get_stats()["kv_groups"]`` list (see the module doc)."""
    docs = {
        "num_pages": ("kv_group_pages", "KV pages of the layer group's share of the pool."),
        "resident_pages": ("kv_group_resident_pages", "KV pages held by sequences, per group."),
        "resident_bytes": (
            "kv_group_resident_bytes",
            "Bytes of K and V held by sequences in the layer group's layers.",
        ),
    }
    for key, (name, doc) in docs.items():
        family = GaugeMetricFamily(PREFIX + name, doc, labels=["model_name", "group"])
        for group in groups:
            family.add_metric([model_name, str(group["name"])], float(group[key]))
        yield family
