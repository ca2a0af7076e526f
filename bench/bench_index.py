"""Cost of the index math lookups far into a run and over many shards (figures go to BENCHMARKS.md).

Run: PYTHONPATH=. python bench/bench_index.py [--write]

Every lookup is a pure function of (plan, step, data shard); none should grow materially with the
step number (10 vs 10**6 vs 10**9) or with the number of cache shards (64 vs 65,536).

The first figures are the assignment server's request: one host's 256-example slice of a 2048-example
global batch (3-task mixture, 8 data shards), answered by the scalar chain (the code before it was
vectorised, kept here as the reference), by ``assign`` and by ``example_arrays`` (no objects).

Then stages (plans of 1, 10 and 100 stages: lookups should not grow with them), and the ledger and
the summary over a cache written here in the cache job's format (records keyed by the keyed hash of
their stable ids, bucketed and sorted as ``taskdata.cache.shuffle`` says, with the job's provenance
features and origins sidecars; span-corruption-sized records, 100,000 per shard of the largest task): by
step (the whole global batch of 2048 and one host's slice of 256), by example (the search by shuffle key
plus its reads from the step on), and the summary; target: each under 10 ms. In the same run, for
comparison, the same caches without origins sidecars (as built before them: the ledger reads each
example's record) and in format 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import pathlib
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable

import numpy as np

from taskdata.index import (
    FEISTEL,
    BatchSchedule,
    ExampleRef,
    Extent,
    HostAssignment,
    Mixing,
    RunPlan,
    Stage,
    TaskCache,
    assign,
    example_arrays,
    examples_at,
    locate_example,
    slice_positions,
)

STEPS = (10, 10**6, 10**9)
SHARD_COUNTS = (64, 65_536)
HOSTS = 8
SECTION = "## Index math"
BENCHMARKS = pathlib.Path(__file__).resolve().parent.parent / "BENCHMARKS.md"


def make_plan(num_shards: int) -> RunPlan:
    """Three tasks, MT-NLG-style ramp 32 -> 1920 over 100k steps, 8 data shards."""
    caches = {
        "c4_span_corruption": TaskCache("fp_c4", tuple(20_000 + s % 13 for s in range(num_shards))),
        "wiki_lm": TaskCache("fp_wiki", tuple(3_000 + s % 7 for s in range(num_shards))),
        "glue_cola": TaskCache("fp_cola", tuple(1 + s % 2 for s in range(num_shards))),
    }
    return RunPlan(
        name="bench",
        mixture="bench_mix",
        caches=caches,
        rates={"c4_span_corruption": 0.7, "wiki_lm": 0.25, "glue_cola": 0.05},
        seed=1234,
        schedule=BatchSchedule.ramp(32, 1920, 100_000, multiple_of=32),
        num_data_shards=HOSTS,
    )


def request_plan(num_shards: int) -> RunPlan:
    """The server's case: the same three tasks, a constant global batch of 2048, 8 data shards."""
    return dataclasses.replace(make_plan(num_shards), schedule=BatchSchedule.constant(2048))


def scalar_assign(plan: RunPlan, step: int, data_shard: int) -> HostAssignment:
    """``assign`` as it was before numpy: the chain one position at a time, then extents one by one."""
    positions = slice_positions(plan, step, data_shard)
    examples = []
    for position in positions:
        task, task_position = plan.mixing.locate(position)
        layout, name = plan.layouts[task], plan.task_names[task]
        epoch, index = plan.epoch_order.epoch_and_index(plan.seed, name, layout.num_records, task_position)
        shard, record = layout.locate(index)
        examples.append(ExampleRef(position, name, epoch, index, shard, record))
    extents: list[Extent] = []
    for e in examples:
        last = extents[-1] if extents else None
        if last and (last.task, last.shard, last.first_record + last.count) == (e.task, e.shard, e.record):
            extents[-1] = dataclasses.replace(last, count=last.count + 1)
        else:
            extents.append(Extent(e.task, e.shard, e.record, 1))
    return HostAssignment(
        step, data_shard, plan.num_data_shards, positions, False, tuple(examples), tuple(extents)
    )


