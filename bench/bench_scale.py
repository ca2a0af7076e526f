"""Per-unit costs of the cache job, the inputs of SCALE.md's full-C4 plan.

For each corpus size: the built-in C4-format corpus (the recipe of ``bench_cache.py``, same folders),
then the whole job (``taskdata cache --task c4_span_corruption``, both splits, Beam's multi-process
local runner) as a subprocess, in interleaved rounds. CPU-seconds are the user + system time of the
job's whole process tree (``RUSAGE_CHILDREN`` around it: every Beam worker is a descendant that is
waited for); the job's own log line gives the time of its final verification.

Then a trainer host's memory: a fresh process per configuration runs the client (``DataIterator`` over
``ServerAssignments``, lookahead 16, prefetch 4, inputs 512 / targets 114) for 60 steps against a
``taskdata serve`` of the largest cache, with 8 and with 512 data shards (global batch 2048): its peak
RSS, and its RSS after imports (the pipeline's own share is the difference).

    PYTHONPATH=. python bench/bench_scale.py --sizes 20000 100000 --rounds 2 [--write]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._measure import run_measured
from bench._report import write_section
from taskdata.tasks import corpus

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")


def corpus_params(size: int) -> dict:
    return dict(num_train_docs=size, num_validation_docs=max(200, size // 20),
                train_files=max(8, size // 3000), validation_files=2)


def run_job(corpus_dir: str, output: str, workers: int, vocab: str) -> dict:
    env = dict(os.environ, TASKDATA_VOCAB=vocab, PYTHONPATH=os.getcwd())
    command = [sys.executable, "-m", "taskdata", "cache", "--task", "c4_span_corruption", "--c4-dir", corpus_dir,
               "--output", output, "--force", "--", f"--direct_num_workers={workers}",
               "--direct_running_mode=multi_processing"]
    job = run_measured(command, env, what="cache job", sample_rss=False)
    wall, cpu = job["seconds"], job["cpu"]
    verified = re.search(r"verified every record of [\d,]+ in ([\d.]+) s", job["stdout"] + job["stderr"])
    version_dir = job["stdout"].strip().splitlines()[-1]
    manifest = json.loads(Path(version_dir, "manifest.json").read_text())
    examples = sum(s["num_records"] for s in manifest["splits"].values())
    size = sum(sh["bytes"] for s in manifest["splits"].values() for sh in s["shards"])
    tokens = 0
    for split in manifest["splits"]:
        stats = json.loads(Path(version_dir, f"stats.{split}.json").read_text())
        tokens += stats["inputs_tokens"] + stats["targets_tokens"]
    return {"wall": wall, "cpu": cpu, "verify_s": float(verified.group(1)) if verified else float("nan"),
            "examples": examples, "bytes": size, "tokens": tokens,
            "shards": sum(s["num_shards"] for s in manifest["splits"].values())}


def _client_child(url: str, run: str, steps: int) -> None:
    from trainer_client.assignments import HostSlice
    from trainer_client.iterator import DataIterator
    from trainer_client.server_source import ServerAssignments

    baseline = _rss_mb()
    source = ServerAssignments(url, run)
    data_shards = source.run_info().plan.num_data_shards
    iterator = DataIterator(source, {"inputs": 512, "targets": 114}, host_slice=HostSlice(0, data_shards),
                            lookahead=16, prefetch=4, stop_step=steps)
    examples = sum(len(batch.features["inputs"]) for batch in iterator)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"baseline_mb": baseline, "peak_mb": peak, "examples": examples}))


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def client_memory(size: int, vocab: str) -> list[str]:
    from bench.bench_server import free_port, start, stop

    root = os.path.join(OUT, f"scale-cache-{size}")
    env = dict(os.environ, TASKDATA_VOCAB=vocab, PYTHONPATH=os.getcwd())
    for shards in (8, 512):
        subprocess.run([sys.executable, "-m", "taskdata", "plan", "--name", f"scale{shards}", "--mixture",
                        "c4_span_corruption", "--cache-root", root, "--c4-dir", os.path.join(OUT, f"corpus-{size}"),
                        "--seed", "1", "--batch-size", "2048", "--num-data-shards", str(shards)],
                       env=env, check=True, capture_output=True)
    port = free_port()
    server = start([sys.executable, "-m", "taskdata", "serve", "--cache-root", root, "--port", str(port),
                    "--no-access-log"], port, Path(OUT) / "scale-server.log")
    lines = []
    try:
        for shards in (8, 512):
            out = subprocess.run([sys.executable, __file__, "--client-child", f"http://127.0.0.1:{port}",
                                  f"scale{shards}", "60"], env=env, capture_output=True, text=True, timeout=600)
            if out.returncode != 0:
                raise SystemExit(out.stderr[-3000:])
            m = json.loads(out.stdout.strip().splitlines()[-1])
            lines.append(
                f"trainer client, {shards} data shards (host batch {2048 // shards}), 60 steps from the server, "
                f"lookahead 16, prefetch 4: peak RSS {m['peak_mb']:,.0f} MB, after imports {m['baseline_mb']:,.0f} MB: "
                f"the pipeline's own share {m['peak_mb'] - m['baseline_mb']:,.0f} MB ({m['examples']:,} examples read)")
    finally:
        stop(server)
    return lines


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--client-child":
        _client_child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[20000, 100000])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--client-only", action="store_true", help="only the client memory lines (no writing)")
    args = parser.parse_args()
    vocab = corpus.ensure_builtin_vocabulary()
    if args.client_only:
        print("\n".join(client_memory(max(args.sizes), vocab)))
        return
    dirs = {}
    for size in args.sizes:
        dirs[size] = os.path.join(OUT, f"corpus-{size}")
        if not os.path.exists(os.path.join(dirs[size], "CORPUS.json")):
            corpus.build_corpus(dirs[size], **corpus_params(size))
    runs: dict[int, list[dict]] = {size: [] for size in args.sizes}
    loads = [os.getloadavg()[0]]
    for _ in range(args.rounds):
        for size in args.sizes:
            runs[size].append(run_job(dirs[size], os.path.join(OUT, f"scale-cache-{size}"), args.workers, vocab))
            loads.append(os.getloadavg()[0])
            print(size, runs[size][-1], flush=True)
    lines = []
    per_million = {}
    for size in args.sizes:
        docs = size + corpus_params(size)["num_validation_docs"]
        cpus = ", ".join(f"{r['cpu']:.1f}" for r in runs[size])
        med = {key: statistics.median(r[key] for r in runs[size]) for key in ("wall", "cpu", "verify_s")}
        first = runs[size][0]
        per_million[size] = med["cpu"] / docs * 1e6
        lines.append(
            f"{docs:,} documents ({size:,} train): {first['examples']:,} examples, {first['tokens']:,} tokens "
            f"(inputs + targets), {first['shards']} shards, {first['bytes']:,} bytes = "
            f"{first['bytes'] / first['tokens']:.3f} bytes per token, {first['bytes'] / first['examples']:,.0f} "
            f"bytes per example; job wall {med['wall']:.1f} s, CPU {med['cpu']:.1f} s "
            f"({per_million[size]:,.0f} CPU-s per million documents; its final verification {med['verify_s']:.1f} s "
            f"wall), {args.workers} Beam workers, median of {len(runs[size])} rounds "
            f"(CPU: {cpus} s)")
    if len(args.sizes) >= 2:
        small, large = min(args.sizes), max(args.sizes)
        docs = {s: s + corpus_params(s)["num_validation_docs"] for s in (small, large)}
        cpu = {s: statistics.median(r["cpu"] for r in runs[s]) for s in (small, large)}
        marginal = (cpu[large] - cpu[small]) / (docs[large] - docs[small]) * 1e6
        fixed = cpu[small] - marginal * docs[small] / 1e6
        lines.append(f"marginal cost between the two sizes: {marginal:,.0f} CPU-s per million documents, fixed "
                     f"cost (start-up) {fixed:.1f} CPU-s per job")
    lines += client_memory(max(args.sizes), vocab)
    lines.append(f"machine load (1-minute load average, 2 cores shared with other work): "
                 f"{', '.join(f'{x:.1f}' for x in loads)} (before and after each job)")
    print("\n".join(lines))
    if args.write:
        write_section("Scale: cache job per-unit costs", lines)


if __name__ == "__main__":
    main()
