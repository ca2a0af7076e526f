"""Reading a run's stream from a local cache on one core through the trainer client's read path
(``LocalAssignments`` -> ``BatchReader``: read instructions, ranged reads, checks, decode, padding):
examples/s and tokens/s, with and without CRC checks, next to the raw byte-read speed of the same files;
and the cost of the first batch at step 0 versus step 10^6 (seek cost).

    PYTHONPATH=. python bench/bench_stream.py [--version-dir DIR] [--steps 200] [--batch 256]

Uses the built-in c4_span_corruption cache (building it if needed) unless --version-dir is given.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._report import write_section
from taskdata.cache.reader import CacheReader
from taskdata.index import BatchSchedule, RunPlan, TaskCache
from trainer_client.assignments import HostSlice
from trainer_client.local_source import LocalAssignments
from trainer_client.reading import BatchReader


def builtin_cache() -> str:
    from taskdata.beam.job import CacheOptions, run_cache_job
    from taskdata.config import Config
    from taskdata.tasks import default_registry

    config = Config.from_environment()
    options = CacheOptions(task="c4_span_corruption", output=config.cache_root, progress=False, config=config)
    return run_cache_job(options, default_registry(config), log=lambda m: None).version_dir


def cpu() -> float:
    return time.process_time()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--version-dir")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()
    os.sched_setaffinity(0, {0})  # one core: the figures are per core
    version_dir = args.version_dir or builtin_cache()
    probe = CacheReader(version_dir)
    task = probe.task
    plan = RunPlan(name="bench", mixture=task, caches={task: TaskCache(probe.manifest_sha256, probe.record_counts("train"))},
                   rates=None, seed=0, schedule=BatchSchedule(start=args.batch, end=args.batch), num_data_shards=1)

    # Raw bytes of the same files, read sequentially.
    started = cpu()
    total = 0
    for shard in range(len(probe.record_counts("train"))):
        with open(probe.shard_path("train", shard), "rb") as f:
            while chunk := f.read(16 << 20):
                total += len(chunk)
    raw_seconds = cpu() - started

    lines = [f"cache {version_dir} ({sum(probe.record_counts('train')):,} train records, {total / 1e6:.1f} MB), "
             f"host batch {args.batch}, {args.steps} steps, one core (CPU time)",
             f"raw sequential byte read of the shard files: {total / raw_seconds / 1e6:,.0f} MB/s"]
    # The task's declared lengths, else the longest example the cache holds.
    lengths = {
        name: int(probe.manifest.sequence_length.get(name) or probe.max_tokens("train", name))
        for name in ("inputs", "targets")
    }
    whole = HostSlice(0, 1)

    def first_batch(step: int, verify: bool = True) -> tuple[LocalAssignments, BatchReader]:
        source = LocalAssignments(plan, {task: version_dir})
        reader = BatchReader(source.run_info(), lengths, verify_crc=verify)
        reader.read(source.fetch(step, 1, whole)[0])  # opens files and sidecars
        return source, reader

    for verify in (True, False):
        source, reader = first_batch(0, verify)
        started = cpu()
        examples = tokens = 0
        for step_reads in source.fetch(1, args.steps, whole):
            batch = reader.read(step_reads)
            examples += len(batch.positions)
            tokens += batch.num_tokens
        seconds = cpu() - started
        lines.append(f"LocalAssignments.fetch + BatchReader.read (read instructions + ranged reads + "
                     f"{'CRC checks + ' if verify else 'no CRC + '}decode + padding): {examples / seconds:,.0f} "
                     f"examples/s, {tokens / seconds / 1e6:.1f}M tokens/s (target >= 50,000 examples/s with CRCs)")
    for step in (0, 10**6):
        started = time.perf_counter()
        first_batch(step)
        lines.append(f"time to the first batch from a fresh source and reader at step {step:,}: "
                     f"{(time.perf_counter() - started) * 1e3:.1f} ms")
    print("\n".join(lines))
    write_section("Run stream reader", lines)


if __name__ == "__main__":
    main()