def arrays_request(plan: RunPlan, step: int, data_shard: int) -> object:
    """What a caller that serialises arrays does: the slice's arrays and each task's extents."""
    arrays = example_arrays(plan, slice_positions(plan, step, data_shard))
    return [arrays.extents(task) for task in range(len(plan.task_names))]


def interleaved(variants: dict[str, Callable[[], object]], rounds: int = 15) -> dict[str, float]:
    """Median CPU seconds per call of each variant, timed in alternating rounds.

    The machine is shared: this thread's CPU time leaves out the time other processes hold the core.
    """
    numbers = {}
    for name, fn in variants.items():
        number, elapsed = 1, 0.0
        while elapsed < 0.02:
            number *= 2
            start = time.thread_time()
            for _ in range(number):
                fn()
            elapsed = time.thread_time() - start
        numbers[name] = number
    timings: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            start = time.thread_time()
            for _ in range(numbers[name]):
                fn()
            timings[name].append((time.thread_time() - start) / numbers[name])
    return {name: statistics.median(t) for name, t in timings.items()}


def request_costs() -> list[str]:
    lines = []
    for shards in SHARD_COUNTS:
        plan = request_plan(shards)
        for step in STEPS:
            # Five consecutive steps of host 3, as a server answering a lookahead window sees them.
            window = [step + i for i in range(5)]
            for s in window:
                assert assign(plan, s, 3) == scalar_assign(plan, s, 3)
            costs = interleaved(
                {
                    "scalar": lambda p=plan, w=window: [scalar_assign(p, s, 3) for s in w],
                    "assign": lambda p=plan, w=window: [assign(p, s, 3) for s in w],
                    "arrays": lambda p=plan, w=window: [arrays_request(p, s, 3) for s in w],
                    "step": lambda p=plan, w=window: [example_arrays(p, p.positions(s)) for s in w],
                }
            )
            scalar, vector, arrays, whole = (
                costs[k] / len(window) for k in ("scalar", "assign", "arrays", "step")
            )
            epochs = sorted({(e.task, e.epoch) for e in assign(plan, step, 3).examples})
            in_epoch_zero = [task for task, epoch in epochs if epoch == 0]
            lines.append(
                f"  - {shards:,} shards/task, step {step:,}: scalar {scalar * 1e3:.2f} ms, assign() "
                f"{vector * 1e3:.3f} ms ({scalar / vector:.1f}x), example_arrays + per-task runs "
                f"{arrays * 1e3:.3f} ms ({scalar / arrays:.0f}x); example_arrays of the whole step (2048) "
                f"{whole * 1e3:.3f} ms, {whole / HOSTS * 1e3:.3f} ms per slice"
                + (f"; in epoch 0: {', '.join(in_epoch_zero)}" if in_epoch_zero else "")
            )
    # Many tasks: most tree nodes hold few positions of a slice, and most examples have their own
    # (task, epoch) permutation.
    caches = {
        f"t{i}": TaskCache(f"fp{i}", tuple(1000 + (i * 37 + s) % 500 for s in range(64))) for i in range(300)
    }
    many = dataclasses.replace(
        request_plan(64), caches=caches, rates={f"t{i}": (i * 7919) % 1000 + 1 for i in range(300)}
    )
    for step in (10, 10**6):
        window = [step + i for i in range(5)]
        costs = interleaved(
            {
                "scalar": lambda p=many, w=window: [scalar_assign(p, s, 3) for s in w],
                "assign": lambda p=many, w=window: [assign(p, s, 3) for s in w],
            },
            rounds=7,
        )
        scalar, vector = costs["scalar"] / len(window), costs["assign"] / len(window)
        lines.append(
            f"  - mixture of 300 tasks (64 shards each), step {step:,}: scalar {scalar * 1e3:.2f} ms, assign() "
            f"{vector * 1e3:.3f} ms ({scalar / vector:.1f}x)"
        )
    return lines


