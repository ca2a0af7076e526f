"""In-process cost of a ``/shards`` step's index math and answer, no HTTP (what bench_wrk.py's server spends
per request before the socket): one host slice computed alone as a ``StepReads`` (``step_slices(..., only=i)``), a
whole step of 8 slices (``step_slices``), and a new step's answer as the server writes it for a host whose step
no other host asked for (``step_json``: the slice alone and its compact JSON, then ``shards_body``), and what
the trainer client's local source (``LocalAssignments.fetch``, no server) spends on one host's step, its byte ranges
looked up in the shards' offsets (every sidecar loaded first; a shard's first read also adds its offsets to the
client's table, which r65536's 3 x 65,536 shards still do in every round), on
bench_server.py's runs r64 and r65536 (3-task mixture, global batch 2048, 8 data shards), at steps far
into the run (every task many epochs in, as bench_wrk.py asks).

Run: PYTHONPATH=. python bench/bench_step_math.py [--rounds 7] [--profile r64|r65536]

Each figure is the median over rounds of the mean over 200 fresh steps (steps never repeat, so no cache
holds them), in CPU time of this process (what the server's CPU per request counts: on a shared machine,
wall time also counts waiting for a core); the machine's 1-minute load average is printed with them.
Builds bench_server.py's caches under bench/out/server first if they are not there (minutes, once).
Compare a tree with another (e.g. main) by running this file under each: PYTHONPATH=TREE python
bench/bench_step_math.py, the same caches (bench/out/server, a link in the other tree).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_server import HOSTS, OUT, make_runs

PER_ROUND = 200


def setup() -> dict:
    """Per run name: (state, stored run, tables), with the run's caches resolved and its tables built."""
    from server.assignments import AnswerCache
    from taskdata.runs import CacheResolver, StoredRun

    root = OUT / "caches"
    runs = make_runs(root)
    out = {}
    for data in runs:
        run = StoredRun.from_dict(data)
        caches = CacheResolver(str(root), level="listing").resolve_run(run)
        memory = AnswerCache(0)
        memory.prepare(run, caches)
        tables = memory.tables(run, caches)
        for files in tables.files:
            files.names_json  # noqa: B018 (found once per cache version, as the server's first compact answer does)
        out[run.name] = (run, caches, memory, tables)
    return out


def timings(prepared: dict, rounds: int) -> list[str]:
    from server.assignments import shards_body, step_json
    from taskdata.index import step_slices
    from trainer_client.assignments import HostSlice
    from trainer_client.local_source import LocalAssignments

    lines = []
    for name, (run, _caches, memory, tables) in prepared.items():
        step_slices(tables, 0, HOSTS)  # the plan's layout tables, once per process
        # The trainer client's own source (no server): every sidecar loaded first, as after a host's first epoch.
        local = LocalAssignments.from_cache_root(run, str(OUT / "caches"))
        for reader in local.readers.values():
            reader.load_offsets(run.plan.split, range(len(reader.record_counts(run.plan.split))))
        local.fetch(0, 1, HostSlice(0, HOSTS))
        figures: dict[str, list[float]] = {"one slice": [], "whole step": [], "answer": [], "client": []}
        for round_ in range(rounds):
            base = 10_000 + round_ * 1_000_000
            steps = range(base, base + PER_ROUND)
            started = time.process_time()
            for step in steps:
                step_slices(tables, step, HOSTS, only=step % HOSTS)[0]
            figures["one slice"].append((time.process_time() - started) / PER_ROUND)
            started = time.process_time()
            for step in steps:
                step_slices(tables, step, HOSTS)
            figures["whole step"].append((time.process_time() - started) / PER_ROUND)
            started = time.process_time()
            for step in range(base + 500_000, base + 500_000 + PER_ROUND):
                # What a request for a new step costs the route (the answer LRU holds nothing: AnswerCache(0)).
                host = step % HOSTS
                body = step_json(memory, run.name, tables, step, host, HOSTS, "compact")
                shards_body(run, host, HOSTS, host, step, [body])
                memory.clear_step_slices()
            figures["answer"].append((time.process_time() - started) / PER_ROUND)
            started = time.process_time()
            for step in range(base + 700_000, base + 700_000 + PER_ROUND):
                local.fetch(step, 1, HostSlice(step % HOSTS, HOSTS))
            figures["client"].append((time.process_time() - started) / PER_ROUND)
        lines.append(
            f"{name}: "
            + ", ".join(f"{k} {statistics.median(v) * 1e6:.0f} us (min {min(v) * 1e6:.0f})" for k, v in figures.items())
        )
    lines.append(f"load {os.getloadavg()[0]:.1f} (1-minute average, 2 cores)")
    return lines


def profile(prepared: dict, name: str) -> None:
    from taskdata.index import step_slices

    _run, _caches, _memory, tables = prepared[name]
    step_slices(tables, 0, HOSTS)
    profiler = cProfile.Profile()
    profiler.enable()
    for step in range(10_000, 10_000 + 1000):
        step_slices(tables, step, HOSTS, only=step % HOSTS)[0]
        step_slices(tables, step, HOSTS)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--profile", choices=("r64", "r65536"))
    args = parser.parse_args()
    prepared = setup()
    if args.profile:
        profile(prepared, args.profile)
        return
    print("\n".join(timings(prepared, args.rounds)))


if __name__ == "__main__":
    main()
