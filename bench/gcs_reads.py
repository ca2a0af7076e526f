"""Epoch orders read from an object store at its latency: the trainer client's path against the test store.

Called by ``bench/bench_epoch_order.py --gcs``. The path is the README's client path: a ``DataIterator``
over ``LocalAssignments`` reading a cache version at ``gs://`` through gcsfs, which points at
``STORAGE_EMULATOR_HOST``, here the concurrent test store ``bench/object_store.py``: it serves the local
cache's folder as the bucket's objects, delays every request by ``--delay-ms`` (a GCS round trip) without
holding up the others, and counts them (GETs with a Range header are reads of records; whole-object GETs
of ``.offsets`` files are sidecars; metadata requests are counted apart), which is the ground truth of how
many requests the client makes. The same steps are read from the local folder in the same run, for the
local-disk rate and CPU they are compared with. The cache is built locally from a synthetic task (kept
under ``$TASKDATA_HOME/bench``, reused when its fingerprint matches).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Iterator, Sequence

import numpy as np

from taskdata.define.features import Feature
from taskdata.define.task import Task
from taskdata.define.vocabularies import ByteVocabulary
from taskdata.preprocessors.base import Example, ShardContext
from taskdata.sources import FunctionSource

__all__ = ["measure_gcs", "register_tasks"]

TASK = "gcs_bench"
SOURCE_SHARDS = 32
DOCS_PER_SHARD = 2048  # 65,536 records in 32 cache shards of about 2,048 (~4 MB each)
BUCKET = "bench"
VOCAB = ByteVocabulary()
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu"]
# GCS's list price of Class B operations (object GETs), Standard storage: $0.0004 per 1,000
# (https://cloud.google.com/storage/pricing-examples).
CLASS_B_PER_10K = 0.004
POD_HOSTS = 1024


# --- the task: documents of ~1,000-3,000 characters, one example each ------------------------------------


def documents(split: str, shard: str) -> Iterator[dict]:
    rng = np.random.default_rng([int(shard), len(split)])
    for i in range(DOCS_PER_SHARD):
        words = [WORDS[int(j)] for j in rng.integers(0, len(WORDS), int(rng.integers(150, 450)))]
        yield {"text": f"{shard}.{i}: " + " ".join(words)}


@dataclasses.dataclass(frozen=True)
class EncodeTargets:
    def __call__(self, examples: Iterator[Example], ctx: ShardContext) -> Iterator[Example]:
        for example in examples:
            yield {"targets": VOCAB.encode(example["text"]), "_source_index": example["_source_index"]}


def register_tasks(registry) -> None:
    shards = {"train": [str(i) for i in range(SOURCE_SHARDS)]}
    registry.add(Task(TASK, FunctionSource(documents, shards), [EncodeTargets()], {"targets": Feature(VOCAB)}))


def ensure_cache(root: str) -> str:
    """The local cache version of the bench task under ``root`` (built once, then reused)."""
    from taskdata.beam.job import CacheOptions, run_cache_job
    from taskdata.define.registry import Registry

    registry = Registry()
    registry.load_module(__name__)
    options = CacheOptions(task=TASK, output=root, num_shards=SOURCE_SHARDS, modules=(__name__,), progress=False)
    return run_cache_job(options, registry, log=lambda m: None).version_dir


# --- the measurement --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Run:
    """One client's read of steps ``[first, first + warmup + timed)``, timed over the last ``timed``."""

    examples_per_s: float
    cpu_us_per_example: float  # this process's CPU time (every thread) over the timed steps
    data_gets_per_step: float  # ranged GETs of shard bytes, over every step read
    sidecar_gets: int  # whole-object GETs of offsets sidecars (one per shard opened)
    metadata: int  # metadata requests (none expected)
    other: int  # every other request (manifest, COMPLETED, stats)
    max_in_flight: int  # ranged GETs in flight at once at the store, in the timed steps