def per_call(fn: Callable[[], object], *, repeat: int = 7, number: int = 0,
             clock: Callable[[], float] = time.perf_counter) -> float:
    """Median seconds per call over ``repeat`` timings of ``number`` calls (auto-sized to ~0.1 s), on ``clock``
    (wall time; ``time.process_time``: this process's CPU time, less moved by other load on a shared machine)."""
    if not number:
        number, elapsed = 1, 0.0
        while elapsed < 0.05:
            start = clock()
            for _ in range(number):
                fn()
            elapsed = clock() - start
            number *= 2
    timings = []
    for _ in range(repeat):
        start = clock()
        for _ in range(number):
            fn()
        timings.append((clock() - start) / number)
    return statistics.median(timings)


def run() -> list[str]:
    lines = [
        "  - one host's slice of 256 examples (global batch 2048, 8 data shards, 3-task mixture 0.7/0.25/0.05), "
        "per request, CPU time, median of 15 interleaved rounds of 5 consecutive steps:",
        *("  " + line for line in request_costs()),
        "  - (scalar: the chain one position at a time, as assign() computed it before numpy. assign() also "
        "builds an ExampleRef per example and an Extent per extent, ~0.4 us each, about half its time; "
        "example_arrays is the index math alone. The whole step's arrays, split 8 ways, is what a server "
        "answering every host pays per slice. The lines below are wall time, on the ramped plan.)",
    ]
    plans = {shards: make_plan(shards) for shards in SHARD_COUNTS}
    for shards, plan in plans.items():
        batch_at = {step: plan.batch_size(step) for step in STEPS}
        for step in STEPS:
            position = plan.first_position(step)
            one = per_call(lambda p=position, plan=plan: examples_at(plan, range(p, p + 1)))
            # A host's whole slice, over 5 consecutive steps (the server's access pattern).
            slice_time = (
                per_call(lambda s=step, plan=plan: [assign(plan, s + i, 3) for i in range(5)], repeat=5) / 5
            )
            per_host = batch_at[step] // HOSTS
            first = examples_at(plan, range(position, position + 1))[0]
            inverse = per_call(lambda e=first, plan=plan: locate_example(plan, e.task, e.epoch, e.index))
            lines.append(
                f"  - {shards:,} shards/task, step {step:,} (position {position:,}): one position -> record "
                f"{one * 1e6:.1f} us; host slice of {per_host} examples {slice_time * 1e3:.2f} ms "
                f"({slice_time / per_host * 1e6:.1f} us/example); record -> step {inverse * 1e6:.1f} us"
            )
    lines.append(
        "  - (lookups in epoch 0 skip the permutation: at step 10 every task, and at step 10^6 with 65,536 "
        "shards the largest task, are still in epoch 0; costs differ by that, not by the step number. record -> step at step 10 "
        "bisects over the ramp's 100,000 steps, O(log ramp_steps); past the ramp it is O(1))"
    )
    schedule = plans[64].schedule
    for step in STEPS:
        t = per_call(lambda s=step: schedule.positions(s))
        lines.append(f"  - schedule.positions(step {step:,}) on the ramp: {t * 1e6:.1f} us")
    for size in (1_000, 10**10):
        permutation = FEISTEL.permutation(1, "task", 3, size)
        t = per_call(lambda p=permutation, n=size: p(n // 3))
        lines.append(f"  - epoch permutation lookup, {size:,} records: {t * 1e6:.1f} us")
    for num_tasks in (3, 300):
        mixing = Mixing.from_rates([(i * 7919) % 1000 + 1 for i in range(num_tasks)])
        t = per_call(lambda m=mixing: m.locate(10**12 + 5))
        worst = float(max(mixing.lag_bounds()))
        lines.append(
            f"  - mixing lookup, {num_tasks} tasks: {t * 1e6:.1f} us (largest lag bound {worst:.3f} examples)"
        )
    return lines


# --- stages ----------------------------------------------------------------------------------------


def staged(plan: RunPlan, count: int, last: int = 10**9) -> RunPlan:
    """``plan`` in ``count`` stages: its own, then ``count - 1`` spread over steps 1 .. ``last``; each changes
    the rates, and every other one the batch size too (2048 or 1024: the batch splits into 8)."""
    stages = []
    count -= 1
    for k in range(1, count + 1):
        rates = {"c4_span_corruption": 1 + k % 5, "wiki_lm": 1 + k % 3, "glue_cola": k % 2}
        batch = BatchSchedule.constant(2048 if k % 4 < 2 else 1024) if k % 2 else None
        stages.append(Stage(max(1, last * k // count - 3), rates, batch))
    return dataclasses.replace(plan, stages=tuple(stages))


def stage_costs() -> list[str]:
    base = request_plan(64)
    lines = []
    for count in (1, 10, 100):
        built = per_call(lambda c=count: staged(base, c).mixing, repeat=3)
        plan = staged(base, count)
        plan.mixing  # noqa: B018 (built once per plan object, as the server keeps it)
        parts = []
        for step in (10**6, 10**9):
            position = plan.first_position(step) + 7
            task, task_position = plan.mixing.locate(position)
            one = per_call(lambda p=position, plan=plan: examples_at(plan, range(p, p + 1)))
            inverse = per_call(lambda t=task, n=task_position, plan=plan: plan.mixing.position_of(t, n))
            host = per_call(lambda s=step, plan=plan: assign(plan, s, 3), repeat=5)
            steps = per_call(lambda s=step, plan=plan: plan.positions(s))
            parts.append(
                f"step {step:,}: positions {steps * 1e6:.1f} us, one position -> record {one * 1e6:.1f} us, "
                f"task position -> position {inverse * 1e6:.1f} us, host slice of 256 {host * 1e3:.2f} ms"
            )
        lines.append(f"  - {count} stage{'s' if count > 1 else ''} (building the plan's stage tables "
                     f"{built * 1e3:.1f} ms, once per plan): " + "; ".join(parts))
    return lines


# --- ledger and summary over a cache in the real format ----------------------------------------------

# Records per shard of each task (the largest like a 256 MB shard of span-corruption examples).
LEDGER_SHARDS = {"c4_span_corruption": (100_000, 100_000), "wiki_lm": (20_000, 20_000), "glue_cola": (2_000,)}


def write_keyed_cache(root: pathlib.Path, task: str, counts: tuple[int, ...], seed: int = 0, *,
                      compact: bool = True, origins: bool = True) -> str:
    """A complete cache version of ``task`` as the cache job lays it out: ``sum(counts)`` examples of
    ``len(counts)`` source shards, each record keyed by ``shuffle_key(seed, stable id)``, put in the shard
    of its key range and sorted by key there, with the job's provenance (``compact``: format 4's
    ``provenance/origin``, and with ``origins`` each shard's origins sidecar, as the job writes them; else
    format 2's seqio-style features, as caches built before format 4 hold). Returns its fingerprint."""
    import hashlib
    import json

    from taskdata.cache.format import (
        FORMAT,
        FORMAT_SEQIO_PROVENANCE,
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
    from taskdata.cache.provenance import ORIGIN, origin_info, origin_values
    from taskdata.cache.shuffle import shard_of_key, shuffle_key
    from taskdata.cache.tfrecord import TFRecordWriter, write_offsets
    from taskdata.example import encode_example

    version_dir = root / task / "v20260101T000000Z-ledger"
    files = tuple(f"c4-train.{source:05d}-of-01024.json.gz" for source in range(len(counts)))
    (version_dir / "index").mkdir(parents=True, exist_ok=True)
    num_shards = len(counts)
    ids = [(source, ordinal) for source, count in enumerate(counts) for ordinal in range(count)]
    keys = [shuffle_key(seed, task, "train", source, ordinal) for source, ordinal in ids]
    buckets: list[list[int]] = [[] for _ in range(num_shards)]
    for i in np.argsort(np.array(keys, np.uint64), kind="stable").tolist():
        buckets[shard_of_key(keys[i], num_shards)].append(i)
    rng = np.random.default_rng(0)
    entries, sidecars, stats_tokens = [], [], {"inputs": 0, "targets": 0}
    histograms: dict[str, dict[int, int]] = {"inputs": {}, "targets": {}}
    for shard, members in enumerate(buckets):
        file = version_dir / shard_name("train", shard, num_shards)
        longest, rows = 0, []
        with open(file, "wb") as f:
            writer = TFRecordWriter(f)
            for i in members:
                source, ordinal = ids[i]
                lengths = {"inputs": 512, "targets": int(rng.integers(90, 115))}
                for feature, length in lengths.items():
                    stats_tokens[feature] += length
                    histograms[feature][length] = histograms[feature].get(length, 0) + 1
                example = {
                    "inputs": rng.integers(1, 32_000, lengths["inputs"], dtype=np.int32),
                    "targets": rng.integers(1, 32_000, lengths["targets"], dtype=np.int32),
                }
                if compact:
                    example[ORIGIN] = origin_values(source, ordinal, ordinal * 3, ordinal * 3 + 2)
                    rows.append(example[ORIGIN])
                else:
                    example.update(seqio_style_provenance(task, files[source], source, ordinal, seed))
                record = encode_example(example)
                longest = max(longest, len(record))
                writer.write(record)
            size = f.tell()
        sidecar = write_offsets(writer.offsets, size, writer.crcs)
        (version_dir / offsets_name("train", shard, num_shards)).write_bytes(sidecar)
        data = file.read_bytes()
        entries.append(ShardEntry(
            file=file.name, records=len(members), bytes=size, sha256=hashlib.sha256(data).hexdigest(),
            offsets_file=offsets_name("train", shard, num_shards),
            offsets_sha256=hashlib.sha256(sidecar).hexdigest(), max_record_bytes=longest,
        ))  # fmt: skip
        if compact and origins:
            data = origins_sidecar(np.array(rows, np.int64).reshape(-1, 4))
            (version_dir / origins_name("train", shard, num_shards)).write_bytes(data)
            sidecars.append(SidecarEntry(origins_name("train", shard, num_shards), hashlib.sha256(data).hexdigest(),
                                         len(data)))
    features = {name: {"dtype": "int32", "shape": [None]} for name in ("inputs", "targets")}
    if compact:
        features[ORIGIN] = origin_info(packed=False)
    else:
        for key, value in seqio_style_provenance(task, files[0], 0, 0, seed).items():
            features[key] = {"dtype": "string" if isinstance(value, str) else "int32", "shape": []}
    split = SplitManifest(tuple(entries), num_shards, {}, source_files=files if compact else None,
                          origins=tuple(sidecars) if compact and origins else None)
    manifest = Manifest(
        task=task, task_fingerprint=f"bench-{task}", fingerprints={}, seed=seed, taskdata_version="bench",
        sequence_length={}, features=features, splits={"train": split},
        format=FORMAT if compact else FORMAT_SEQIO_PROVENANCE,
    )  # fmt: skip
    stats = {"examples": len(ids), "length_histograms": {k: sorted(v.items()) for k, v in histograms.items()}}
    for feature, total in stats_tokens.items():
        stats[f"{feature}_tokens"] = total
        stats[f"{feature}_max_tokens"] = max(histograms[feature])
    (version_dir / "stats.train.json").write_text(json.dumps(stats))
    data = manifest_bytes(manifest)
    (version_dir / "manifest.json").write_bytes(data)
    (version_dir / "COMPLETED").write_bytes(completed_bytes(data))
    (root / task / "CURRENT").write_text(version_dir.name + "\n")
    return hashlib.sha256(data).hexdigest()


def seqio_style_provenance(task: str, file: str, source: int, ordinal: int, seed: int) -> dict[str, object]:
    """The provenance features of a format 2 record (what the cache job wrote before format 4)."""
    return {
        "provenance/task": task,
        "provenance/source_shard": file,
        "provenance/source_shard_index": [source],
        "provenance/index_within_shard": [ordinal],
        "provenance/preprocessors_seed": [seed],
        "provenance/source_first_document": [ordinal * 3],
        "provenance/source_last_document": [ordinal * 3 + 2],
    }


def ledger_costs(root: pathlib.Path) -> list[str]:
    """The ledger and the summary over caches in format 4 with origins sidecars (what the job writes), and in the
    same run over the caches built before them, whose records the ledger reads: format 4 without sidecars and
    format 2 (seqio-style provenance features)."""
    lines = []
    for name, compact, origins in (("format4-origins", True, True), ("format4", True, False),
                                   ("format2", False, False)):
        lines += _ledger_costs(root / name, compact, origins)
    return lines


def _ledger_costs(root: pathlib.Path, compact: bool, origins: bool) -> list[str]:
    from taskdata.cache.reader import CacheReader
    from taskdata.runs import example_ledger, open_views, step_ledger, summarize

    caches, record_bytes = {}, []
    for task, counts in LEDGER_SHARDS.items():
        fingerprint = write_keyed_cache(root, task, counts, compact=compact, origins=origins)
        with CacheReader(str(root / task / "v20260101T000000Z-ledger")) as reader:
            caches[task] = TaskCache(fingerprint, reader.record_counts("train"))
            split = reader.manifest.split("train")
            record_bytes.append(sum(s.bytes for s in split.shards) / split.num_records)
    base = dataclasses.replace(request_plan(64), caches=caches)
    shapes = ", ".join(
        f"{t}: {len(c)} shard{'s' if len(c) > 1 else ''} of ~{sum(c) // len(c):,} records" for t, c in LEDGER_SHARDS.items()
    )
    what = {
        (True, True): "format 4 with origins sidecars (what the cache job writes: provenance from the sidecars, "
                      "no record read)",
        (True, False): "format 4 without origins sidecars (as caches built before them: provenance/origin read "
                       "from the records)",
        (False, False): "format 2 (seqio-style provenance features, as caches built before format 4 hold)",
    }[compact, origins]
    lines = [
        f"  - ledger and summary over caches in {what} ({shapes}; span-corruption-sized records, "
        f"{statistics.mean(record_bytes):,.0f} bytes framed), global batch 2048, 8 data shards, files in the page "
        f"cache, wall time (and CPU time of this process), median of 7, load average {os.getloadavg()[0]:.1f} at the "
        "start:"
    ]
    for count in (1, 100):
        plan = staged(base, count)
        for step in (10**6, 10**9):
            views = open_views(plan, str(root))
            try:
                started = time.perf_counter()
                step_ledger(plan, views, step)  # loads the sidecars (offsets, or origins) the step touches, once
                first = time.perf_counter() - started
                whole = per_call(lambda s=step, p=plan, v=views: step_ledger(p, v, s), repeat=7)
                whole_cpu = per_call(lambda s=step, p=plan, v=views: step_ledger(p, v, s), clock=time.process_time)
                body = per_call(lambda s=step, p=plan, v=views: step_ledger(p, v, s).to_dict(), repeat=7)
                host = per_call(lambda s=step, p=plan, v=views: step_ledger(p, v, s, host=3, num_hosts=8), repeat=7)
                index_math = per_call(lambda s=step, p=plan: example_arrays(p, p.positions(s)), repeat=7)
                if origins:
                    rows = _sidecar_rows(plan, views, step)
                    parts = f"its rows of the origins sidecars {rows * 1e3:.2f} ms"
                else:
                    read, decode = _read_and_decode(plan, views, step)
                    parts = f"verified reads {read * 1e3:.2f} ms, decoding the provenance {decode * 1e3:.2f} ms"
                # Examples of the largest task: shards of 100,000 records.
                largest = [e for e in step_ledger(plan, views, step).entries if e.task == "c4_span_corruption"]
                entry = largest[0]
                view = views[entry.task]
                binary = int(np.ceil(np.log2(view.record_counts[entry.shard] + 1)))
                probes = _probes(view, [e.id for e in largest[:200]])
                find = per_call(lambda e=entry, v=views: v[e.task].find(e.id), repeat=7)
                example = per_call(
                    lambda e=entry, s=step, p=plan, v=views: example_ledger(
                        p, v, e.id, from_step=s, until_step=s + 10**6, limit=10
                    ),
                    repeat=7,
                )
                summary = per_call(lambda s=step, p=plan, v=views: summarize(p, v, s), repeat=7)
            finally:
                for view in views.values():
                    view.close()
            lines.append(
                f"  - {count} stage{'s' if count > 1 else ''}, step {step:,}: ledger by step {whole * 1e3:.2f} ms "
                f"({whole_cpu * 1e3:.2f} ms CPU) "
                f"(2048 examples: the index math {index_math * 1e3:.2f} ms, {parts}; with its JSON body, the "
                f"entries as dicts, {body * 1e3:.2f} ms; its first call, loading the sidecars it touches, "
                f"{first * 1e3:.1f} ms), {host * 1e3:.2f} ms (one host's 256); ledger by example "
                f"{example * 1e3:.2f} ms (its search by shuffle key {find * 1e3:.2f} ms: {probes:.1f} probes "
                f"({'sidecar rows' if origins else 'one-record reads'}) on average over 200 {entry.task} examples of "
                f"the step, a binary search takes {binary}; then its first 10 reads from the step and the count of its "
                f"reads in the next 10^6 steps); summary {summary * 1e3:.2f} ms"
            )
    return lines


def _sidecar_rows(plan: RunPlan, views: dict, step: int) -> float:
    """Seconds (median of 7) the step ledger takes to gather its examples' provenance from the origins sidecars."""
    arrays = example_arrays(plan, plan.positions(step))
    parts = []
    for task in np.unique(arrays.tasks).tolist():
        mine = arrays.tasks == task
        parts.append((views[plan.task_names[task]], arrays.shards[mine], arrays.records[mine]))
    return per_call(lambda: [view.provenance(s, r) for view, s, r in parts], repeat=7)


def _read_and_decode(plan: RunPlan, views: dict, step: int) -> tuple[float, float]:
    """Seconds (median of 7) the step ledger's verified reads take, and its decodes of the provenance."""
    from taskdata.cache.provenance import provenance_spec

    arrays = example_arrays(plan, plan.positions(step))
    parts = []
    for task in np.unique(arrays.tasks).tolist():
        mine = arrays.tasks == task
        view = views[plan.task_names[task]]
        parts.append((view.reader, arrays.shards[mine], arrays.records[mine], provenance_spec(view.reader.manifest)))
    read = per_call(lambda: [r.read_records("train", s, i) for r, s, i, _ in parts], repeat=7)
    records = [r.read_records("train", s, i) for r, s, i, _ in parts]
    decode = per_call(lambda: [r.decode(b, spec) for (r, _, _, spec), b in zip(parts, records, strict=True)], repeat=7)
    return read, decode


def _probes(view: object, ids: list[str]) -> float:
    """One-record reads per search, on average over ``ids``."""
    reads = []
    original = view._key  # type: ignore[attr-defined]
    view._key = lambda shard, record: reads.append(1) or original(shard, record)  # type: ignore[attr-defined]
    try:
        for example_id in ids:
            view.find(example_id)  # type: ignore[attr-defined]
    finally:
        del view._key  # type: ignore[attr-defined]
    return len(reads) / len(ids)


def write(lines: list[str], command: str) -> None:
    """Replaces this benchmark's section of BENCHMARKS.md (other sections are left as they are)."""
    from _report import machine

    today = datetime.date.today().isoformat()
    load = os.getloadavg()[0]
    body = "\n".join([SECTION, f"- {today}, {machine()} (shared, load average {load:.1f} at the end), `{command}`:",
                       *lines, ""])
    text = BENCHMARKS.read_text() if BENCHMARKS.exists() else "# Benchmarks\n"
    if SECTION in text:
        head, _, rest = text.partition(SECTION)
        following = rest.find("\n## ")
        tail = rest[following + 1 :] if following >= 0 else ""
        text = head + body + ("\n" + tail if tail else "")
    else:
        text = text.rstrip("\n") + "\n\n" + body
    BENCHMARKS.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help="write the figures into BENCHMARKS.md")
    args = parser.parse_args()
    lines = run()
    lines += ["  - stages: lookups in plans of 1, 10 and 100 stages (spread over steps 1 .. 10^9; each changes "
              "the rates, every other one the batch size too), the server's request plan of 64 shards/task:"]
    lines += ["  " + line for line in stage_costs()]
    directory = pathlib.Path(tempfile.mkdtemp(prefix="bench-ledger-"))
    try:
        lines += ledger_costs(directory)
    finally:
        shutil.rmtree(directory)
    print("\n".join(lines))
    if args.write:
        write(lines, "PYTHONPATH=. python bench/bench_index.py --write")


if __name__ == "__main__":
    main()
