"""What one ``taskdata serve`` replica gives a pod: ``wrk`` throughput and latency of ``GET /shards``, a trivial
FastAPI endpoint beside it, and a pod simulator; the targets are what a pod needs.

Run: PYTHONPATH=. python bench/bench_wrk.py [--seconds 8] [--rounds 3] [--baseline TREE] [--targets-only] [--write]
     PYTHONPATH=. python bench/bench_wrk.py --latency-only     (the 1-connection p99 alone, beside the trivial endpoint's)
     PYTHONPATH=. python bench/bench_wrk.py --profile [--write]   (where the server's time goes: py-spy, r64 and
                                                                  r65536, together and distinct)

Targets (one replica, one core, loopback): a 4,096-host pod training at 1 step/s is answered with p99 <= 20 ms;
a synchronised restart of all 4,096 hosts is answered in <= 5 s; p99 at one connection <= 3 ms.

wrk's percentiles are corrected for coordinated omission: for a request of latency L it adds samples at L - T,
L - 2T, ... while above T (T: the run's mean time per request per connection), the requests a client sending at
a fixed rate would have sent meanwhile. At one connection a rare slow request thus counts many times, so
``--latency-only`` also traces each request's own latency (a wrk response callback) and reports both, beside
the trivial endpoint at one connection in the same rounds (what any FastAPI route gets from this machine at that
minute) and this machine's own tail for a fixed pure-Python task run between short sleeps, with no server at all.

``--baseline TREE`` serves another source tree too (``git archive main | tar -x -C TREE``), on the same caches
and runs, and measures it in every configuration right after this tree (wrk runs, pod bursts, the paced pod):
on a machine whose speed moves from minute to minute, a before/after comparison in the same rounds.

Servers: ``taskdata serve`` (uvicorn, its httptools protocol, one worker, no access log; here with
``--first-use-check listing``) over bench_server.py's synthetic caches, and a one-route FastAPI app under the
same uvicorn options and loop (``server.serving.serve``; ``--serve-trivial``). Every configuration runs in turn
within a round (interleaved), each with fresh steps so that the server's answer cache never holds them;
figures are medians over rounds, each with the machine's 1-minute load average when it ran. wrk (C, one
thread) is not the bottleneck when the trivial endpoint's server is near one core and wrk well below: its
line says both. Request shapes (wrk's Lua, one counter per wrk thread):

- together: the hosts (data shards) of a step window arrive one after another, then the next window;
- distinct: every request is for a new step window, so every one computes a step's whole global batch;
- ``steps=S``: the lookahead window a trainer asks for per request (the client's default is 16).

The pod simulator (loopback, 64 connections, model axis 8: 8 hosts per data shard ask the same question):
every host of a 256-, 1,024- and 4,096-host pod asking for one fresh 16-step window at once (a synchronised
restart, and hosts in lockstep at every window), and the 4,096-host pod training at 1 and 4 steps/s for 32 s
with hosts spread over the window (latency counted from when each request was due), timed after its hosts'
restart (their first window, untimed: the burst measures that).

Runs: bench_server.py's r64 and r65536 (3-task mixture, global batch 2048, 8 data shards), and pod512:
the 65,536-shard caches with 512 data shards (4 examples per data shard per step), what a 4,096-host
pod with a model axis of 8 asks. Earlier figures and where the time went: BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._report import write_section
from bench.bench_server import GLOBAL_BATCH, OUT, RATES, REPO, free_port, make_runs, start, stop

WRK = "/usr/bin/wrk"
LUA = r"""
local counter = 0
local mode, run, hosts = os.getenv("MODE"), os.getenv("RUN"), tonumber(os.getenv("HOSTS"))
local steps, base = tonumber(os.getenv("STEPS")), tonumber(os.getenv("BASE"))
local encoding = os.getenv("ENCODING")
-- CYCLE (a number): the windows repeat after that many, so that the server answers from its caches.
local cycle = tonumber(os.getenv("CYCLE") or "")
-- TRACE (a file): each request's own latency, on the monotonic clock (wrk's percentiles are corrected for
-- coordinated omission; these are not), written by a response callback.
local trace, now, started = os.getenv("TRACE"), nil, 0
if trace and trace ~= "" then
  local ffi = require("ffi")
  ffi.cdef[[ typedef struct { long tv_sec; long tv_nsec; } wrk_timespec; int clock_gettime(int, wrk_timespec *); ]]
  local ts = ffi.new("wrk_timespec")
  now = function() ffi.C.clock_gettime(1, ts); return tonumber(ts.tv_sec) * 1e6 + tonumber(ts.tv_nsec) / 1e3 end
  local out = io.open(trace, "w")
  response = function(status, headers, body) out:write(string.format("%.1f\n", now() - started)) end