def _client(plan, version: str, lengths, host, first: int, warmup: int, timed: int, store=None) -> Run:
    from trainer_client.iterator import DataIterator
    from trainer_client.local_source import LocalAssignments

    before = store.counts() if store is not None else None
    iterator = DataIterator(LocalAssignments(plan, {TASK: version}), lengths, start=first, host_slice=host,
                            stop_step=first + warmup + timed)
    try:
        for _ in range(warmup):
            next(iterator)
        if store is not None:
            store.counts(reset_max=True)
        started, cpu = time.perf_counter(), time.process_time()
        for _ in range(timed):
            next(iterator)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    finally:
        iterator.close()
    examples = timed * (len(plan.positions(first)) // host.count)
    if store is None:
        return Run(examples / elapsed, 1e6 * cpu / examples, 0, 0, 0, 0, 0)
    served = store.counts() - before
    sidecars = sum(n for k, n in served.objects.items() if k.endswith(".offsets media"))
    return Run(examples / elapsed, 1e6 * cpu / examples, served.requests["media ranged"] / (warmup + timed),
               sidecars, served.requests["metadata"], served.requests["media whole"] - sidecars, served.max_ranged_in_flight)


def _instruction_reads(plan, version: str, host, first: int, steps: int) -> float:
    """Mean reads per step the instructions of steps ``[first, first + steps)`` name (before the client
    coalesces them)."""
    from trainer_client.local_source import LocalAssignments

    source = LocalAssignments(plan, {TASK: version})
    try:
        return float(np.mean([sum(len(t) for t in s.tasks) for s in source.fetch(first, steps, host)]))
    finally:
        source.close()


def _targets(got, top: float, names: list[str]) -> list[str]:
    """The issue's targets, read off the rows at ``top`` ms."""
    feistel, block, windowed = names
    rate = {(n, e): got[top, n, e][0].examples_per_s for n in names for e in (0, 1, 100)}
    cpu = {(n, e): got[top, n, e][0].cpu_us_per_example / got[top, n, e][1].cpu_us_per_example
           for n in names for e in (0, 1, 100)}
    return [
        f"at {top:g} ms: {feistel} epochs 1 / 100 {rate[feistel, 1]:,.0f} / {rate[feistel, 100]:,.0f} examples/s "
        f"(target >= 2,000) at {got[top, feistel, 1][0].cpu_us_per_example:.0f} / "
        f"{got[top, feistel, 100][0].cpu_us_per_example:.0f} CPU-us per example",
        f"at {top:g} ms: {windowed} epochs 1 / 100 at {rate[windowed, 1] / rate[windowed, 0]:.0%} / "
        f"{rate[windowed, 100] / rate[windowed, 0]:.0%} of its epoch 0's examples/s (target >= 90%), client CPU per "
        f"example {cpu[windowed, 0]:.2f}x / {cpu[windowed, 1]:.2f}x / {cpu[windowed, 100]:.2f}x the local disk's in "
        f"epochs 0 / 1 / 100 (target <= 1.2x); {block}: {cpu[block, 1]:.2f}x / {cpu[block, 100]:.2f}x in epochs 1 / 100",
        f"at {top:g} ms, epoch 0: {', '.join(f'{n} {got[top, n, 0][0].examples_per_s / got[top, n, 0][1].examples_per_s:.0%}' for n in names)} "
        "of the local disk's examples/s in the same run (target >= 50%)",
    ]


def _cost(gets: float) -> str:
    return f"${gets * CLASS_B_PER_10K / 10_000:,.2f}"


def _median(runs: list[Run]) -> Run:
    """The runs' median examples/s and CPU per example (each its own median), with the first run's counts."""
    return dataclasses.replace(runs[0], examples_per_s=float(np.median([r.examples_per_s for r in runs])),
                               cpu_us_per_example=float(np.median([r.cpu_us_per_example for r in runs])))


def measure_gcs(delays_ms: Sequence[float], hosts: int, host_batch: int, orders: Sequence[tuple[str, object]],
                warmup: int, steps: int, repeats: int = 5) -> list[str]:
    """The section's lines: every order in ``orders`` ((name, EpochOrder)) at every delay, epochs 0, 1, 100,
    each row the median of ``repeats`` reads from the store and as many from the local disk, taken in turns."""
    from bench.object_store import running_store
    from taskdata.cache.reader import CacheReader
    from taskdata.config import Config
    from taskdata.index import BatchSchedule, RunPlan, TaskCache, reads_bound, requests_bound
    from trainer_client.assignments import HostSlice

    if "gcsfs" in sys.modules and os.environ.get("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT") != "false":
        raise RuntimeError("gcsfs was imported before GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false was set: it would ask "
                           "Google's metadata server about the store's bucket. Set it before importing gcsfs.")
    os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
    local = ensure_cache(os.path.join(Config.from_environment().home, "bench", "gcs_reads"))
    root = os.path.dirname(os.path.dirname(local))  # the bucket: {task}/{version}/...
    version = f"gs://{BUCKET}/{TASK}/{os.path.basename(local)}"
    with CacheReader(local) as reader:
        cache = TaskCache(reader.manifest_sha256, reader.record_counts("train"))
        lengths = {"targets": reader.max_tokens("train", "targets")}
    n = sum(cache.shard_record_counts)
    batch = hosts * host_batch
    per_epoch = n // batch
    if warmup + steps > per_epoch:
        raise ValueError(f"{warmup} warm-up and {steps} timed steps do not fit in an epoch of {per_epoch} steps.")
    host = HostSlice(0, hosts)
    lines = [
        f"the test object store (bench/object_store.py: GCS JSON API object reads with Range, one asyncio server, "
        f"many requests at once) adding {' or '.join(f'{d:g}' for d in delays_ms)} ms to every request; a synthetic "
        f"cache of {n:,} records of ~2 KB in {len(cache.shard_record_counts)} shards (bench/gcs_reads.py); host 0 of "
        f"{hosts} ({host_batch} examples per step, {per_epoch} steps per epoch) read through DataIterator over "
        f"LocalAssignments (gs:// through gcsfs; DataIterator's defaults: 8 steps' reads in flight, instructions known "
        f"16 steps ahead, or the order's read horizon + 8; FetchOptions(): 64 requests in flight, ranges 64 KiB apart "
        f"one request, extended over later steps' ranges up to 4 MiB, 64 MiB kept), and the same steps from the local "
        f"folder (page cache) in the same run; each "
        f"read a fresh client reading the epoch's first {warmup + steps} steps, timed over the last {steps} (examples/s "
        f"and this process's CPU per example, every thread: the store runs in its own process); each row the median "
        f"of {repeats} such reads from the store and {repeats} from the local disk, taken in turns; GETs counted at "
        f"the store over all {warmup + steps} steps of the first read; 1-minute load average at the start of each row",
        "| delay | order (stated bounds: reads; requests) | epoch | examples/s: store; local disk (ratio) | client CPU "
        "us per example: store; local disk (ratio) | ranged GETs per step (most in flight); reads the instructions "
        "name | sidecar GETs (shards opened); metadata requests | load |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    got: dict[tuple[float, str, int], tuple[Run, Run]] = {}
    for delay in delays_ms:
        with running_store(root, BUCKET, delay_ms=delay) as store:
            os.environ["STORAGE_EMULATOR_HOST"] = store.url
            try:
                for name, order in orders:
                    plan = RunPlan(name="gcs", mixture=TASK, caches={TASK: cache}, rates=None, seed=17,
                                   schedule=BatchSchedule.constant(batch), num_data_shards=hosts, epoch_order=order)
                    bound = f"{reads_bound(plan, host_batch)}; {requests_bound(plan, host_batch)}"
                    for epoch in (0, 1, 100):
                        load = os.getloadavg()[0]
                        first = -(-epoch * n // batch)
                        remotes, disks = [], []
                        for _ in range(repeats):
                            remotes.append(_client(plan, version, lengths, host, first, warmup, steps, store))
                            disks.append(_client(plan, local, lengths, host, first, warmup, steps))
                        remote, disk = _median(remotes), _median(disks)
                        named = _instruction_reads(plan, local, host, first, warmup + steps)
                        got[delay, name, epoch] = remote, disk
                        lines.append(
                            f"| {delay:g} ms | {name} ({bound}) | {epoch} | {remote.examples_per_s:,.0f}; "
                            f"{disk.examples_per_s:,.0f} ({remote.examples_per_s / disk.examples_per_s:.2f}) | "
                            f"{remote.cpu_us_per_example:.1f}; {disk.cpu_us_per_example:.1f} "
                            f"({remote.cpu_us_per_example / disk.cpu_us_per_example:.2f}) | "
                            f"{remote.data_gets_per_step:.1f} ({remote.max_in_flight}); {named:.1f} | {remote.sidecar_gets}; "
                            f"{remote.metadata} | {load:.2f} |"
                        )
            finally:
                os.environ.pop("STORAGE_EMULATOR_HOST", None)
    top = max(delays_ms)
    lines += _targets(got, top, [name for name, _ in orders])
    lines.append(
        f"GETs per epoch and their cost at GCS's list price for Class B operations (${CLASS_B_PER_10K} per 10,000, "
        f"Standard storage), from the ranged GETs per step at {top:g} ms in epoch 100 ({host_batch} examples per host "
        f"and step): one host reading an epoch alone, and a pod of {POD_HOSTS:,} hosts (a global batch of "
        f"{POD_HOSTS * host_batch:,}) reading it together, in all and per host; for this cache ({n:,} records) and "
        "for an epoch of 100 million examples. Each host also reads each shard's offsets sidecar once per run "
        "(a GET per shard it opens), not counted here. These GETs are this cache's: its 4 MB shards let one request "
        "take in the records later steps read nearby; with shards much larger than what the lookahead reads of each "
        "(C4's 256 MB shards), the per-record order makes about the reads its instructions name, one GET per example:"
    )
    for name, _ in orders:
        per_step = got[top, name, 100][0].data_gets_per_step
        cells = []
        for size in (n, 100_000_000):
            total = size / host_batch * per_step
            cells.append(f"{size:,} examples: {total:,.0f} GETs ({_cost(total)}); pod {total:,.0f} "
                         f"({_cost(total)}), {total / POD_HOSTS:,.1f} per host")
        lines.append(f"{name}: {per_step:.1f} GETs per host and step; " + "; ".join(cells))
    return lines


def main() -> None:
    raise SystemExit("Run bench/bench_epoch_order.py --gcs (this module measures for it).")


if __name__ == "__main__":
    main()
