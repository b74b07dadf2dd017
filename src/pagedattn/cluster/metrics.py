"""ClusterMetrics: the ingress's ``/metrics``: every replica's families, labelled by replica,
plus the router's counters, the requests the ingress refused and those it ended with an
unexpected 500.

Each replica's Prometheus text arrives with its routing report (see
:mod:`pagedattn.cluster.replica`), so it is at most one report period old. A family keeps the
name and help it has on a single server (``pagedattn:num_requests_running``...) and gains a
``replica`` label; a replica that is gone drops out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from pagedattn.cluster.prefix_index import REASONS, RouterCounters


def relabel(texts: dict[str, str]) -> list[Metric]:
    """Merge Prometheus texts (replica id -> text) into families whose samples carry
    ``replica="<id>"``."""
    families: dict[str, Metric] = {}
    for replica, text in sorted(texts.items()):
        for family in text_string_to_metric_families(text):
            merged = families.get(family.name)
            if merged is None:
                merged = Metric(family.name, family.documentation, family.type, family.unit)
                families[family.name] = merged
            for s in family.samples:
                labels = {**s.labels, "replica": replica}
                merged.add_sample(s.name, labels, s.value, s.timestamp, s.exemplar)
    return list(families.values())


class _Collector(Collector):
    def __init__(self, owner: ClusterMetrics) -> None:
        self.owner = owner

    def collect(self) -> Iterable[Metric]:
        texts, counters = self.owner.sources()
        yield from relabel(texts)
        routed = CounterMetricFamily(
            "pagedattn:router_requests",
            "Requests the router sent, by why: the longest cached prefix, the load guard, "
            "or no replica holding the prompt's first page.",
            labels=["reason"],
        )
        matched = CounterMetricFamily(
            "pagedattn:router_matched_pages",
            "Prompt pages the chosen replica held when the router sent the request.",
        )
        hashed = CounterMetricFamily(
            "pagedattn:router_prompt_pages", "Full prompt pages the router hashed."
        )
        if counters is not None:
            for reason in REASONS:
                routed.add_metric([reason], counters.routed[reason])
            matched.add_metric([], counters.matched_pages)
            hashed.add_metric([], counters.prompt_pages)
            yield from (routed, matched, hashed)
        rejected = CounterMetricFamily(
            "pagedattn:ingress_rejections",
            "Requests the ingress refused before any replica saw them, by code.",
            labels=["reason"],
        )
        for reason, n in sorted(self.owner.rejected.items()):
            rejected.add_metric([reason], n)
        yield rejected
        unexpected = CounterMetricFamily(
            "pagedattn:ingress_unexpected_errors",
            "Requests or streams the ingress ended with an unexpected 500.",
        )
        unexpected.add_metric([], self.owner.unexpected)
        yield unexpected


class ClusterMetrics:
    """What the ingress's ``/metrics`` renders.

    Args:
        sources: () -> (replica id -> its latest Prometheus text, the router's counters or
            None).
    """

    def __init__(self, sources: Callable[[], tuple[dict[str, str], RouterCounters | None]]) -> None:
        self.sources = sources
        self.rejected: Counter[str] = Counter()
        self.unexpected = 0
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))

    def count_rejection(self, reason: str) -> None:
        self.rejected[reason] += 1

    def count_unexpected(self, exc: BaseException) -> None:
        """One request (or stream) the ingress ended with an unexpected 500."""
        self.unexpected += 1

    def render(self) -> bytes:
        return generate_latest(self.registry)


def router_sources(deployment: str) -> Callable[[], tuple[dict[str, str], Any]]:
    """The sources of :class:`ClusterMetrics` from the router of ``deployment``'s handle in
    this process (nothing before the first request created it)."""
    from pagedattn.cluster.registry import ROUTERS

    def sources() -> tuple[dict[str, str], Any]:
        router = ROUTERS.get(deployment)
        if router is None:
            return {}, None
        reports = router.replica_reports()
        texts = {rid: str(r["metrics"]) for rid, r in reports.items() if "metrics" in r}
        return texts, router.router_counters()

    return sources
