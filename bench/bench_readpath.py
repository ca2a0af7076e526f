"""The host read path against tf.data, seqio's cached reader and bare framing + CRC, on the same cache
files, in one run: examples/s on 1 and 2 cores, and the time to the first batch.

    PYTHONPATH=. python bench/bench_readpath.py [--version-dir DIR] [--rounds 3] [--steps 300] [--baseline DIR] [--write]

The read path is exactly what a trainer runs: ``DataIterator`` over ``LocalAssignments`` (index math,
ranged reads, both CRCs and each record's place checked, decode, padding to 512/114, host batch 256),
with ``workers=0`` (its reading thread) on one core and ``workers=2`` (two read worker processes) on two.
Its plan reads epoch 0 in order, then later epochs in blocks of 4,096 records (``BlockOrder``),
so steps read contiguous records as tf.data does; a second row reads later epochs record by record
(the default per-record order: 256 scattered reads a step). The peers, on the same shard files:

- tf.data: ``TFRecordDataset`` (CRCs checked) -> ``batch(256)`` -> ``parse_example`` (int64 features, no
  provenance) -> dense int32 padded to 512/114; on one core with one thread everywhere, on two with two
  (``num_parallel_calls``, private thread pool, inter/intra-op threads);
- seqio 0.0.20's ``use_cached`` reader (``add_cached_task``, ``get_dataset(use_cached=True)``) ->
  ``padded_batch(256)``, on one core;
- framing + CRC alone: ``taskdata.cache.tfrecord.iter_records`` over the files (records/s and MB/s).

Every figure comes from its own process pinned with ``taskset`` (all its threads and its workers on
those cores); configurations are alternated over ``--rounds`` rounds and the median is reported, with
the load average (1 min) read before each run. One more row runs the 1-core read path in a process started
with ``MALLOC_`` settings equal to the ``mallopt`` of the read workers (``trainer_client.read_workers``):
what a trainer started with them gets. Rates are examples (records) per wall-second over a
window after a warm-up (for ``workers=2``: after the workers have started); CPU per example counts the
process and its workers over that window. The first-batch latency is from building the source and
the iterator to holding the first batch, in a fresh process (imports done).

Where the time went, per batch of 256 (one core; timers around each phase of ``BatchReader.read``, the
minimum of 5 windows of 40 batches, the format-4 cache: inputs, provenance/origin, targets). Before
this round: ~1.55 ms a batch in ``BatchReader.read`` (~0.45 ms the ranged read and its checks: one
``pread``, the frames, one CRC call per record; ~1.07 ms ``decode_padded``: ~0.24 ms the layout walk
of three entries, whose two-byte lengths took ~15 numpy steps each, ~0.05 ms gathering the payloads,
~0.80 ms the varints and padding, every varint read as a 32-bit word and masked, each padding mask a
broadcast comparison), plus 0.08-0.17 ms of index math in the fetching thread; on a loaded machine the
medians were twice the minimums. Now: lengths of one or two bytes are one lookup of their 16-bit word
in a 64K-entry table (layout walk ~0.14 ms); ids of one or two bytes come from their first and last
bytes (two byte gathers and four byte-wide steps; longer ids are fixed up from 32-bit words), padding
masks are rows of a per-length table, and every array of a batch's size lives in the workspace (a
fresh one costs more in page faults than its arithmetic: an index converted to a new array cost 1 ms a
batch); ``decode_padded`` ~0.80 ms (varints and padding ~0.50), ``BatchReader.read`` ~1.24 ms.

With workers (two cores, before this round, per batch): each worker spent ~0.25 ms parsing the step's
JSON into checked ``StepReads``, ~1.7 ms reading and ~0.18 ms writing the 640 KB batch into its pipe;
the iterator ~0.30 ms of index math, ~0.28 ms taking the batch out of the pipe (into fresh arrays) and
~0.1 ms sending steps and queueing batches. Batches now come back through slot files shared with the
iterator (``trainer_client.read_workers``): one memory copy on each side, no pipe.

Next round (readpath3): over a local source each worker computes its own steps' instructions from the
step number (``PlannedStep``; the index math ``LocalAssignments`` runs), so neither side spends the
~0.25 ms of JSON nor the iterator the ~0.30 ms of index math a step; and a last row hands batches out
as read-only views of the slots (``copy_batches=False``), saving the iterator's ~0.28 ms copy. Quick
alternated runs at load ~0.5-1.3 (``--measure readpath``, 1,000 batches): workers=2 on 2 cores
209,822-225,627 examples/s at 8.3-8.8 CPU-us each (the baseline 167,060-210,274 at 7.9-9.9), 1 core
179,213-180,030 at 5.5; with views 217,774 at 7.3 CPU-us.

This round (readscale, 2026-11-26), for the 1.6x of two cores over one. Where worker mode spent its CPU,
per step (each thread's CPU from /proc over 1,500-2,000 steps once the workers serve, 2 cores, load
1.3-2.1; the machine ran everything, tf.data too, about 1.5-2x slower than on 11-24): the iterator's
process ~270 us (reading thread ~200: the JSON header, copying the 640 KB out, queueing; fetch thread
~35; train thread ~35); each worker ~2,700-2,900 us a step of its own: ~2,200 reading (decode
~1,450-1,600, spans ~520-600), ~400-480 the index math of its one step (``fetch(k, 1)`` costs ~185 us
alone and ~300 between reads, its tables gone cold; the in-process fetch thread's windows of 16
~170-230 a step), ~170 copying the batch into the slot, its JSON header and the pipe, and ~50 more in
the thread that took requests off the pipe (and handed the GIL over every step). py-spy (500 Hz) agreed:
in the workers ``BatchReader.read`` 54%, index math 13%, ``_send`` 16% (blocked pipe writes sampled as
active). Changes: the worker decodes straight into its slot (``decode_padded(..., out)``,
``BatchReader.read(..., into)``, ``read_workers._SlotWriter``): no arrays of its own, no copy; a reply
is a fixed 24-byte header (step, slot, body size), the feature layout sent only when it changes: no
JSON on either side; over a local source the worker reads its requests in its own thread (buffered
pipe); the iterator hands a batch out as views of its slot, no copy, and sends no step into a slot
while anything references the batch handed out of it (``_Slot.held``: the reference count of the
array all its views hang from), with ``2 * SLOTS_PER_WORKER`` slot files a worker (the request names
the slot) and copies only once the caller holds ``SLOTS_PER_WORKER`` of a worker's batches. After, in
the same accounting alternated with the old tree (5 pairs, load 1.3-2.1): the iterator's process
150-260 us a step against 270-410 (reading thread ~95-135 against ~190-240); in all, new against old,
2,587/3,060, 2,660/3,447, 3,140/3,567, 3,433/3,033 and 3,273/3,893 us a step: medians 3,140 against
3,447 (-9%; 12.3 against 13.5 CPU-us an example), lower in 4 pairs of 5. The full runs came on a
loaded machine, slower than on 11-24 in every row (tf.data 1 core 82-86k examples/s against 172k), and
their 2 / 1 swung with it: 1.66x, 1.29x, 1.70x in three runs within 10 minutes (their 1-core read path
78,578, 106,006, 86,287 examples/s at 12.8, 9.4, 11.7 CPU-us; 2 cores 130,666, 136,560, 146,670 at 14.7,
14.5, 12.6; the old tree's 2 cores at 11.5, 15.2, 13.9). BENCHMARKS.md holds the second, the first
written after the code was final (the first run's 1-core rows were the most disturbed): 1.29x, the
target not shown met on this machine today. A fourth run after the merge into main (load 0.8-1.7, no
other agent's work running, written to BENCHMARKS.md in place of the second whatever it gave): 1 core
112,157 examples/s at 8.9 CPU-us, 2 cores 187,188 at 10.3 (1.67x; fastest runs 1.70x; with
``copy_batches=False`` 1.84x), the old tree 105,126 and 160,499 (1.53x); but the 1-core read path at
0.91x of tf.data's 123,197 (fastest runs 1.06x), where 11-24 gave 1.12x: at this day's noise (runs of
one row 98k-131k) neither the 1-core parity nor the 1.6x is settled by one run. Left: a worker's index math costs about twice the in-process
windows' (computing it in the iterator's fetch thread and sending a binary ``StepReads`` might save
~100 us a step, not tried), and a worker's decode ~15% more than in-process (two cores sharing caches
and memory bandwidth).

Next round (varint, 2026-11-26 evening), for the 1-core parity. A line profile of ``_varint_rows`` (the
varints of a batch, 240 KB, ~130k values): ~655 us, of which finding the varints' last bytes 136, two
gathers (each varint's first and last byte) 109 + 106, and ~150 the arithmetic around them; a gather
costs ~0.7 ns an element in numpy (``mode`` and index type change nothing), a whole-buffer step on bytes
~0.05-0.2 ns. Now each varint of one or two bytes is worked out at every byte from it and the byte
before it (whole-buffer steps), and taken with one gather at its last byte: ~510 us. Quick alternated
runs on 1 core: 161,298 examples/s against main's 142,163 and tf.data's 146,460 (1.10x); two recorded
runs: 1.05x with 2 / 1 core 1.63x (3 rounds), then 1.12x with 1.68x (5 rounds, nothing else running). Left: finding the last bytes (``flatnonzero``, ~130
us) and the index math of each step (~190 us alone) are now the largest single pieces.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._report import write_section

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH = 256
LENGTHS = {"inputs": 512, "targets": 114}
BLOCK = 4096
WARMUP_SECONDS = 1.5  # before the window: opening files, and the workers' start


def builtin_cache() -> str:
    """The built-in task's current cache version, built if there is none of the current format (what a
    trainer reads now: an older format's records carry other provenance features)."""
    from taskdata.beam.job import CacheOptions, run_cache_job
    from taskdata.cache.format import FORMAT, current_version, load_manifest, task_dir
    from taskdata.config import Config
    from taskdata.tasks import default_registry

    config = Config.from_environment()
    found = current_version(task_dir(config.cache_root, "c4_span_corruption"))
    if found is not None and load_manifest(found).format == FORMAT:
        return found
    # force: the job would otherwise reuse an older format's version of the same task fingerprint.
    options = CacheOptions(task="c4_span_corruption", output=config.cache_root, progress=False, config=config,
                           force=found is not None)
    return run_cache_job(options, default_registry(config), log=lambda m: None).version_dir


