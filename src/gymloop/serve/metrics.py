"""/metrics by prometheus_client: requests by status, served tokens, request seconds, and what
the batcher counts (model version, engine batches, batched requests), one registry per app."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Summary, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from .batcher import Batcher


class _BatcherCollector:
    """Read at scrape time from the batcher the app serves."""

    def __init__(self, batcher: Batcher) -> None:
        self.batcher = batcher

    def collect(self):
        b = self.batcher
        yield GaugeMetricFamily("gymloop_model_version", "The model version answering requests.", value=b.version)
        yield CounterMetricFamily("gymloop_engine_batches", "Engine batches run.", value=b.batches)
        yield CounterMetricFamily("gymloop_batched_requests", "Requests answered in those batches.",
                                  value=b.batched_requests)


class ServeMetrics:
    def __init__(self, batcher: Batcher) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("gymloop_requests", "Answered requests, by HTTP status.", ["status"],
                                registry=self.registry)
        self.tokens = Counter("gymloop_tokens_served", "Completion tokens served.", registry=self.registry)
        self.latency = Summary("gymloop_request_seconds", "Seconds from request to answer.", registry=self.registry)
        self.registry.register(_BatcherCollector(batcher))

    def count(self, status: int) -> None:
        self.requests.labels(str(status)).inc()

    def answered(self, tokens: int, seconds: float) -> None:
        self.count(200)
        self.tokens.inc(tokens)
        self.latency.observe(seconds)

    def by_status(self) -> dict[str, int]:
        """{status: requests} (the dashboard's)."""
        return {s.labels["status"]: int(s.value) for m in self.requests.collect() for s in m.samples
                if s.name.endswith("_total")}

    def render(self) -> bytes:
        return generate_latest(self.registry)
