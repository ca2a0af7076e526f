"""Per-unit costs of the cache job, the inputs of SCALE.md's full-C4 plan.

For each corpus size: the built-in C4-format corpus (the recipe of ``bench_cache.py``, same folders),
then the whole job (``taskdata cache --task c4_span_corruption``, both splits, Beam's multi-process
local runner) as a subprocess, in interleaved rounds. CPU-seconds are the user + system time of the
job's whole process tree (``RUSAGE_CHILDREN`` around it: every Beam worker is a descendant that is
waited for); the job's own log line gives the time of its final verification.

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
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise SystemExit(f"cache job failed:\n{result.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    verified = re.search(r"verified every record of [\d,]+ in ([\d.]+) s", result.stdout + result.stderr)
    version_dir = result.stdout.strip().splitlines()[-1]
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[20000, 100000])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    vocab = corpus.ensure_builtin_vocabulary()
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
    lines.append(f"machine load (1-minute load average, 2 cores shared with other work): "
                 f"{', '.join(f'{x:.1f}' for x in loads)} (before and after each job)")
    print("\n".join(lines))
    if args.write:
        write_section("Scale: cache job per-unit costs", lines)


if __name__ == "__main__":
    main()
