"""Latency and throughput of ``GET /shards`` under load on 127.0.0.1, next to a trivial FastAPI endpoint.

Run: PYTHONPATH=. python bench/bench_server.py [--requests 3000] [--write]

Both servers are real processes started the same way (uvicorn with httptools, one worker, no access
log): the assignment service with ``taskdata serve``, and a one-route FastAPI app as the ceiling. The
load comes from another process, with one request in flight per connection, in two ways:

- a raw-socket client (asyncio, HTTP/1.1 keep-alive): it costs little, so the server is the bottleneck
  and its CPU time per request (from /proc, reported for every throughput line) is what decides;
- httpx clients, one thread each, the way trainer hosts call the server: the trivial endpoint gives
  about 1,200 requests/s this way, the ceiling measured for such clients on this machine.

The plan is realistic: a 3-task mixture (0.7 / 0.25 / 0.05), global batch 2048 on 8 hosts (256
examples per host), lookahead steps=1, ``encoding=base64`` as the trainer client asks (one line with
``encoding=ints``). The caches are synthetic but in the real format (TFRecord frames, offsets sidecars,
manifest, COMPLETED), written once into bench/out/ and verified by the server on first use like any
cache: with 64 and with 65,536 shards per task. Every measured (host, step) is distinct, so answers
come from the index math (the server's step cache does not hit), except in the "step cache hits" line,
which repeats requests on purpose.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._report import write_section

OUT = Path(__file__).resolve().parent / "out" / "server"
REPO = Path(__file__).resolve().parent.parent
HOSTS = 8
GLOBAL_BATCH = 2048
RATES = {"c4_like": 0.7, "wiki_like": 0.25, "cola_like": 0.05}
# Records per task (same for both shard counts); a small task leaves most of 65,536 shards empty.
RECORDS = {"c4_like": 262_144, "wiki_like": 65_536, "cola_like": 1_024}
SHARD_COUNTS = (64, 65_536)
RECORD_BYTES = 24
LARGE_BODY = 48_862  # bytes of a /shards answer for one host at a step past epoch 0 (64 shards/task)


# --- synthetic caches in the real format ---------------------------------------------------------


def write_cache(root: Path, task: str, num_shards: int) -> Path:
    """One complete cache version of ``task`` (train split) with ``RECORDS[task]`` records; reused if present.

    Each shard has its origins sidecar, as the cache job writes one (first use verifies them too)."""
    import numpy as np

    from taskdata.cache.format import (
        Manifest,
        ShardEntry,
        SidecarEntry,
        SplitManifest,
        completed_bytes,
        manifest_bytes,
        offsets_name,
        origins_name,
        shard_name,
    )
    from taskdata.cache.origins import origins_sidecar
    from taskdata.cache.tfrecord import frame_record, write_offsets

    version_dir = root / task / f"v20260101T000000Z-bench{num_shards}"
    # A cache from before the benches wrote origins sidecars is rebuilt (its files are overwritten).
    if (version_dir / "COMPLETED").exists() and (version_dir / origins_name("train", 0, num_shards)).exists():
        return version_dir
    (version_dir / "index").mkdir(parents=True, exist_ok=True)
    total = RECORDS[task]
    entries, origins = [], []
    for shard in range(num_shards):
        count = total // num_shards + (1 if shard < total % num_shards else 0)
        frames = [
            frame_record(f"{task}:{shard}:{i}".encode().ljust(RECORD_BYTES, b".")) for i in range(count)
        ]
        data = b"".join(frames)
        offsets, position = [], 0
        for frame in frames:
            offsets.append(position)
            position += len(frame)
        sidecar = write_offsets(offsets, len(data), [int.from_bytes(frame[-4:], "little") for frame in frames])
        file, offsets_file = shard_name("train", shard, num_shards), offsets_name("train", shard, num_shards)
        (version_dir / file).write_bytes(data)
        (version_dir / offsets_file).write_bytes(sidecar)
        entries.append(
            ShardEntry(
                file=file,
                records=count,
                bytes=len(data),
                sha256=hashlib.sha256(data).hexdigest(),
                offsets_file=offsets_file,
                offsets_sha256=hashlib.sha256(sidecar).hexdigest(),
                max_record_bytes=RECORD_BYTES + 16,
            )
        )
        # The origins a job would record: one source shard, records in order, one document each.
        rows = np.zeros((count, 4), np.int64)
        rows[:, 1] = rows[:, 2] = np.arange(count)
        origins_data = origins_sidecar(rows)
        origins_file = origins_name("train", shard, num_shards)
        (version_dir / origins_file).write_bytes(origins_data)
        origins.append(SidecarEntry(origins_file, hashlib.sha256(origins_data).hexdigest(), len(origins_data)))
    manifest = Manifest(
        task=task,
        task_fingerprint=f"bench-{task}",
        fingerprints={},
        seed=0,
        taskdata_version="bench",
        sequence_length={},
        features={},
        splits={"train": SplitManifest(tuple(entries), 1, {}, source_files=("bench",), origins=tuple(origins))},
    )
    data = manifest_bytes(manifest)
    (version_dir / "manifest.json").write_bytes(data)
    (version_dir / "COMPLETED").write_bytes(completed_bytes(data))
    (root / task / "CURRENT").write_text(version_dir.name + "\n")
    return version_dir


def make_runs(root: Path) -> list[dict]:
    from taskdata.cache.format import load_manifest
    from taskdata.index import BatchSchedule, RunPlan, TaskCache
    from taskdata.runs import StoredRun, cache_fingerprint

    runs = []
    for num_shards in SHARD_COUNTS:
        caches = {}
        for task in RATES:
            version = write_cache(root, task, num_shards)
            counts = load_manifest(str(version)).split("train").record_counts
            caches[task] = TaskCache(cache_fingerprint(str(version)), counts)
        plan = RunPlan(
            name=f"r{num_shards}",
            mixture="bench_mix",
            caches=caches,
            rates=RATES,
            seed=1234,
            schedule=BatchSchedule.constant(GLOBAL_BATCH),
            num_data_shards=HOSTS,
        )
        runs.append(StoredRun(plan).to_dict())
    return runs


# --- servers and the load client -------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(command: list[str], port: int, log: Path, tree: Path = REPO) -> subprocess.Popen:
    """Runs ``command`` with the source ``tree`` (default: this repository) as its working folder and path."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    with open(log, "wb") as out:
        process = subprocess.Popen(command, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{command} exited with {process.returncode}:\n{log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return process
        except OSError:
            time.sleep(0.1)
    stop(process)
    raise RuntimeError(f"{command} did not listen on port {port} within 60 s:\n{log.read_text()}")


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)


def load(port: int, paths: list[str], concurrency: int, generator: str = "raw") -> dict:
    """Runs a load generator in its own process; returns its measurements.

    ``raw``: asyncio raw sockets, one request in flight per connection; it costs the client little, so
    the server is the bottleneck. ``httpx``: one thread per connection, each with a sync
    ``httpx.Client``, the way trainer hosts call the server (``trainer_client.server_source``).
    """
    result = subprocess.run(
        [sys.executable, __file__, "--client", str(port), str(concurrency), generator],
        input=json.dumps(paths),
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return json.loads(result.stdout)


def _httpx_client(port: int, paths: list[str], concurrency: int) -> dict:
    import threading

    import httpx

    pending, lock = iter(paths), threading.Lock()
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    sizes: list[int] = []

    def connection() -> None:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            while True:
                with lock:
                    path = next(pending, None)
                if path is None:
                    return
                started = time.perf_counter()
                response = client.get(path)
                body = response.content
                elapsed = time.perf_counter() - started
                with lock:
                    latencies.append(elapsed)
                    statuses[str(response.status_code)] = statuses.get(str(response.status_code), 0) + 1
                    sizes.append(len(body))

    threads = [threading.Thread(target=connection) for _ in range(concurrency)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {
        "seconds": time.perf_counter() - started,
        "latencies": latencies,
        "statuses": statuses,
        "mean_bytes": statistics.fmean(sizes),
    }


async def _client(port: int, paths: list[str], concurrency: int) -> dict:
    pending = iter(paths)
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    sizes: list[int] = []

    async def connection() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for path in pending:
            request = f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode()
            started = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            body = await reader.readexactly(length)
            latencies.append(time.perf_counter() - started)
            status = head.split(b" ", 2)[1].decode()
            statuses[status] = statuses.get(status, 0) + 1
            sizes.append(len(body))
        writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(connection() for _ in range(concurrency)))
    return {
        "seconds": time.perf_counter() - started,
        "latencies": latencies,
        "statuses": statuses,
        "mean_bytes": statistics.fmean(sizes),
    }


def first_answer(port: int, path: str) -> float:
    """Seconds until ``path`` answers 200 (the server answers 503 while it verifies on first use)."""
    started = time.perf_counter()
    while load(port, [path], 1)["statuses"].get("200") != 1:
        if time.perf_counter() - started > 1800:
            raise RuntimeError(f"{path} did not answer 200 within 30 minutes")
        time.sleep(1.0)
    return time.perf_counter() - started


def serve_trivial(port: int) -> None:
    import uvicorn
    from fastapi import FastAPI, Response

    app = FastAPI()

    @app.get("/trivial")
    async def trivial() -> dict[str, str]:
        return {"status": "ok"}

    large = json.dumps({"padding": "x" * (LARGE_BODY - 15)}).encode()

    @app.get("/trivial-large")
    async def trivial_large() -> Response:
        return Response(large, media_type="application/json")

    uvicorn.run(
        app, host="127.0.0.1", port=port, access_log=False, log_level="warning", workers=1, http="httptools"
    )


# --- measurements -------------------------------------------------------------------------------------


def percentiles(latencies: list[float]) -> tuple[float, float]:
    ordered = sorted(latencies)
    return ordered[len(ordered) // 2] * 1e3, ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3


def shards_paths(run: str, first_step: int, count: int, encoding: str = "base64") -> list[str]:
    """8 hosts walking through consecutive steps: host i % 8 at step first_step + i // 8."""
    return [
        f"/shards?host={i % HOSTS}&step={first_step + i // HOSTS}&run={run}&encoding={encoding}"
        for i in range(count)
    ]


def describe(name: str, result: dict, extra: str = "") -> str:
    p50, p99 = percentiles(result["latencies"])
    rate = len(result["latencies"]) / result["seconds"]
    errors = {k: v for k, v in result["statuses"].items() if k != "200"}
    assert not errors, f"{name}: non-200 answers {errors}"
    return (
        f"{name}: p50 {p50:.2f} ms, p99 {p99:.2f} ms, {rate:,.0f} req/s ({len(result['latencies']):,} requests, "
        f"{result['mean_bytes']:,.0f} bytes/answer){extra}"
    )


def in_process_breakdown(runs: list[dict], root: Path) -> list[str]:
    """Where a new answer's time goes, measured in-process on the same plans and caches."""
    from server.assignments import AnswerCache, shards_body, step_json
    from taskdata.index import step_slices
    from taskdata.runs import CacheResolver, StoredRun

    lines = []
    for data in runs:
        run = StoredRun.from_dict(data)
        num_shards = int(run.name[1:])
        caches = CacheResolver(str(root)).resolve_run(run)
        memory = AnswerCache(0)  # keeps no answers: every answer below is computed
        memory.prepare(run, caches)  # once per process (the server does it while verifying)
        tables = memory.tables(run, caches)
        step_slices(tables, 0, HOSTS)  # builds the plan's layout tables, once per process
        for first in (10, 12_000, 10**9):
            steps = range(first, first + 25)
            started = time.perf_counter()
            for step in steps:
                step_slices(tables, step, HOSTS)
            per_step = (time.perf_counter() - started) / len(steps)
            formatting = {}
            for encoding in ("base64", "ints"):
                for step in steps:  # the whole step computed and kept (by its second host), as for its other hosts
                    for host in (0, 1):
                        memory.step_reads(run.name, tables, step, host, HOSTS)
                started = time.perf_counter()
                for step in steps:
                    for host in range(HOSTS):
                        body = step_json(memory, run.name, tables, step, host, HOSTS, encoding)
                        shards_body(run, host, HOSTS, host, step, [body])
                formatting[encoding] = (time.perf_counter() - started) / (len(steps) * HOSTS)
                memory.clear_step_slices()
            lines.append(
                f"in-process, {num_shards:,} shards, steps from {first:,}: a step's index math and read columns "
                f"for all {HOSTS} hosts {per_step * 1e3:.2f} ms ({per_step / HOSTS * 1e3:.3f} ms per host); "
                f"writing one host's answer from them {formatting['base64'] * 1e3:.3f} ms (base64), "
                f"{formatting['ints'] * 1e3:.3f} ms (ints)"
            )
    return lines


def in_process_requests(root: Path, runs_file: Path, rounds: int = 8, per_round: int = 400) -> list[str]:
    """Time per request through the whole app (middleware, token check, routing, answer), no network.

    Requests go straight to the ASGI app in this process, with a bearer token, on run r64: answers from
    the step cache (what the framework and the checks around the route cost), answers computed for new
    (host, step) pairs, and requests refused for want of a token. Each figure is the best of ``rounds``
    rounds: on a machine shared with other work, the best round is the one least disturbed.
    """
    from server.main import create_app
    from server.settings import Settings

    token = "bench-token"
    app = create_app(Settings(cache_root=str(root), runs_file=str(runs_file), token=token))
    good = [(b"host", b"bench"), (b"authorization", f"Bearer {token}".encode())]

    async def request(query: str, headers: list[tuple[bytes, bytes]]) -> int:
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
            "scheme": "http", "path": "/shards", "raw_path": b"/shards", "query_string": query.encode(),
            "root_path": "", "headers": headers, "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
        }  # fmt: skip
        status = 0

        async def receive() -> dict:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]

        await app(scope, receive, send)
        return status

    async def timed(queries: list[str], headers: list[tuple[bytes, bytes]], expected: int) -> float:
        started = time.perf_counter()
        for query in queries:
            status = await request(query, headers)
            assert status == expected, (query, status)
        return (time.perf_counter() - started) / len(queries)

    async def best(make_queries, headers: list[tuple[bytes, bytes]], expected: int) -> float:
        return min([await timed(make_queries(i), headers, expected) for i in range(rounds)])

    def queries(first_step: int, n: int) -> list[str]:
        return [f"run=r64&host={i % HOSTS}&step={first_step + i // HOSTS}&encoding=base64" for i in range(n)]

    async def measure_all() -> dict[str, float]:
        while await request(queries(0, 1)[0], good) == 503:  # first use: the caches are verified
            await asyncio.sleep(0.1)
        hits = queries(7_000_000, per_round)
        await timed(hits, good, 200)  # fills the step cache (1,024 entries)
        await timed(queries(8_000_000, per_round), good, 200)  # warm-up of the computing path
        return {
            "hit": await best(lambda i: hits, good, 200),
            "new": await best(lambda i: queries(9_000_000 + i * per_round, per_round), good, 200),
            "refused": await best(lambda i: hits, [(b"host", b"bench")], 401),
        }

    figures = asyncio.run(measure_all())
    return [
        f"in-process requests through the whole app (ASGI, no network; bearer token; run r64, base64; best "
        f"of {rounds} rounds of {per_round}): "
        f"step cache hit {figures['hit'] * 1e6:.0f} us/request, new (host, step) {figures['new'] * 1e6:.0f} "
        f"us/request, refused without the token {figures['refused'] * 1e6:.0f} us/request"
    ]


def cpu_seconds(process: subprocess.Popen) -> float:
    """User + system CPU time of ``process`` so far (Linux /proc)."""
    fields = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(
    server: subprocess.Popen, port: int, trivial: subprocess.Popen, trivial_port: int, requests: int
) -> list[str]:
    lines = []
    for num_shards in SHARD_COUNTS:
        seconds = first_answer(port, f"/shards?host=0&step=500000000&run=r{num_shards}")
        lines.append(
            f"first use of run r{num_shards} (find and verify its 3 caches, load offsets; 503 + Retry-After "
            f"until done): first 200 after {seconds:.1f} s"
        )
        load(port, shards_paths(f"r{num_shards}", 600_000_000, 200), 1)  # warm-up, on other steps
    load(trivial_port, ["/trivial"] * 500, 1)

    def timed(
        process: subprocess.Popen, target: int, paths: list[str], concurrency: int, generator: str = "raw"
    ):
        before = cpu_seconds(process)
        result = load(target, paths, concurrency, generator)
        result["cpu_per_request"] = (cpu_seconds(process) - before) / len(paths)
        result["rate"] = len(paths) / result["seconds"]
        return result

    def cpu(result: dict) -> str:
        return f"; server CPU {result['cpu_per_request'] * 1e6:.0f} us/request"

    latency_n = max(200, requests // 6)
    lines.append(
        describe("trivial FastAPI endpoint, 1 connection", load(trivial_port, ["/trivial"] * latency_n, 1))
    )
    p99s = []
    for num_shards in SHARD_COUNTS:
        for step in (10, 10**9):
            result = load(port, shards_paths(f"r{num_shards}", step, latency_n, "base64"), 1)
            p99s.append(percentiles(result["latencies"])[1])
            lines.append(
                describe(
                    f"/shards base64, 1 connection, {num_shards:,} shards/task, steps from {step:,}", result
                )
            )
    result = load(port, shards_paths("r64", 2 * 10**9, latency_n, "ints"), 1)
    p99s.append(percentiles(result["latencies"])[1])
    lines.append(describe("/shards ints, 1 connection, 64 shards/task, steps from 2,000,000,000", result))
    ratios = {}

    # Throughput. Every (host, step) is new except in the "step cache hits" line; each line has its
    # own steps, so no line finds another's steps computed.
    for generator, label in (("raw", "raw-socket client"), ("httpx", "httpx clients in threads")):
        ceiling = timed(trivial, trivial_port, ["/trivial"] * requests, HOSTS, generator)
        lines.append(
            describe(f"{label}: trivial FastAPI endpoint, {HOSTS} connections", ceiling, cpu(ceiling))
        )
        cases = [
            (
                "base64, every (host, step) new",
                shards_paths("r64", 12_000 + (generator == "httpx") * 500_000, requests, "base64"),
            )
        ]
        if generator == "raw":
            large = timed(trivial, trivial_port, ["/trivial-large"] * requests, HOSTS)
            lines.append(
                describe(
                    f"{label}: trivial FastAPI endpoint with a {LARGE_BODY:,}-byte body, {HOSTS} connections",
                    large,
                    cpu(large),
                )
            )
            repeated = shards_paths("r64", 50_000, 1_000, "base64")
            load(port, repeated, HOSTS)  # fills the step cache (1,024 entries)
            cases += [
                ("ints, every (host, step) new", shards_paths("r64", 250_000, requests, "ints")),
                ("base64, step cache hits", (repeated * (requests // len(repeated) + 1))[:requests]),
            ]
        for case, paths in cases:
            result = timed(server, port, paths, HOSTS, generator)
            ratios[label, case] = result["rate"] / ceiling["rate"]
            lines.append(
                describe(
                    f"{label}: /shards {case}, {HOSTS} connections, 64 shards/task",
                    result,
                    f" = {result['rate'] / ceiling['rate']:.0%} of the trivial endpoint's throughput{cpu(result)}",
                )
            )
    new = "base64, every (host, step) new"
    lines.append(
        f"targets: p99 <= 3 ms with one connection: worst {max(p99s):.2f} ms over the 5 lines above "
        f"({'met' if max(p99s) <= 3 else 'NOT met'}); throughput >= 60% of the trivial endpoint's, new "
        f"(host, step) pairs: {ratios['httpx clients in threads', new]:.0%} with httpx clients (the "
        f"~1,200 req/s ceiling), {ratios['raw-socket client', new]:.0%} with the raw-socket client (server-bound)"
    )
    return lines


def run(requests: int) -> list[str]:
    load_before = os.getloadavg()[0]
    OUT.mkdir(parents=True, exist_ok=True)
    root = OUT / "caches"
    started = time.perf_counter()
    runs = make_runs(root)
    lines = [
        f"caches: 3 tasks x 64 and x 65,536 shards ({sum(RECORDS.values()):,} records per layout) ready in "
        f"{time.perf_counter() - started:.1f} s (written once into bench/out/server)"
    ]
    runs_file = OUT / "runs.json"
    runs_file.write_text(json.dumps(runs))
    # One root holds both layouts' versions of every task: each run finds its versions by manifest hash.
    port = free_port()
    server = start(
        [
            sys.executable,
            "-m",
            "taskdata",
            "serve",
            "--cache-root",
            str(root),
            "--runs-file",
            str(runs_file),
            "--port",
            str(port),
            "--no-access-log",
        ],
        port,
        OUT / "server.log",
    )
    try:
        trivial_port = free_port()
        trivial = start(
            [sys.executable, __file__, "--serve-trivial", str(trivial_port)],
            trivial_port,
            OUT / "trivial.log",
        )
        try:
            lines += measure(server, port, trivial, trivial_port, requests)
        finally:
            stop(trivial)
    finally:
        stop(server)
    lines += in_process_breakdown(runs, root)
    lines += in_process_requests(root, runs_file)
    lines.append(
        f"machine load (1-minute load average, 2 cores shared with other work): {load_before:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after; figures move by tens of percent between runs under such load"
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=3000, help="requests of each throughput run")
    parser.add_argument("--write", action="store_true", help="write the figures into BENCHMARKS.md")
    parser.add_argument(
        "--client", nargs=3, metavar=("PORT", "CONCURRENCY", "GENERATOR"), help=argparse.SUPPRESS
    )
    parser.add_argument("--serve-trivial", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument(
        "--in-process", action="store_true", help="only the in-process figures (no servers; nothing written)"
    )
    args = parser.parse_args()
    if args.client:
        port, concurrency, generator = int(args.client[0]), int(args.client[1]), args.client[2]
        paths = json.loads(sys.stdin.read())
        if generator == "httpx":
            print(json.dumps(_httpx_client(port, paths, concurrency)))
        else:
            print(json.dumps(asyncio.run(_client(port, paths, concurrency))))
        return
    if args.serve_trivial:
        serve_trivial(args.serve_trivial)
        return
    if args.in_process:
        OUT.mkdir(parents=True, exist_ok=True)
        runs = make_runs(OUT / "caches")
        (OUT / "runs.json").write_text(json.dumps(runs))
        print(
            "\n".join(
                in_process_breakdown(runs[:1], OUT / "caches")
                + in_process_requests(OUT / "caches", OUT / "runs.json")
            )
        )
        return
    lines = run(args.requests)
    print("\n".join(lines))
    if args.write:
        write_section(
            "Server", lines, f"PYTHONPATH=. python bench/bench_server.py --requests {args.requests} --write"
        )


if __name__ == "__main__":
    main()
