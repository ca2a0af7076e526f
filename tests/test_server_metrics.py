"""server.metrics on its own: what the middleware records, read back with prometheus_client's parser."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import prometheus_client
import pytest

from server.metrics import BUCKETS, Metrics, MetricsMiddleware, StepCacheCollector
from tests.helpers import metric_samples


def scrape(metrics: Metrics, *collectors) -> dict:
    body, content_type = metrics.exposition(None, *collectors)
    assert content_type == prometheus_client.CONTENT_TYPE_PLAIN_0_0_4
    return metric_samples(body.decode())


def request(middleware: MetricsMiddleware, route: str | None = "/shards") -> list[dict]:
    sent = []

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/x"}
    if route is not None:
        scope["route"] = SimpleNamespace(path=route)
    asyncio.run(middleware(scope, None, send))
    return sent


def answering(status: int):
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    return app


def test_the_middleware_counts_status_route_template_and_error_kind():
    metrics = Metrics()
    request(MetricsMiddleware(answering(200), metrics))
    request(MetricsMiddleware(answering(404), metrics), route=None)
    request(MetricsMiddleware(answering(503), metrics))
    samples = scrape(metrics)
    assert samples["taskdata_http_requests_total"] == {
        (("method", "GET"), ("route", "/shards"), ("status", "200")): 1,
        (("method", "GET"), ("route", "unmatched"), ("status", "404")): 1,
        (("method", "GET"), ("route", "/shards"), ("status", "503")): 1,
    }
    assert samples["taskdata_http_errors_total"] == {
        (("kind", "client"), ("method", "GET"), ("route", "unmatched")): 1,
        (("kind", "server"), ("method", "GET"), ("route", "/shards")): 1,
    }


def test_an_app_that_raises_before_answering_counts_as_a_server_error():
    async def broken(scope, receive, send):
        raise RuntimeError("boom")

    metrics = Metrics()
    with pytest.raises(RuntimeError, match="boom"):
        request(MetricsMiddleware(broken, metrics))
    samples = scrape(metrics)
    assert samples["taskdata_http_requests_total"] == {
        (("method", "GET"), ("route", "/shards"), ("status", "500")): 1
    }
    assert samples["taskdata_http_errors_total"] == {
        (("kind", "server"), ("method", "GET"), ("route", "/shards")): 1
    }


def test_latency_buckets_hold_every_duration_up_to_their_bound():
    metrics = Metrics()
    for seconds in (0.0005, 0.0005001, 0.002, 3.0):  # on a bound, just past it, on another, past the last
        metrics.observe("/shards", "GET", 200, seconds)
    buckets = {
        dict(labels)["le"]: value
        for labels, value in scrape(metrics)["taskdata_http_request_duration_seconds_bucket"].items()
    }
    assert list(buckets) == [*(repr(b) for b in BUCKETS), "+Inf"]  # the le values of the hand-written format
    assert buckets["0.0005"] == 1 and buckets["0.001"] == 2 and buckets["0.002"] == 3
    assert buckets["2.5"] == 3 and buckets["+Inf"] == 4


def test_odd_route_names_are_escaped_and_read_back_intact():
    metrics = Metrics()
    route = 'a "quoted"\\route\nwith a newline'
    metrics.observe(route, "GET", 200, 0.001)
    assert scrape(metrics)["taskdata_http_requests_total"] == {
        (("method", "GET"), ("route", route), ("status", "200")): 1
    }


def test_the_step_cache_is_read_when_scraped():
    class Answers:
        hits, misses = 5, 2

        def __len__(self):
            return 4

    answers = Answers()
    metrics = Metrics()
    first = scrape(metrics, StepCacheCollector(answers))
    answers.hits += 1
    second = scrape(metrics, StepCacheCollector(answers))
    assert first["taskdata_step_cache_lookups_total"] == {(("result", "hit"),): 5, (("result", "miss"),): 2}
    assert second["taskdata_step_cache_lookups_total"][(("result", "hit"),)] == 6
    assert second["taskdata_step_cache_entries"] == {(): 4}


def test_two_metrics_in_one_process_neither_collide_nor_share_counts():
    # prometheus_client refuses a second metric of one name in one registry: each Metrics has its own.
    a, b = Metrics(), Metrics()
    a.observe("/shards", "GET", 200, 0.001)
    assert "taskdata_http_requests_total" not in scrape(b)
    assert scrape(a)["taskdata_http_requests_total"] == {
        (("method", "GET"), ("route", "/shards"), ("status", "200")): 1
    }
    with pytest.raises(
        ValueError, match="Duplicated timeseries"
    ):  # the collision a shared registry would have
        prometheus_client.Counter("taskdata_http_requests_total", "again", registry=a.registry)
