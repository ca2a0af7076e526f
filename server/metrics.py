"""Request metrics through ``prometheus_client``, collected by a pure ASGI middleware.

Each app has its own ``CollectorRegistry`` (never the library's global default one), so several apps in
one process, as in the tests, count apart. Routes are labelled by their template (``/runs/{name}``),
never by the raw path, so that the number of series stays bounded whatever clients send; requests that
match no route share the label ``unmatched``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.assignments import AnswerCache

__all__ = ["BUCKETS", "Metrics", "MetricsMiddleware", "StepCacheCollector"]

# Seconds; /shards answers in about a millisecond, so the buckets are fine below 10 ms.
BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Metrics:
    """One app's counters and latency histograms per (route, method), in its own registry; thread-safe."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._requests = Counter(
            "taskdata_http_requests_total",
            "HTTP requests answered, by route template, method and status.",
            ("route", "method", "status"),
            registry=self.registry,
        )
        self._errors = Counter(
            "taskdata_http_errors_total",
            "HTTP error answers by route, method and kind (client: 4xx, server: 5xx).",
            ("route", "method", "kind"),
            registry=self.registry,
        )
        self._latency = Histogram(
            "taskdata_http_request_duration_seconds",
            "Time from request start to the end of the response body.",
            ("route", "method"),
            buckets=BUCKETS,
            registry=self.registry,
        )
        # (route, method, status) -> the series a request of that kind counts in, looked up once per kind:
        # a labels() call validates and locks, about 1.5 us (measured), four times a counter increment.
        self._series: dict[tuple[str, str, int], tuple[Counter, Counter | None, Histogram]] = {}

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        series = self._series.get((route, method, status))
        if series is None:  # two threads may both get here: labels() returns the same children
            errors = None
            if status >= 400:
                errors = self._errors.labels(route, method, "server" if status >= 500 else "client")
            series = self._series[route, method, status] = (
                self._requests.labels(route, method, str(status)),
                errors,
                self._latency.labels(route, method),
            )
        requests, errors, latency = series
        requests.inc()
        if errors is not None:
            errors.inc()
        latency.observe(seconds)

    def exposition(self, accept: str | None, *collectors: Collector) -> tuple[bytes, str]:
        """The registry's metrics and ``collectors``', in the format ``accept`` asks for, and its content type.

        As ``prometheus_client``'s own handlers do: OpenMetrics when the scraper asks for it (Prometheus
        does), else the Prometheus text format 0.0.4.
        """
        encoder, content_type = choose_encoder(accept or "")
        return encoder(_Together((self.registry, *collectors))), content_type


class StepCacheCollector:
    """Lookups and entries of the server's step cache, read when scraped (the cache counts them itself)."""

    def __init__(self, answers: AnswerCache):
        self.answers = answers

    def collect(self) -> Iterator[Metric]:
        lookups = CounterMetricFamily(
            "taskdata_step_cache_lookups",
            "Serialized (run, data shard, step) answers looked up, by result.",
            labels=("result",),
        )
        lookups.add_metric(("hit",), self.answers.hits)
        lookups.add_metric(("miss",), self.answers.misses)
        yield lookups
        yield GaugeMetricFamily(
            "taskdata_step_cache_entries", "Serialized steps held in memory.", value=len(self.answers)
        )


class _Together:
    """Collectors scraped as one (``generate_latest`` takes anything with ``collect()``)."""

    def __init__(self, collectors: tuple[Collector, ...]):
        self.collectors = collectors

    def collect(self) -> Iterator[Metric]:
        for collector in self.collectors:
            yield from collector.collect()


class MetricsMiddleware:
    """Times every HTTP request and records it with its route template and final status."""

    def __init__(self, app: ASGIApp, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # if the app raises before answering, the server answers 500

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            self.metrics.observe(path, scope["method"], status, time.perf_counter() - started)
