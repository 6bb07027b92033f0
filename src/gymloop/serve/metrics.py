"""/metrics by prometheus_client: requests by status, served tokens, request seconds, requests in
flight, and what the batcher counts (model version, engine batches, batched requests), one
registry per app. `InFlight` counts API requests from their first byte to their last (a streamed
answer is in flight until its final chunk)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Summary, generate_latest
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
        self.in_flight = 0      # changed on the event loop's thread only (InFlight)
        Gauge("gymloop_requests_in_flight", "API requests being answered.",
              registry=self.registry).set_function(lambda: self.in_flight)
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


class InFlight:
    """ASGI middleware: `metrics.in_flight` counts /v1/ requests until their response's last
    body message is sent (or the request fails)."""

    def __init__(self, app, metrics: ServeMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            return await self.app(scope, receive, send)
        metrics, done = self.metrics, False
        metrics.in_flight += 1

        async def sent(message):
            nonlocal done
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body") and not done:
                done = True
                metrics.in_flight -= 1

        try:
            await self.app(scope, receive, sent)
        finally:
            if not done:
                done = True
                metrics.in_flight -= 1