def shard_files(version_dir: str) -> list[str]:
    return sorted(glob.glob(os.path.join(version_dir, "train.tfrecord-*-of-*")))


def make_plan(version_dir: str, blocks: bool):
    from taskdata.cache.reader import CacheReader
    from taskdata.index import BatchSchedule, BlockOrder, RunPlan, TaskCache

    with CacheReader(version_dir) as probe:
        caches = {probe.task: TaskCache(probe.manifest_sha256, probe.record_counts("train"))}
        task = probe.task
    plan = RunPlan(name="bench_readpath", mixture=task, caches=caches, rates=None, seed=0,
                   schedule=BatchSchedule(start=BATCH, end=BATCH), num_data_shards=1,
                   **({"epoch_order": BlockOrder(BLOCK)} if blocks else {}))  # fmt: skip
    return plan, {task: version_dir}


def cpu_ticks(pids: list[int]) -> float:
    """User + system seconds of these processes so far (0 for one that is gone)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:
            continue
    return total / os.sysconf("SC_CLK_TCK")


def window(batches, examples_of, pids_of, steps: int) -> dict:
    """Drains a warm-up, then times ``steps`` batches: examples, wall seconds, CPU seconds."""
    started = time.perf_counter()
    for warm, _ in enumerate(batches, 1):
        if warm >= 10 and time.perf_counter() - started > WARMUP_SECONDS:
            break
    pids = [os.getpid(), *pids_of()]
    cpu0, wall0, examples = cpu_ticks(pids), time.perf_counter(), 0
    for _ in range(steps):
        examples += examples_of(next(batches))
    wall = time.perf_counter() - wall0
    return {"examples": examples, "seconds": wall, "cpu": cpu_ticks(pids) - cpu0}


def measure_readpath(version_dir: str, steps: int, workers: int, order: str, copy_batches: bool = True) -> dict:
    from trainer_client.assignments import HostSlice
    from trainer_client.iterator import DataIterator
    from trainer_client.local_source import LocalAssignments

    plan, dirs = make_plan(version_dir, blocks=order == "blocks")
    start = 0 if order == "blocks" else -(-sum(plan.caches[plan.task_names[0]].shard_record_counts) // BATCH)
    iterator = DataIterator(LocalAssignments(plan, dirs), LENGTHS, start=start, host_slice=HostSlice(0, 1),
                            workers=workers, copy_batches=copy_batches)  # fmt: skip
    try:
        while workers and not iterator.workers_serving:  # the window starts once the workers serve
            next(iterator)
        result = window(iterator, lambda b: len(b.features["inputs"]), lambda: iterator.worker_pids, steps)
    finally:
        iterator.close()
    assert "tensorflow" not in sys.modules, "the read path imported TensorFlow"
    return result


def measure_first_batch(version_dir: str, workers: int) -> dict:
    from trainer_client.assignments import HostSlice
    from trainer_client.iterator import DataIterator
    from trainer_client.local_source import LocalAssignments

    plan, dirs = make_plan(version_dir, blocks=True)
    started = time.perf_counter()
    iterator = DataIterator(LocalAssignments(plan, dirs), LENGTHS, host_slice=HostSlice(0, 1), workers=workers)
    next(iterator)
    seconds = time.perf_counter() - started
    iterator.close()
    return {"seconds": seconds}


def tf_threads(cores: int):
    import tensorflow as tf

    tf.config.threading.set_inter_op_parallelism_threads(cores)
    tf.config.threading.set_intra_op_parallelism_threads(cores)
    options = tf.data.Options()
    options.threading.private_threadpool_size = cores
    options.autotune.enabled = False
    return tf, options


def measure_tfdata(version_dir: str, steps: int, cores: int) -> dict:
    tf, options = tf_threads(cores)
    spec = {name: tf.io.RaggedFeature(tf.int64) for name in LENGTHS}

    def parse(records):
        parsed = tf.io.parse_example(records, spec)
        return {name: tf.cast(parsed[name].to_tensor(shape=[None, length]), tf.int32) for name, length in LENGTHS.items()}

    dataset = (tf.data.TFRecordDataset(shard_files(version_dir)).repeat().batch(BATCH, drop_remainder=True)
               .map(parse, num_parallel_calls=cores if cores > 1 else None, deterministic=True)
               .prefetch(cores).with_options(options))  # fmt: skip
    return window(iter(dataset), lambda b: int(b["inputs"].shape[0]), lambda: [], steps)


def measure_seqio(version_dir: str, steps: int) -> dict:
    from taskdata.seqio_bridge import add_cached_task, import_seqio

    seqio = import_seqio()
    tf, options = tf_threads(1)
    vocabulary = seqio.PassThroughVocabulary(size=1 << 20)
    task = seqio.get_mixture_or_task(add_cached_task(version_dir, {name: seqio.Feature(vocabulary) for name in LENGTHS}))
    dataset = (task.get_dataset(split="train", use_cached=True, shuffle=False).repeat()
               .map(lambda x: {name: tf.cast(x[name], tf.int32) for name in LENGTHS})
               .padded_batch(BATCH, padded_shapes={name: [length] for name, length in LENGTHS.items()})
               .with_options(options))  # fmt: skip
    return window(iter(dataset), lambda b: int(b["inputs"].shape[0]), lambda: [], steps)


def measure_framing(version_dir: str, passes: int) -> dict:
    from taskdata.cache.tfrecord import iter_records

    files = shard_files(version_dir)

    def records():
        while True:
            for path in files:
                with open(path, "rb") as f:
                    yield from iter_records(f, path)

    result = window(records(), lambda r: 1, lambda: [], passes)
    from taskdata.cache.reader import CacheReader

    with CacheReader(version_dir) as reader:
        count = sum(reader.record_counts("train"))
    result["bytes_per_record"] = sum(os.path.getsize(p) for p in files) / count
    return result


def measure_check(version_dir: str) -> dict:
    """The peer computes the same thing: the first batch of the read path's epoch 0 equals tf.data's."""
    import numpy as np

    from trainer_client.assignments import HostSlice
    from trainer_client.local_source import LocalAssignments
    from trainer_client.reading import BatchReader

    plan, dirs = make_plan(version_dir, blocks=True)
    source = LocalAssignments(plan, dirs)
    ours = BatchReader(source.run_info(), LENGTHS).read(source.fetch(0, 1, HostSlice(0, 1))[0]).features
    tf, _ = tf_threads(1)
    spec = {name: tf.io.RaggedFeature(tf.int64) for name in LENGTHS}
    theirs = next(iter(tf.data.TFRecordDataset(shard_files(version_dir)).batch(BATCH)
                       .map(lambda r: tf.io.parse_example(r, spec))))  # fmt: skip
    for name, length in LENGTHS.items():
        if not np.array_equal(ours[name], theirs[name].to_tensor(shape=[None, length]).numpy()):
            raise AssertionError(f"feature {name!r}: the read path and tf.data disagree on the first batch")
    return {"equal": True}


CONFIGS = [  # (label, cores, measurement arguments)
    ("read path, workers=0, epoch 0 then blocks of 4,096", "0", ["readpath", "--workers", "0", "--order", "blocks"]),
    ("tf.data TFRecordDataset + parse_example + padding, 1 thread", "0", ["tfdata", "--cores", "1"]),
    ("read path, workers=2, epoch 0 then blocks of 4,096", "0,1", ["readpath", "--workers", "2", "--order", "blocks"]),
    ("tf.data TFRecordDataset + parse_example + padding, 2 threads", "0,1", ["tfdata", "--cores", "2"]),
    ("read path, workers=0, epoch 0 then blocks, trainer started with the read workers' MALLOC_ settings", "0",
     ["readpath", "--workers", "0", "--order", "blocks", "--malloc"]),
    ("read path, workers=0, later epochs record by record (256 scattered reads a step)", "0",
     ["readpath", "--workers", "0", "--order", "records"]),
    ("read path, workers=2, later epochs record by record", "0,1", ["readpath", "--workers", "2", "--order", "records"]),
    ("seqio 0.0.20 use_cached reader + padded_batch", "0", ["seqio"]),
    ("framing + both CRCs alone (iter_records, pure Python)", "0", ["framing"]),
    ("first batch, workers=0", "0", ["first", "--workers", "0"]),
    ("first batch, workers=2", "0,1", ["first", "--workers", "2"]),
    ("read path, workers=2, copy_batches=False (read-only views of the workers' memory), epoch 0 then blocks",
     "0,1", ["readpath", "--workers", "2", "--order", "blocks", "--views"]),
]


def run_one(version_dir: str, cores: str, arguments: list[str], steps: int) -> dict:
    from trainer_client.read_workers import MMAP_THRESHOLD, TRIM_THRESHOLD

    malloc = ({"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD)}
              if "--malloc" in arguments else {})  # fmt: skip
    # --tree=DIR: measured with another checkout's code and its own copy of this script (--baseline).
    tree = next((a.split("=", 1)[1] for a in arguments if a.startswith("--tree=")), REPO)
    arguments = [a for a in arguments if a != "--malloc" and not a.startswith("--tree=")]
    script = os.path.join(tree, "bench", os.path.basename(__file__))
    command = ["taskset", "-c", cores, sys.executable, script, "--version-dir", version_dir,
               "--steps", str(steps), "--measure", *arguments]  # fmt: skip
    load = os.getloadavg()[0]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **malloc, "PYTHONPATH": tree},
                          cwd=tree, check=False, timeout=600)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["load"] = load
    return result


def summarize(label: str, runs: list[dict]) -> tuple[str, float]:
    load = f"load average {min(r['load'] for r in runs):.1f}-{max(r['load'] for r in runs):.1f}"
    if "examples" not in runs[0]:
        values = sorted(r["seconds"] * 1e3 for r in runs)
        return f"{label}: {statistics.median(values):.0f} ms (runs {', '.join(f'{v:.0f}' for v in values)}; {load})", 0.0
    rates = sorted(r["examples"] / r["seconds"] for r in runs)
    rate = statistics.median(rates)
    unit = "records/s" if "bytes_per_record" in runs[0] else "examples/s"
    cpu = statistics.median(r["cpu"] / r["examples"] * 1e6 for r in runs)
    extra = f", {rate * runs[0]['bytes_per_record'] / 1e6:.0f} MB/s" if "bytes_per_record" in runs[0] else ""
    return (f"{label}: {rate:,.0f} {unit}{extra} (runs {', '.join(f'{v:,.0f}' for v in rates)}; "
            f"{cpu:.1f} CPU-us each; {load})", rate)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version-dir", help="a c4_span_corruption-shaped cache version (default: the built-in one)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300, help="batches in each timed window")
    parser.add_argument("--write", action="store_true", help="write the figures into BENCHMARKS.md")
    parser.add_argument("--baseline", help="another checkout of this repository (say, `git worktree add DIR COMMIT`): "
                        "its read path is measured too, alternated with this one's")
    parser.add_argument("--measure", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--order", default="blocks", help=argparse.SUPPRESS)
    parser.add_argument("--cores", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--views", action="store_true", help=argparse.SUPPRESS)
    args, extra = parser.parse_known_args()
    if args.measure:
        measure(args, [*args.measure, *extra])
        return
    version_dir = os.path.abspath(args.version_dir or builtin_cache())
    run_one(version_dir, "0", ["check"], 1)
    configs = list(CONFIGS)
    if args.baseline:
        baseline = os.path.abspath(args.baseline)
        configs += [(f"baseline {baseline}: {label}", cores, [*arguments, f"--tree={baseline}"])
                    for label, cores, arguments in (CONFIGS[0], CONFIGS[2])]  # fmt: skip
    results: dict[str, list[dict]] = {label: [] for label, _, _ in configs}
    for round_index in range(args.rounds):
        for label, cores, arguments in configs:
            steps = args.steps // 5 if arguments[0] == "seqio" else args.steps
            results[label].append(run_one(version_dir, cores, arguments, steps))
            print(f"round {round_index + 1}: {summarize(label, results[label][-1:])[0]}", flush=True)
    lines = [f"cache {version_dir} ({len(shard_files(version_dir))} shards), host batch {BATCH}, padded to "
             f"{LENGTHS['inputs']}/{LENGTHS['targets']}, CRCs checked everywhere; windows of {args.steps} batches "
             f"({args.steps // 5} for seqio) after a {WARMUP_SECONDS} s warm-up; median of {args.rounds} alternated rounds; "
             "each run pinned with taskset to core 0 (1 core) or cores 0,1 (2 cores)"]  # fmt: skip
    rates = {}
    for label, cores, _ in configs:
        line, rate = summarize(label, results[label])
        rates[label] = rate
        lines.append(f"{'2 cores' if ',' in cores else '1 core'}, {line}")
    ours1, ours2 = rates[CONFIGS[0][0]], rates[CONFIGS[2][0]]
    tf1, tf2 = rates[CONFIGS[1][0]], rates[CONFIGS[3][0]]
    tuned = rates[CONFIGS[4][0]]
    lines.append(f"read path / tf.data: {ours1 / tf1:.2f}x on 1 core (target >= 1; {tuned / tf1:.2f}x with the MALLOC_ "
                 f"settings), {ours2 / tf2:.2f}x on 2 cores; "
                 f"read path 2 cores / 1 core: {ours2 / ours1:.2f}x (target >= 1.6); tf.data 2 / 1: {tf2 / tf1:.2f}x")
    fastest = {label: max(r["examples"] / r["seconds"] for r in results[label]) for label, _, _ in CONFIGS[:4]}
    best1, tbest1, best2, tbest2 = (fastest[CONFIGS[i][0]] for i in range(4))  # CONFIGS' order
    lines.append(f"fastest run of each (the least disturbed on a shared machine): read path / tf.data {best1 / tbest1:.2f}x on "
                 f"1 core, {best2 / tbest2:.2f}x on 2 cores; read path 2 cores / 1 core {best2 / best1:.2f}x; tf.data 2 / 1 "
                 f"{tbest2 / tbest1:.2f}x")  # fmt: skip
    views = rates[CONFIGS[-1][0]]
    lines.append(f"read path 2 cores with copy_batches=False / 1 core: {views / ours1:.2f}x (fastest runs "
                 f"{max(r['examples'] / r['seconds'] for r in results[CONFIGS[-1][0]]) / best1:.2f}x)")
    if args.baseline:
        then1, then2 = (rates[label] for label, _, _ in configs[len(CONFIGS):])
        lines.append(f"read path / the baseline's: {ours1 / then1:.2f}x on 1 core, {ours2 / then2:.2f}x on 2 cores")
    print("\n".join(lines))
    if args.write:
        write_section("Host read path against tf.data", lines)


def measure(args: argparse.Namespace, what: list[str]) -> None:
    kind = what[0]
    if kind == "readpath":
        result = measure_readpath(args.version_dir, args.steps, args.workers, args.order, not args.views)
    elif kind == "first":
        result = measure_first_batch(args.version_dir, args.workers)
    elif kind == "tfdata":
        result = measure_tfdata(args.version_dir, args.steps, args.cores)
    elif kind == "seqio":
        result = measure_seqio(args.version_dir, args.steps)
    elif kind == "framing":
        result = measure_framing(args.version_dir, args.steps * BATCH)
    elif kind == "check":
        result = measure_check(args.version_dir)
    else:
        raise SystemExit(f"unknown measurement {kind!r}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
