"""The cache job on Beam's Dask runner (a local cluster of 2 workers) against the multi-process DirectRunner (2
workers) and the in-process runner, on the same corpus, in one run, and where Dask's extra time goes.

For each corpus size (the built-in C4-format corpus, the recipe and folders of ``bench_scale.py``), one run of
``taskdata cache --task c4_span_corruption`` (both splits, start-up, commit and verification included) per mode:

- **in-process**: Beam's Python runner in the job's process;
- **2 workers**: ``--direct_running_mode=multi_processing --direct_num_workers=2``;
- **Dask, 2 workers**: ``--runner=dask`` on a scheduler and 2 single-threaded workers (``deploy/dask_cluster.py``),
  started fresh for the run (not counted in its wall) so that, like DirectRunner's, its workers import Beam and
  load the task within the job; the cluster's CPU while idle is measured for 10 s before the job;
- **Dask, 2 workers, no profiler**: the same with the workers' statistical profiler off
  (``DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False``; by default it samples every worker thread every 10 ms).

Wall, CPU-seconds and sampled peak RSS (every 0.1 s) of the job's process tree plus, for Dask, of the scheduler's,
nannies' and workers' processes (their CPU from /proc, the difference across the run). The caches of every mode must
be byte-identical (their manifests' shard digests), or the bench fails. For the Dask run, the scheduler's task
stream says where the workers' time went (per stage: compute, transfer, deserialization) and the job's
stderr lines, stamped as they arrive, where the launcher's went.

    PYTHONPATH=. flock /tmp/bench.lock python bench/bench_dask.py --sizes 20000 100000 [--write]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._measure import process_tree, tree_rss
from bench._report import write_section
from bench.bench_scale import corpus_params
from deploy.dask_cluster import dask_cluster
from taskdata.tasks import corpus

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")
_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pids: set[int]) -> dict[int, float]:
    """User + system time of each process and of its children it has waited for."""
    out = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[pid] = sum(int(x) for x in fields[11:15]) / _TICK
        except (OSError, IndexError, ValueError):
            continue
    return out


def run_job(corpus_dir: str, output: str, beam_args: list[str], vocab: str, cluster_roots: list[int]) -> dict:
    shutil.rmtree(output, ignore_errors=True)
    env = dict(os.environ, TASKDATA_VOCAB=vocab, PYTHONPATH=os.getcwd())
    command = [sys.executable, "-m", "taskdata", "cache", "--task", "c4_span_corruption", "--c4-dir", corpus_dir,
               "--output", output, "--force", "--", *beam_args]
    cluster = set().union(*(process_tree(p) for p in cluster_roots)) if cluster_roots else set()
    cluster_before = _cpu_seconds(cluster)
    children_before = os.times()
    started = time.monotonic()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[tuple[float, str]] = []
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            total = tree_rss(process.pid)[0] + sum(tree_rss(p)[0] for p in cluster_roots)
            peak[0] = max(peak[0], total)
            time.sleep(0.1)

    def read_stderr() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append((time.monotonic() - started, line.rstrip("\n")))

    threads = [threading.Thread(target=sample, daemon=True), threading.Thread(target=read_stderr, daemon=True)]
    for thread in threads:
        thread.start()
    assert process.stdout is not None
    stdout = process.stdout.read()
    process.wait()
    seconds = time.monotonic() - started
    done.set()
    for thread in threads:
        thread.join()
    if process.returncode != 0:
        raise SystemExit(f"the cache job ({beam_args}) failed:\n" + "\n".join(line for _, line in lines[-40:]))
    children_after = os.times()
    cpu = (children_after.children_user + children_after.children_system
           - children_before.children_user - children_before.children_system)
    cluster_after = _cpu_seconds(cluster)
    cluster_cpu = sum(cluster_after[p] - cluster_before[p] for p in cluster_after if p in cluster_before)
    version_dir = stdout.strip().splitlines()[-1]
    manifest = json.loads(Path(version_dir, "manifest.json").read_text())
    digests = tuple(shard["sha256"] for split in sorted(manifest["splits"]) for shard in manifest["splits"][split]["shards"])
    examples = sum(s["num_records"] for s in manifest["splits"].values())
    shutil.rmtree(output, ignore_errors=True)
    return {"seconds": seconds, "cpu": cpu + cluster_cpu, "cluster_cpu": cluster_cpu, "peak_tree_rss": peak[0],
            "digests": digests, "examples": examples, "lines": lines, "load": os.getloadavg()[0]}


def _marks(lines: list[tuple[float, str]]) -> dict[str, float]:
    """When the job logged each of its phases (seconds from its start)."""
    patterns = {"task": r"^\[cache\] task ", "cluster ready": r"^\[cache\] Dask cluster ready",
                "writing": r"^\[cache\] writing ", "verified": r"^\[cache\] 3/3 verified", "done": r"^\[cache\] done"}
    found = {}
    for name, pattern in patterns.items():
        for at, line in lines:
            if re.search(pattern, line):
                found[name] = at
                break
    return found


# The task groups Beam's Dask runner makes of the cache pipeline (dask fuses each stage's steps into one task).
STAGES = (("cluster check (each worker loads the task)", r"^_check_worker"),
          ("preprocessing (PreprocessShard, into the shuffle)", r"^apply_dofn_to_bundle-shuffle"),
          ("shuffle (Dask's task-based groupby)", r"^shuffle-"),
          ("shard writing (GroupByKey's output, WriteShard)", r"^get_windowed_value-shuffle"))


def _stages(stream: list[dict], started: float) -> tuple[list[str], float, float]:
    """Per stage of the job on the workers: tasks, and seconds of compute, transfer (between workers) and
    deserialization summed over the workers; and the first start and last stop (seconds from ``started``)."""
    stages: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    first, last = float("inf"), 0.0
    for task in stream:
        key = str(task["key"][0] if isinstance(task["key"], tuple) else task["key"])
        stage = next((name for name, pattern in STAGES if re.search(pattern, key)), "other")
        stages[stage]["tasks"] += 1
        for span in task["startstops"]:
            stages[stage][span["action"]] += span["stop"] - span["start"]
            first, last = min(first, span["start"]), max(last, span["stop"])
    lines = []
    for stage in [name for name, _ in STAGES] + ["other"]:
        c = stages.get(stage)
        if c:
            parts = ", ".join(f"{action} {c[action]:.2f} s" for action in (
                "compute", "transfer", "deserialize", "disk-read", "disk-write") if c[action])
            lines.append(f"{stage}: {c['tasks']} tasks, {parts}")
    return lines, first - started, last - started


def run_dask(corpus_dir: str, output: str, vocab: str, work: str, profiler: bool = True) -> dict:
    """The job on a fresh cluster; also the cluster's CPU while idle (10 s before the job). ``profiler``: the
    workers' statistical profiler (distributed's default samples every worker thread's stack every 10 ms)."""
    from distributed import Client

    env = dict(os.environ, TASKDATA_VOCAB=vocab)
    if not profiler:
        env["DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED"] = "False"
    starting = time.monotonic()
    with dask_cluster(2, Path(work), env) as cluster:
        startup = time.monotonic() - starting
        roots = [p.pid for p in cluster.processes]
        with Client(cluster.address, set_as_default=False) as client:
            client.get_task_stream(start=0, stop=0)  # the scheduler records tasks from here on
            pids = set().union(*(process_tree(p) for p in roots))
            time.sleep(2)
            before = _cpu_seconds(pids)
            time.sleep(10)
            after = _cpu_seconds(pids)
            idle = sum(after[p] - before[p] for p in after if p in before) / 10
            wall_started = time.time()
            result = run_job(corpus_dir, output, ["--runner=dask", f"--dask_client_address={cluster.address}"], vocab,
                             roots)
            stream = client.get_task_stream(start=wall_started)
    groups, first, last = _stages(stream, wall_started)
    return {**result, "cluster_startup": startup, "idle_cpu": idle, "groups": groups, "first_task": first,
            "last_task": last}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[20000, 100000])
    parser.add_argument("--write", action="store_true", help="write the figures into BENCHMARKS.md")
    args = parser.parse_args()
    if args.write and sorted(args.sizes) != [20000, 100000]:
        raise SystemExit("--write records the full comparison: --sizes 20000 100000")
    vocab = corpus.ensure_builtin_vocabulary()
    lines = []
    loads = [os.getloadavg()[0]]
    for size in args.sizes:
        corpus_dir = os.path.join(OUT, f"corpus-{size}")
        if not os.path.exists(os.path.join(corpus_dir, "CORPUS.json")):
            corpus.build_corpus(corpus_dir, **corpus_params(size))
        output = os.path.join(OUT, f"dask-cache-{size}")
        runs = {
            "in-process": run_job(corpus_dir, output, [], vocab, []),
            "2 workers": run_job(corpus_dir, output, ["--direct_running_mode=multi_processing",
                                                      "--direct_num_workers=2"], vocab, []),
            "Dask, 2 workers": run_dask(corpus_dir, output, vocab, os.path.join(OUT, "dask-workers")),
            "Dask, 2 workers, no profiler": run_dask(corpus_dir, output, vocab, os.path.join(OUT, "dask-workers"),
                                                     profiler=False),
        }
        for mode, run in runs.items():
            loads.append(run["load"])
            print(f"{size} {mode}: wall {run['seconds']:.2f} s, CPU {run['cpu']:.2f} s, peak RSS "
                  f"{run['peak_tree_rss'] / 2**20:,.0f} MB, load {run['load']:.2f}", flush=True)
        if len({run["digests"] for run in runs.values()}) != 1:
            raise SystemExit(f"the caches of {size} documents differ between modes")
        source_files = len(list(Path(corpus_dir).glob("c4-*.json.gz")))
        lines.append(f"{size:,} train documents ({source_files} source files), {runs['in-process']['examples']:,} "
                     "examples; the caches of every mode byte-identical")
        for mode, run in runs.items():
            lines.append(f"{mode}: {run['seconds']:.2f} s wall, {run['cpu']:.2f} CPU-s, peak RSS "
                         f"{run['peak_tree_rss'] / 2**20:,.0f} MB"
                         + (f" (scheduler, nannies and workers: {run['cluster_cpu']:.2f} CPU-s of it, of which "
                            f"{run['idle_cpu'] * run['seconds']:.2f} at the idle cluster's {run['idle_cpu']:.3f} "
                            f"CPU-s/s; the cluster took {run['cluster_startup']:.1f} s to start, before the job)"
                            if "groups" in run else ""))
        dask = runs["Dask, 2 workers"]
        marks = _marks(dask["lines"])
        inproc = _marks(runs["in-process"]["lines"])
        lines.append(
            "Dask, where the time went (seconds from the job's start): task and fingerprint at "
            f"{marks.get('task', float('nan')):.1f} (in-process {inproc.get('task', float('nan')):.1f}), cluster "
            f"checked at {marks.get('cluster ready', float('nan')):.1f}, first task on a worker at "
            f"{dask['first_task']:.1f}, last at {dask['last_task']:.1f}, verified at "
            f"{marks.get('verified', float('nan')):.1f}, done at {marks.get('done', float('nan')):.1f}; the "
            "workers' time by stage: " + "; ".join(dask["groups"]))
    lines.append(f"one run per mode and size; 1-minute load average (2 cores shared with other work) before and "
                 f"after each run: {', '.join(f'{x:.1f}' for x in loads)}")
    print("\n".join(lines))
    if args.write:
        write_section("Cache job on Dask", lines)


if __name__ == "__main__":
    main()