end
request = function()
  local path
  if mode == "trivial" then
    path = "/trivial"
  else
    local window = counter
    if mode == "together" then window = math.floor(counter / hosts) end
    if cycle then window = window % cycle end
    path = string.format("/shards?host=%d&step=%d&steps=%d&run=%s&encoding=%s", counter % hosts,
                         base + window * steps, steps, run, encoding)
  end
  counter = counter + 1
  if now then started = now() end
  return wrk.format("GET", path)
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('{"requests": %d, "duration_us": %d, "bytes": %d, "p50_us": %d, "p99_us": %d, ' ..
    '"errors": %d, "non2xx": %d}\n', summary.requests, summary.duration, summary.bytes, latency:percentile(50),
    latency:percentile(99), e.connect + e.read + e.write + e.timeout, e.status))
end
"""


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def wrk(script: str, port: int, pid: int, connections: int, seconds: int, **env: str | int) -> dict:
    before_server = cpu_seconds(pid)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(
        [WRK, "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "10s", "-s", script, f"http://127.0.0.1:{port}"],
        capture_output=True, text=True, timeout=seconds + 60, env={**os.environ, **{k: str(v) for k, v in env.items()}},
        check=True,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if result["errors"] or result["non2xx"]:
        raise SystemExit(f"wrk {env}: {result['errors']} socket errors, {result['non2xx']} non-2xx answers")
    seconds_taken = result["duration_us"] / 1e6
    result.update(
        rate=result["requests"] / seconds_taken,
        server_cpu_us=(cpu_seconds(pid) - before_server) / result["requests"] * 1e6,
        wrk_cpu=((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)) / seconds_taken,
    )
    return result


# Where a /shards request's time goes: a frame of py-spy's stacks -> its bucket (first match wins).
BUCKETS = [
    ("writing the answer to the socket (uvicorn send)", "RequestResponseCycle.send (uvicorn"),
    ("index math of a whole step, or of one slice alone", "step_slices (taskdata/index/host_slices.py"),
    ("the step's JSON (base64 columns, files)", "(taskdata/index/step_json.py"),
    ("a slice cut from its whole step, step LRU", "AnswerCache.step_json (server/assignments.py"),
    ("the answer around them (run, answer LRU, body)", "_answer (server/routers/shards.py"),
    ("the route: its query validated, its response", "get_shards (server/routers/shards.py"),
    ("FastAPI, Starlette and the middleware (token, metrics)", "FastAPI.__call__ (fastapi"),
    ("HTTP parsing (httptools), the header guard and the event loop", ""),
]
PROFILED = [("r64", "together"), ("r64", "distinct"), ("r65536", "together"), ("r65536", "distinct")]


def profile(port: int, pid: int, script: str, seconds: int, encoding: str) -> list[str]:
    """py-spy samples the server while wrk sends requests of each ``PROFILED`` (run, mode), steps=1."""
    lines = []
    for i, (run, mode) in enumerate(PROFILED):
        raw = Path(script).with_name(f"pyspy-{run}-{mode}.txt")
        spy = subprocess.Popen(["py-spy", "record", "-d", str(seconds + 1), "-r", "500", "-p", str(pid), "-f", "raw",
                                "-o", str(raw)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1)
        load = os.getloadavg()[0]
        result = wrk(script, port, pid, 16, seconds, MODE=mode, RUN=run, HOSTS=8, STEPS=1, BASE=77_000_000 + i * 10_000_000,
                     ENCODING=encoding)
        spy.wait(timeout=120)
        counts = dict.fromkeys((name for name, _ in BUCKETS), 0)  # (a name may have several markers)
        for line in raw.read_text().splitlines():
            stack, _, samples = line.rpartition(" ")
            frames = stack.split(";")
            # The first bucket with a frame on the stack wins: they are listed innermost first.
            name = next((name for name, marker in BUCKETS for frame in reversed(frames) if marker and marker in frame),
                        BUCKETS[-1][0])
            counts[name] += int(samples)
        total = sum(counts.values())
        us = result["server_cpu_us"]
        lines.append(f"{run} {mode}, encoding={encoding} ({result['rate']:,.0f} req/s, {us:,.0f} us/request, "
                     f"{result['bytes'] / result['requests']:,.0f} bytes/answer, load {load:.1f}): "
                     + "; ".join(f"{name} {count / total:.0%} ({count / total * us:,.0f} us)"
                                 for name, count in counts.items() if count))
    return lines


async def _paced(port: int, schedule: list[tuple[float, str]], connections: int) -> list[float]:
    """Sends each (time, path) at its time over ``connections`` keep-alive connections; a request's
    latency counts from its scheduled time, so waiting for a free connection is part of it."""
    queue: asyncio.Queue = asyncio.Queue()
    latencies: list[float] = []
    start = time.perf_counter()

    async def connection() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while (item := await queue.get()) is not None:
            due, path = item
            writer.write(f"GET {path} HTTP/1.1\r\nHost: pod\r\n\r\n".encode())
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise SystemExit(f"{path}: {head[:40]!r}")
            length = next(int(line[15:]) for line in head.split(b"\r\n") if line[:15].lower() == b"content-length:")
            await reader.readexactly(length)
            latencies.append(time.perf_counter() - start - due)
        writer.close()

    workers = [asyncio.create_task(connection()) for _ in range(connections)]
    for due, path in schedule:
        await asyncio.sleep(max(0.0, due - (time.perf_counter() - start)))
        queue.put_nowait((due, path))
    for _ in workers:
        queue.put_nowait(None)
    await asyncio.gather(*workers)
    return latencies


def paced_pod(port: int, pid: int, data_shards: int, steps_per_second: float, seconds: float, first: int) -> dict:
    """A pod training at ``steps_per_second``: each of its hosts asks for its next 16-step window when
    it starts the last one, hosts spread evenly over a window (not in lockstep), from step ``first + 16``
    (after their untimed restart at ``first``)."""
    hosts = data_shards * MODEL_AXIS

    def path(h: int, w: int) -> str:
        return f"/shards?host={h // MODEL_AXIS}&step={first + 16 * w}&steps=16&run=pod{data_shards}&encoding=compact"

    # A pod in training: its hosts have asked for the window before the first timed one (their restart, which
    # burst() measures), untimed.
    asyncio.run(_paced(port, [(0.0, path(h, 0)) for h in range(hosts)], 64))
    window = 16 / steps_per_second
    schedule = sorted(
        (w * window + h * window / hosts, path(h, w + 1)) for h in range(hosts) for w in range(int(seconds / window))
    )
    before = cpu_seconds(pid)
    latencies = sorted(asyncio.run(_paced(port, schedule, 64)))
    cpu = cpu_seconds(pid) - before
    steps = steps_per_second * seconds
    return {"requests": len(latencies), "p50": latencies[len(latencies) // 2],
            "p99": latencies[int(len(latencies) * 0.99)], "cpu_per_step": cpu / steps, "cpu_share": cpu / seconds,
            "load": os.getloadavg()[0]}


def burst(port: int, pid: int, data_shards: int, step: int) -> dict:
    """Every host of a pod asks for the same fresh 16-step window at once (a synchronised restart, and
    what hosts in lockstep do at every window boundary): ``MODEL_AXIS`` hosts per data shard, 64
    connections of bench_server.py's raw-socket client."""
    from bench.bench_server import load as raw_load

    paths = [f"/shards?host={h // MODEL_AXIS}&step={step}&steps=16&run=pod{data_shards}&encoding=compact"
             for h in range(data_shards * MODEL_AXIS)]
    before = cpu_seconds(pid)
    result = raw_load(port, paths, 64)
    assert set(result["statuses"]) == {"200"}, result["statuses"]
    ordered = sorted(result["latencies"])
    return {"seconds": result["seconds"], "cpu": cpu_seconds(pid) - before, "p50": ordered[len(ordered) // 2],
            "p99": ordered[int(len(ordered) * 0.99)], "bytes": result["mean_bytes"], "load": os.getloadavg()[0]}


def serve_trivial(port: int) -> None:
    """The trivial endpoint served as ``taskdata serve`` serves its app (``server.serving.serve``)."""
    from fastapi import FastAPI

    from server.serving import serve
    from server.settings import Settings

    app = FastAPI()

    @app.get("/trivial")
    async def trivial() -> dict[str, str]:
        return {"status": "ok"}

    serve(app, Settings(cache_root=str(OUT), port=port), access_log=False)


def pod_run(root: Path, data_shards: int) -> dict:
    from taskdata.cache.format import load_manifest
    from taskdata.index import BatchSchedule, RunPlan, TaskCache
    from taskdata.runs import StoredRun, cache_fingerprint

    caches = {}
    for task in RATES:
        version = root / task / "v20260101T000000Z-bench65536"
        caches[task] = TaskCache(cache_fingerprint(str(version)), load_manifest(str(version)).split("train").record_counts)
    plan = RunPlan(name=f"pod{data_shards}", mixture="bench_mix", caches=caches, rates=RATES, seed=1234,
                   schedule=BatchSchedule.constant(GLOBAL_BATCH), num_data_shards=data_shards)
    return StoredRun(plan).to_dict()


MODEL_AXIS = 8
POD_SHARDS = (32, 128, 512)  # 256, 1,024 and 4,096 hosts with a model axis of 8
CONFIGS = [
    # (label, run, data shards, mode, steps, connections, encoding)
    ("trivial endpoint", None, 8, "trivial", 1, 16, ""),
    ("r64, together, steps=1", "r64", 8, "together", 1, 16, "base64"),
    ("r64, distinct, steps=1", "r64", 8, "distinct", 1, 16, "base64"),
    ("r65536, together, steps=1", "r65536", 8, "together", 1, 16, "base64"),
    ("r65536, distinct, steps=1", "r65536", 8, "distinct", 1, 16, "base64"),
    ("r64, together, steps=1, compact", "r64", 8, "together", 1, 16, "compact"),
    ("r64, distinct, steps=1, compact", "r64", 8, "distinct", 1, 16, "compact"),
    ("r65536, together, steps=1, compact", "r65536", 8, "together", 1, 16, "compact"),
    ("r65536, distinct, steps=1, compact", "r65536", 8, "distinct", 1, 16, "compact"),
    ("pod512, together, steps=16, compact", "pod512", 512, "together", 16, 16, "compact"),
    ("pod512, distinct, steps=16, compact", "pod512", 512, "distinct", 16, 16, "compact"),
    ("r64, together, steps=1, 1 connection, compact", "r64", 8, "together", 1, 1, "compact"),
]


def machine_tail(seconds: float) -> tuple[float, float]:
    """(p50, p99) in us of one fixed pure-Python work unit (~0.1-0.2 ms), each run after a 0.5 ms sleep, as a
    server at one connection works between idle waits: what this machine alone does to a short task's tail."""
    durations = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.0005)
        started = time.perf_counter()
        total = 0
        for i in range(2000):
            total += i * i
        durations.append((time.perf_counter() - started) * 1e6)
    durations.sort()
    return durations[len(durations) // 2], durations[int(len(durations) * 0.99)]


def latency_only(port: int, pid: int, trivial_port: int, trivial_pid: int, script: str, args: argparse.Namespace) -> None:
    """p50/p99 at one connection (r64, hosts of a step together), the server doing nothing else: wrk's (corrected
    for coordinated omission) and each request's own (traced); the trivial endpoint at one connection in the same
    rounds, just before, as this machine's floor for any FastAPI route; the route answering 8 steps over and over
    from its answer cache (what the route costs beside a new step's index math and JSON); and this machine's tail
    for a fixed task."""
    label, run, hosts, mode, steps, connections, encoding = CONFIGS[-1]
    unit_p50, unit_p99 = machine_tail(args.seconds)
    measured: dict[str, list[dict]] = {"trivial": [], "kept": [], "shards": []}
    for round_ in range(args.rounds):
        route = {"MODE": mode, "RUN": run or "", "HOSTS": hosts, "STEPS": steps, "ENCODING": encoding}
        for name, at, server_pid, env in (
            ("trivial", trivial_port, trivial_pid, {"MODE": "trivial"}),
            # The same 8 steps over and over: every answer from the server's answer cache, no index math.
            ("kept", port, pid, {**route, "BASE": 100, "CYCLE": 8}),
            ("shards", port, pid, {**route, "BASE": 600_000_000 + round_ * 10_000_000}),
        ):
            load = os.getloadavg()[0]
            trace = Path(script).with_name(f"trace-{name}-{round_}.txt")
            result = wrk(script, at, server_pid, connections, args.seconds, TRACE=str(trace), **env)
            own = sorted(float(line) for line in trace.read_text().split())
            if len(own) != result["requests"]:
                raise SystemExit(f"{trace}: {len(own)} latencies traced for {result['requests']} requests")
            result.update(load=(load + os.getloadavg()[0]) / 2, own_p50_us=own[len(own) // 2],
                          own_p99_us=own[int(len(own) * 0.99)])
            measured[name].append(result)
            print(name, {k: round(v, 1) for k, v in result.items()}, flush=True)

    def line(runs: list[dict]) -> str:
        return (f"wrk's p50 {statistics.median(r['p50_us'] for r in runs) / 1e3:.2f} ms, p99 "
                f"{statistics.median(r['p99_us'] for r in runs) / 1e3:.2f} ms (rounds: "
                f"{', '.join(format(r['p99_us'] / 1e3, '.2f') for r in runs)} ms); each request's own p50 "
                f"{statistics.median(r['own_p50_us'] for r in runs) / 1e3:.2f} ms, p99 "
                f"{statistics.median(r['own_p99_us'] for r in runs) / 1e3:.2f} ms (rounds: "
                f"{', '.join(format(r['own_p99_us'] / 1e3, '.2f') for r in runs)} ms); "
                f"{statistics.median(r['rate'] for r in runs):,.0f} req/s, server CPU "
                f"{statistics.median(r['server_cpu_us'] for r in runs):,.0f} us/request; load "
                f"{', '.join(format(r['load'], '.1f') for r in runs)}")

    shards, trivial = measured["shards"], measured["trivial"]
    p99 = statistics.median(r["p99_us"] for r in shards) / 1e3
    own_p99 = statistics.median(r["own_p99_us"] for r in shards) / 1e3
    trivial_over = sum(r["p99_us"] > 3000 for r in trivial)
    lines = [
        f"{label}, nothing else sent to the server: {line(shards)}",
        f"the trivial endpoint at 1 connection (its own server, same options), just before in each round: "
        f"{line(trivial)}; its wrk p99 over 3 ms in {trivial_over} of {len(trivial)} rounds",
        f"the same requests for 8 steps cycled (answers kept by the server: no index math, no JSON), just before in "
        f"each round: {line(measured['kept'])}",
        f"this machine alone, a fixed pure-Python task run after 0.5 ms sleeps for {args.seconds} s: p50 "
        f"{unit_p50:,.0f} us, p99 {unit_p99:,.0f} us ({unit_p99 / unit_p50:.1f}x the median)",
        f"target p99 <= 3 ms at 1 connection on a quiet machine: wrk's {p99:.2f} ms ({'met' if p99 <= 3 else 'NOT met'}), "
        f"each request's own {own_p99:.2f} ms ({'met' if own_p99 <= 3 else 'NOT met'}); median of {args.rounds} rounds "
        f"of {args.seconds} s. wrk adds, for a request of latency L, samples at L - i * T (T: the run's mean time per "
        "request) while above T: a client sending at a fixed rate would have waited for it",
    ]
    print("\n".join(lines))
    if args.write:
        write_section("Server with wrk: latency at one connection", lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--profile", action="store_true", help="only where the server's time goes (needs py-spy)")
    parser.add_argument("--latency-only", action="store_true",
                        help="only the 1-connection latency runs (r64, hosts together; the trivial endpoint before it in "
                             "each round), nothing else sent to the servers meanwhile: the p99 target asks for a quiet machine")
    parser.add_argument("--encoding", default="compact", choices=("compact", "base64"),
                        help="the encoding --profile asks for (the throughput runs measure both)")
    parser.add_argument("--baseline", type=Path, metavar="TREE",
                        help="another source tree (e.g. git archive main | tar -x -C TREE) served too, on the same caches, "
                             "and measured right after this tree in every configuration")
    parser.add_argument("--targets-only", action="store_true",
                        help="only what the targets judge: the trivial endpoint, the 1-connection run and the pods")
    parser.add_argument("--serve-trivial", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_trivial:
        serve_trivial(args.serve_trivial)
        return
    root = OUT
    runs = [*make_runs(root), *(pod_run(root, shards) for shards in POD_SHARDS)]
    work = Path(tempfile.mkdtemp(prefix="bench-wrk-"))
    (work / "runs.json").write_text(json.dumps(runs))
    script = work / "shards.lua"
    script.write_text(LUA)

    def serve(tree: Path, log: str) -> tuple[int, subprocess.Popen]:
        at = free_port()
        return at, start([sys.executable, "-m", "taskdata", "serve", "--cache-root", str(root), "--runs-file",
                          str(work / "runs.json"), "--port", str(at), "--no-access-log", "--first-use-check", "listing"],
                         at, work / log, tree=tree)

    trees = {"this tree": serve(REPO, "server.log")}
    if args.baseline is not None:
        trees["baseline"] = serve(args.baseline.resolve(), "baseline.log")
    port, server = trees["this tree"]
    trivial_port = free_port()
    trivial = start([sys.executable, __file__, "--serve-trivial", str(trivial_port)], trivial_port,
                    work / "trivial.log")
    loads = [f"{os.getloadavg()[0]:.1f}"]
    try:
        # First use (listing) before anything is timed.
        for at, _ in trees.values():
            for run in ("r64", "r65536", *(f"pod{n}" for n in POD_SHARDS)):
                started = time.monotonic()
                while subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                                      f"http://127.0.0.1:{at}/shards?host=0&step=0&run={run}"],
                                     capture_output=True, text=True).stdout != "200":
                    if time.monotonic() - started > 600:
                        raise SystemExit(f"run {run} not ready after 600 s")
                    time.sleep(0.5)
        if args.profile:
            lines = profile(port, server.pid, str(script), args.seconds, args.encoding)
            print("\n".join(lines))
            if args.write:
                write_section("Server with wrk: where the time goes", lines)
            return
        if args.latency_only:
            latency_only(port, server.pid, trivial_port, trivial.pid, str(script), args)
            return
        results: dict[tuple[str, str], list[dict]] = {}  # (tree, configuration) -> one result per round
        configs = [CONFIGS[0], CONFIGS[-1]] if args.targets_only else CONFIGS
        for round_ in range(args.rounds):
            for i, (label, run, hosts, mode, steps, connections, encoding) in enumerate(configs):
                targets = {"trivial": (trivial_port, trivial)} if run is None else trees
                for tree, (at, process) in targets.items():
                    base = 10_000 + (round_ * len(CONFIGS) + i) * 10_000_000  # fresh steps every time
                    load = os.getloadavg()[0]
                    result = wrk(str(script), at, process.pid, connections, args.seconds, MODE=mode, RUN=run or "",
                                 HOSTS=hosts, STEPS=steps, BASE=base, ENCODING=encoding)
                    result["load"] = (load + os.getloadavg()[0]) / 2
                    results.setdefault((tree, label), []).append(result)
                    print(tree, label, {k: round(v, 1) for k, v in result.items()}, flush=True)
            loads.append(f"{os.getloadavg()[0]:.1f}")
        bursts: dict[tuple[str, int], list[dict]] = {}
        for round_ in range(args.rounds):
            for shards in POD_SHARDS:
                for tree, (at, process) in trees.items():  # each tree its own fresh window
                    step = 900_000_000 + round_ * 1_000_000 + shards * 16 + (tree != "this tree") * 100_000
                    bursts.setdefault((tree, shards), []).append(burst(at, process.pid, shards, step))
        paced = {(tree, rate): paced_pod(at, process.pid, POD_SHARDS[-1], rate, 32.0,
                                         800_000_000 + int(rate) * 10_000 + (tree != "this tree") * 100_000_000)
                 for rate in (1.0, 4.0) for tree, (at, process) in trees.items()}
        server_rss = {tree: rss_mb(process.pid) for tree, (_, process) in trees.items()}
    finally:
        stop(trivial)
        for _, process in trees.values():
            stop(process)
    med = {key: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for key, rs in results.items()}
    lines = []
    m = med["trivial", "trivial endpoint"]
    lines.append(
        f"trivial endpoint (16 connections): {m['rate']:,.0f} req/s (its server busy "
        f"{m['rate'] * m['server_cpu_us'] / 1e6:.0%} of a core while wrk took {m['wrk_cpu']:.0%}: wrk is "
        f"{'not ' if m['wrk_cpu'] < 0.5 else ''}the bottleneck), p50 {m['p50_us'] / 1e3:.2f} ms, p99 "
        f"{m['p99_us'] / 1e3:.2f} ms, server CPU {m['server_cpu_us']:,.0f} us/request; load "
        f"{', '.join(format(r['load'], '.1f') for r in results['trivial', 'trivial endpoint'])}")
    for label, _run, _hosts, _mode, _steps, connections, _encoding in configs[1:]:
        for tree in trees:
            m = med[tree, label]
            lines.append(
                f"{tree}, {label} ({connections} connection{'s' if connections > 1 else ''}): {m['rate']:,.0f} req/s, "
                f"p50 {m['p50_us'] / 1e3:.2f} ms, p99 {m['p99_us'] / 1e3:.2f} ms, {m['bytes'] / m['requests']:,.0f} "
                f"bytes/answer, server CPU {m['server_cpu_us']:,.0f} us/request, wrk {m['wrk_cpu']:.0%} of a core; "
                f"load {', '.join(format(r['load'], '.1f') for r in results[tree, label])}")
    restart, trained, one_connection = {}, {}, {}
    for tree in trees:
        for shards in POD_SHARDS:
            b = {key: statistics.median(r[key] for r in bursts[tree, shards]) for key in bursts[tree, shards][0]}
            hosts = shards * MODEL_AXIS
            restart[tree] = b["seconds"]  # (the last: the largest pod)
            lines.append(
                f"{tree}, pod of {hosts:,} hosts ({shards} data shards x model axis {MODEL_AXIS}), all asking for the "
                f"same new 16-step window at once (64 connections): every host answered in {b['seconds']:.2f} s, p50 "
                f"{b['p50'] * 1e3:.1f} ms, p99 {b['p99'] * 1e3:.1f} ms, {b['bytes']:,.0f} bytes/answer; server CPU "
                f"{b['cpu']:.2f} s per window = {b['cpu'] / 16 * 1e3:.0f} ms per training step; load {b['load']:.1f}")
        for rate in (1.0, 4.0):
            p = paced[tree, rate]
            if rate == 1.0:
                trained[tree] = p
            lines.append(
                f"{tree}, pod of {POD_SHARDS[-1] * MODEL_AXIS:,} hosts training at {rate:g} step/s for 32 s, each host "
                f"asking for its next 16-step window as it starts one, hosts spread over the window: {p['requests']:,} "
                f"requests, p50 {p['p50'] * 1e3:.1f} ms, p99 {p['p99'] * 1e3:.1f} ms (from the moment each was due), "
                f"server CPU {p['cpu_per_step'] * 1e3:.0f} ms per training step, {p['cpu_share']:.0%} of a core; "
                f"load {p['load']:.1f}")
        one_connection[tree] = med[tree, CONFIGS[-1][0]]["p99_us"] / 1e3
        lines.append(f"{tree}, server RSS after every run above was served: {server_rss[tree]:,.0f} MB")
    for tree in trees:
        p99_pod, share = trained[tree]["p99"] * 1e3, trained[tree]["cpu_share"]
        met = [p99_pod <= 20 and share < 1, restart[tree] <= 5, one_connection[tree] <= 3]
        lines.append(
            f"{tree}, targets: {POD_SHARDS[-1] * MODEL_AXIS:,} hosts at 1 step/s on one core, p99 <= 20 ms: "
            f"{p99_pod:.1f} ms at {share:.0%} of a core ({'met' if met[0] else 'NOT met'}); their synchronised "
            f"restart answered in <= 5 s: {restart[tree]:.2f} s ({'met' if met[1] else 'NOT met'}); p99 at one "
            f"connection <= 3 ms: {one_connection[tree]:.2f} ms ({'met' if met[2] else 'NOT met'}; a quiet machine "
            f"is asked)")
    lines.append(f"medians of {args.rounds} interleaved rounds of {args.seconds} s; load {', '.join(loads)}")
    print("\n".join(lines))
    if args.write:
        write_section("Server with wrk: what a pod needs", lines)


if __name__ == "__main__":
    main()
