"""Cost of the request metrics: the middleware on every request, and a /metrics scrape, in-process.

Run: PYTHONPATH=. python bench/bench_metrics.py [--write]

Two apps are built alike (``create_app``, the bench_server.py plan over 64-shard synthetic caches), one
without ``MetricsMiddleware``; requests go straight into the ASGI app (no sockets, no HTTP client), so
the middleware's share is not hidden under the network's. The rounds of the two apps are interleaved and
the median round is reported, per request:

- ``/shards`` step cache hits (the cheapest answer, where the middleware's share is largest) and
  ``/healthz``; the middleware's cost is the difference between the two apps (new (host, step) pairs
  add ~0.7 ms of index math whose run-to-run spread hides a few microseconds);
- the middleware alone, around an ASGI app that answers at once (the difference above is within the
  noise of a shared machine; this one is not);
- a ``/metrics`` scrape after those requests (the same app, every series filled).

Times are CPU time of this process (``time.process_time``), which other work on the machine disturbs
less than wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._report import write_section
from bench.bench_server import HOSTS, OUT, RATES, write_cache

ROUNDS = 21
PER_ROUND = 400
ALONE = 20_000


def make_apps(root: Path) -> tuple[object, object]:
    from server.main import create_app
    from server.metrics import MetricsMiddleware
    from server.settings import Settings
    from taskdata.cache.format import load_manifest
    from taskdata.define.registry import Registry
    from taskdata.index import BatchSchedule, RunPlan, TaskCache
    from taskdata.runs import StoredRun, cache_fingerprint

    caches = {}
    for task in RATES:
        version = write_cache(root, task, 64)
        caches[task] = TaskCache(cache_fingerprint(str(version)), load_manifest(str(version)).split("train").record_counts)
    plan = RunPlan(
        name="r64",
        mixture="bench_mix",
        caches=caches,
        rates=RATES,
        seed=1234,
        schedule=BatchSchedule.constant(2048),
        num_data_shards=HOSTS,
    )
    runs_file = root.parent / "metrics-runs.json"
    runs_file.write_text(json.dumps([StoredRun(plan).to_dict()]))
    settings = Settings(cache_root=str(root), runs_file=str(runs_file), default_run="r64")
    with_metrics = create_app(settings, Registry())
    without = create_app(settings, Registry())
    # The middleware stack is built on the first request: leave the metrics out of this one's.
    without.user_middleware = [m for m in without.user_middleware if m.cls is not MetricsMiddleware]
    return with_metrics, without


async def call(app: object, path: str, query: str = "") -> bytes:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(b"host", b"bench")],
        "client": ("127.0.0.1", 1),
        "server": ("bench", 80),
    }
    body = []
    status = 0

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            body.append(message.get("body", b""))

    await app(scope, receive, send)  # type: ignore[operator]
    if status != 200:
        raise RuntimeError(f"{path}?{query} answered {status}: {b''.join(body)[:300]!r}")
    return b"".join(body)


async def first_answer(app: object) -> None:
    """The first /shards of a run verifies its caches in a thread (503 until done)."""
    deadline = time.monotonic() + 600
    while True:
        try:
            await call(app, "/shards", "host=0&step=0")
            return
        except RuntimeError as error:
            if "503" not in str(error) or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def measure(apps: dict[str, object]) -> dict[str, dict[str, float]]:
    for app in apps.values():
        await first_answer(app)
        await call(app, "/healthz")
    cases = {
        "/shards step cache hits": lambda r, i: ("/shards", f"host={i % HOSTS}&step={i % 64}&encoding=base64"),
        "/healthz": lambda r, i: ("/healthz", ""),
    }
    for app in apps.values():  # fills the step cache for the hits
        for i in range(PER_ROUND):
            await call(app, *cases["/shards step cache hits"](0, i))
    times: dict[str, dict[str, list[float]]] = {case: {name: [] for name in apps} for case in cases}
    for r in range(ROUNDS):
        for case, request in cases.items():
            for name, app in apps.items():
                started = time.process_time()
                for i in range(PER_ROUND):
                    await call(app, *request(r, i))
                times[case][name].append((time.process_time() - started) / PER_ROUND)
    result = {case: {name: statistics.median(t) for name, t in by_app.items()} for case, by_app in times.items()}
    scrapes = []
    body = b""
    for _ in range(ROUNDS):
        started = time.process_time()
        body = await call(apps["with metrics"], "/metrics")
        scrapes.append(time.process_time() - started)
    series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
    result["/metrics scrape"] = {"with metrics": statistics.median(scrapes), "lines": series}
    return result


async def middleware_alone() -> tuple[float, float]:
    """CPU time per request of an ASGI app that answers at once, with and without MetricsMiddleware."""
    from types import SimpleNamespace

    from server.metrics import Metrics, MetricsMiddleware

    async def answer(scope: dict, receive: object, send: object) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": b"{}"})  # type: ignore[operator]

    async def receive() -> dict:
        return {"type": "http.request", "body": b""}

    async def send(message: dict) -> None:
        pass

    scope = {"type": "http", "method": "GET", "path": "/shards", "route": SimpleNamespace(path="/shards")}
    apps = {"with": MetricsMiddleware(answer, metrics=Metrics()), "without": answer}
    times: dict[str, list[float]] = {name: [] for name in apps}
    for _ in range(ROUNDS):
        for name, app in apps.items():
            started = time.process_time()
            for _ in range(ALONE):
                await app(scope, receive, send)
            times[name].append((time.process_time() - started) / ALONE)
    return statistics.median(times["with"]), statistics.median(times["without"])


def run() -> list[str]:
    OUT.mkdir(parents=True, exist_ok=True)
    with_metrics, without = make_apps(OUT / "caches")
    result = asyncio.run(measure({"with metrics": with_metrics, "without": without}))
    lines = []
    for case in ("/shards step cache hits", "/healthz"):
        a, b = result[case]["with metrics"], result[case]["without"]
        lines.append(
            f"{case}, in-process ASGI: {a * 1e6:.1f} us per request with the metrics middleware, {b * 1e6:.1f} us "
            f"without: the middleware costs {(a - b) * 1e6:.1f} us"
        )
    a, b = asyncio.run(middleware_alone())
    lines.append(
        f"the middleware alone, around an ASGI app that answers at once: {a * 1e6:.2f} us per request with it, "
        f"{b * 1e6:.2f} us without: it costs {(a - b) * 1e6:.2f} us"
    )
    scrape = result["/metrics scrape"]
    lines.append(f"/metrics scrape ({scrape['lines']} sample lines): {scrape['with metrics'] * 1e3:.2f} ms")
    lines.append(f"(median of {ROUNDS} interleaved rounds of {PER_ROUND} requests; 2 cores shared with other work)")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="write the figures into BENCHMARKS.md")
    args = parser.parse_args()
    lines = run()
    print("\n".join(lines))
    if args.write:
        write_section("Request metrics", lines, "PYTHONPATH=. python bench/bench_metrics.py --write")


if __name__ == "__main__":
    main()
