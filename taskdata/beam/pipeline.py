"""The cache pipeline: source shards -> preprocessed, keyed records -> sorted output shards.

    Create(source shards) -> Reshuffle (only to spread the work; order comes from keys)
      -> PreprocessShard: run the task on one source shard, key every example by
         hash(seed, stable id), spill sorted runs, emit (split, destination shard) -> segment
      -> GroupByKey -> WriteShard: merge the segments of one shard by key, write records + offsets (+ origins)

Every file is written under a deterministic name with deterministic bytes (write-then-rename), so a
retried bundle rewrites identical content, and the result does not depend on the runner, the number
of workers or their order. Results (counts, checksums, statistics) are written as small JSON files
that the launcher reads to build the manifest; nothing runner-specific is needed to get them back.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from taskdata import fs
from taskdata.cache.format import offsets_name, origins_name, shard_name
from taskdata.fingerprint import canonical_json


def _import_beam() -> types.ModuleType:
    # Beam warns on import that the optional GCP client libraries (apitools) are missing; the cache
    # job never uses them (gs:// goes through gcsfs), so the warning would only alarm users.
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        import apache_beam

        return apache_beam
    finally:
        root.setLevel(level)


if TYPE_CHECKING:  # the checker reads Beam's own annotations (DoFn, PTransform...)
    import apache_beam as beam

    from taskdata.define.task import Task
    from taskdata.preprocessors.batch import ExampleBatch
else:
    beam = _import_beam()

__all__ = ["CacheJobSpec", "build_cache_pipeline", "encode_cache_record", "feature_info", "load_task"]


@dataclasses.dataclass(frozen=True)
class CacheJobSpec:
    """What every worker needs to know; plain values only (it is shipped to remote workers)."""

    task: str
    task_fingerprint: str
    modules: tuple[str, ...]
    config: tuple[str, str | None, str | None]  # taskdata.config.Config.to_tuple()
    seed: int
    version_dir: str
    tmp_dir: str
    num_shards: tuple[tuple[str, int], ...]
    spill_buffer_bytes: int = 64 << 20
    allow_empty_source_files: bool = False
    digest_memo_dir: str | None = None  # where the launcher remembers source files' digests
    seqio_tasks: tuple[str, ...] = ()  # bridged after the modules are imported (taskdata.seqio_bridge)
    pack: bool = False  # taskdata cache --pack: the workers pack the task's examples (Task.with_packing)
    # The row length of every packed feature, and how many rows stay open: None for a cache of examples.
    packing_lengths: tuple[tuple[str, int], ...] | None = None
    packing_open_rows: int = 1

    def shards_of(self, split: str) -> int:
        return dict(self.num_shards)[split]


def load_task(spec: CacheJobSpec) -> Task:
    """The job's task as a worker sees it: its modules imported, its fingerprint checked against the launcher's."""
    from taskdata.config import Config
    from taskdata.sources.digest import remember_digests_in
    from taskdata.tasks import default_registry

    if spec.digest_memo_dir is not None:
        remember_digests_in(spec.digest_memo_dir)  # the launcher hashed the local source files already

    registry = default_registry(Config(*spec.config))
    if spec.seqio_tasks:
        from taskdata.seqio_bridge import add_seqio_task, import_seqio

        import_seqio()  # before the modules: they import seqio, which needs protobuf's check relaxed first
    for module in spec.modules:
        registry.load_module(module)
    for name in spec.seqio_tasks:
        add_seqio_task(name, registry)
    task = registry.get_task(spec.task)
    if spec.pack and task.packing is None:
        task = task.with_packing()
    fingerprint = task.fingerprint()
    if fingerprint != spec.task_fingerprint:
        raise RuntimeError(
            f"Task {spec.task!r} has fingerprint {fingerprint[:12]} on this worker but "
            f"{spec.task_fingerprint[:12]} where the job was launched: the worker runs different task code, "
            "source files or vocabulary. Ship the same package and task modules to the workers."
        )
    return task


def encode_cache_record(example: Mapping[str, Any], shard_index: int, ordinal: int) -> bytes:
    """The tf.train.Example of one final example plus its ``provenance/origin`` (taskdata.cache.provenance)."""
    from taskdata.cache.provenance import ORIGIN
    from taskdata.example import encode_example

    features: dict[str, Any] = {k: v for k, v in example.items() if not k.startswith("_")}
    features[ORIGIN] = example_origin(example, shard_index, ordinal)
    return encode_example(features)


def _runs_in_columns(task: Task) -> bool:
    """Whether the job makes this task's records from ``ExampleBatch`` columns (``Task.process_shard_batches``):
    a task of examples (not packed rows) whose features are all token features and whose last
    preprocessors have batch forms. The records are the same either way; the columns cost less Python."""
    return (task.packing is None and task.batch_start() is not None
            and all(f.dtype != "string" for f in task.output_features.values()))


def encode_cache_records(batch: ExampleBatch, shard_index: int, first_ordinal: int) -> list[bytes]:
    """``encode_cache_record`` of every row of ``batch``, whose first row is example ``first_ordinal``."""
    from taskdata.cache.provenance import ORIGIN, ORIGIN_WIDTH
    from taskdata.example.encode_many import encode_int_rows

    count = len(batch)
    ordinals = np.arange(first_ordinal, first_ordinal + count, dtype=np.int64)
    first = batch.meta.get("_source_first", batch.meta.get("_source_index", ordinals))
    last = batch.meta.get("_source_last", batch.meta.get("_source_index", ordinals))
    if any(c.values.dtype.kind not in "iub" for c in batch.tokens.values()) or (first < 0).any() or (last < first).any():
        # A float feature, or a row whose origin is refused (origin_values says why): row by row.
        return [encode_cache_record(example, shard_index, int(ordinal))
                for example, ordinal in zip(batch.rows(), ordinals.tolist(), strict=True)]
    origin = np.stack([np.full(count, shard_index, dtype=np.int64), ordinals, first, last - first], axis=1)
    columns = {key: (column.values, column.offsets) for key, column in batch.tokens.items()}
    columns[ORIGIN] = (origin.ravel(), np.arange(0, ORIGIN_WIDTH * count + 1, ORIGIN_WIDTH, dtype=np.int64))
    return encode_int_rows(columns)


def example_origin(example: Mapping[str, Any], shard_index: int, ordinal: int) -> list[int]:
    """The provenance numbers of an example: its stable id and the source documents it was made from
    (``_source_first``/``_source_last``, or the one ``_source_index``; a source without either: its ordinal)."""
    from taskdata.cache.provenance import origin_values

    first = example.get("_source_first", example.get("_source_index", ordinal))
    last = example.get("_source_last", example.get("_source_index", ordinal))
    return origin_values(shard_index, ordinal, int(first), int(last))


def feature_info(task: Task, example: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """seqio's ``info.{split}.json`` feature entries for the features of ``example``."""
    info: dict[str, dict[str, Any]] = {}
    for key, value in example.items():
        if key.startswith("_"):
            continue
        if isinstance(value, str | bytes):
            info[key] = {"dtype": "string", "shape": []}
            continue
        array = np.asarray(value)
        declared = task.output_features.get(key)
        if declared is not None:
            dtype = declared.dtype
        else:
            dtype = "string" if array.dtype.kind in "SUO" else str(array.dtype)
        # seqio's convention (beam_utils.GetInfo): the first dimension varies, the others are fixed.
        info[key] = {"dtype": dtype, "shape": [None, *array.shape[1:]] if array.ndim else []}
    from taskdata.cache.provenance import ORIGIN, origin_info

    info[ORIGIN] = origin_info(packed=False)
    return dict(sorted(info.items()))


def source_result_path(tmp_dir: str, split: str, shard_index: int) -> str:
    return fs.join(tmp_dir, "results", "sources", f"{split}-{shard_index:06d}.json")


def shard_result_path(tmp_dir: str, split: str, shard_index: int) -> str:
    return fs.join(tmp_dir, "results", "shards", f"{split}-{shard_index:06d}.json")


def preprocess_source_shard(spec: CacheJobSpec, split: str, shard_index: int, source_shard: str,
                            task: Task) -> Iterator[tuple[tuple[str, int], tuple[str, int, int, int]]]:
    """Runs the task on one source shard; spills keyed records; yields (split, dest) -> segment."""
    from taskdata.beam.spill import SpillWriter
    from taskdata.cache.shuffle import shuffle_key
    from taskdata.cache.stats import FeatureStats

    ctx = task.shard_context(split, shard_index, spec.seed)
    num_shards = spec.shards_of(split)
    spiller = SpillWriter(fs.join(spec.tmp_dir, "spill", split, f"src{shard_index:06d}"), num_shards,
                          spec.spill_buffer_bytes)
    stats = FeatureStats()
    token_features = [k for k, f in task.output_features.items() if f.dtype != "string"]
    text_features = [k for k in task.output_features if k.endswith("_pretokenized")]
    info: dict[str, Any] | None = None
    if _runs_in_columns(task):
        from taskdata.cache.shuffle import shuffle_keys

        ordinal = 0
        for batch in task.process_shard_batches(ctx, source_shard, allow_empty=spec.allow_empty_source_files):
            count = len(batch)
            records = encode_cache_records(batch, shard_index, ordinal)
            for key, record in zip(shuffle_keys(spec.seed, task.name, split, shard_index, ordinal, count), records,
                                   strict=True):
                spiller.add(key, record)
            stats.add_lengths(count, {k: c.lengths for k, c in batch.tokens.items() if k in token_features})
            if info is None and count:
                info = feature_info(task, next(batch.rows()))
            ordinal += count
        yield from _finish_source_shard(spec, split, shard_index, source_shard, spiller, stats, ctx, info)
        return
    examples: Iterator[Mapping[str, Any]] = task.process_shard(
        ctx, source_shard, allow_empty=spec.allow_empty_source_files
    )
    lengths = task.packing_lengths
    if lengths is not None:
        from taskdata.beam.rows import encode_entry

        examples = _trimmed_to_rows(task, ctx, examples)
        keys = list(lengths)
    for ordinal, example in enumerate(examples):
        if task.packing is None:
            record = encode_cache_record(example, shard_index, ordinal)
        else:  # the shard writer packs it with others into a row
            record = encode_entry(example, keys, source_shard, shard_index, ordinal)
        spiller.add(shuffle_key(spec.seed, task.name, split, shard_index, ordinal), record)
        stats.add(example, token_features, text_features)
        if info is None:
            info = feature_info(task, example)
    yield from _finish_source_shard(spec, split, shard_index, source_shard, spiller, stats, ctx, info)


def _finish_source_shard(spec: CacheJobSpec, split: str, shard_index: int, source_shard: str, spiller: Any,
                         stats: Any, ctx: Any, info: dict[str, Any] | None,
                         ) -> Iterator[tuple[tuple[str, int], tuple[str, int, int, int]]]:
    """Writes the spilled runs and the shard's result file; yields (split, dest) -> segment."""
    segments = spiller.close()
    result = {
        "split": split, "source_shard": source_shard.rsplit("/", 1)[-1], "source_shard_index": shard_index,
        "examples": stats.examples, "stats": stats.to_json(), "counters": dict(sorted(ctx.counters.items())),
        "features": info,
    }
    fs.write_atomic(source_result_path(spec.tmp_dir, split, shard_index), canonical_json(result).encode())
    for dest, segment in segments:
        yield (split, dest), segment.to_tuple()


def _trimmed_to_rows(task: Any, ctx: Any, examples: Iterator[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    """Examples of a packed task, each feature cut to its row length by the task's rule, and counted."""
    from taskdata.example.packing import trim_to_length

    rules = [(key, length, task.output_features[key].vocabulary.eos_id if task.output_features[key].add_eos else None)
             for key, length in task.packing_lengths.items()]
    for example in examples:
        out = dict(example)
        extra = sorted(k for k in out if not k.startswith("_") and k not in task.packing_lengths)
        if extra:
            raise ValueError(f"Task {task.name!r} packs {sorted(task.packing_lengths)}, but an example also has {extra}, "
                             "which a packed row has no place for. Drop them in the preprocessors (e.g. with Rekey).")
        for key, length, eos_id in rules:
            if key not in out:
                raise ValueError(f"Task {task.name!r} packs feature {key!r}, but an example has none (it has "
                                 f"{sorted(k for k in out if not k.startswith('_'))}); every packed example needs "
                                 "every packed feature.")
            value = np.asarray(out[key])
            if value.shape[0] > length:
                ctx.count(f"packing/{key}_examples_trimmed")
                ctx.count(f"packing/{key}_tokens_trimmed", value.shape[0] - length)
                out[key] = trim_to_length(value, length, eos_id)
        yield out


def packing_result_path(tmp_dir: str, split: str, shard_index: int) -> str:
    return fs.join(tmp_dir, "results", "packing", f"{split}-{shard_index:06d}.json")


def write_output_shard(spec: CacheJobSpec, split: str, dest: int, segments: list[tuple[str, int, int, int]]) -> None:
    """Merges the segments of one output shard by key and writes the shard and its offsets."""
    from taskdata.beam.spill import Segment, merge_segments

    # Streamed: the segments are merged by key while the shard is written, so memory does not grow with it.
    merged = merge_segments([Segment.from_tuple(value) for value in sorted(segments)])
    num_shards = spec.shards_of(split)
    ordered: Iterator[bytes] = _unique_keys(merged, spec, split)
    if spec.packing_lengths is not None:
        from taskdata.beam.rows import pack_entries

        packed = pack_entries(list(ordered), dict(spec.packing_lengths), spec.packing_open_rows)
        fs.write_atomic(packing_result_path(spec.tmp_dir, split, dest), canonical_json(packed.result()).encode())
        ordered = iter(packed.rows)
    _write_shard_files(spec, split, dest, num_shards, ordered)


def _unique_keys(entries: Iterator[tuple[int, bytes]], spec: CacheJobSpec, split: str) -> Iterator[bytes]:
    """The records of ``entries`` (in key order); two of one key are an error naming both examples."""
    previous_key, previous = None, b""
    for key, record in entries:
        if key == previous_key:
            describe: Callable[[bytes], str] = _describe_record
            if spec.packing_lengths is not None:
                from taskdata.beam.rows import describe_entry as describe
            raise RuntimeError(
                f"Two examples of split {split!r} have the same shuffle key: {describe(previous)} and "
                f"{describe(record)}. Stable ids must be unique (is a source shard listed twice?)."
            )
        previous_key, previous = key, record
        yield record


def _write_shard_files(spec: CacheJobSpec, split: str, dest: int, num_shards: int, records: Iterable[bytes]) -> None:
    from taskdata.cache.origins import OriginsCollector
    from taskdata.cache.tfrecord import TFRecordWriter, write_offsets

    name = shard_name(split, dest, num_shards)
    path = fs.join(spec.version_dir, name)
    # A record of one example has one origin: its sidecar lets the ledger read no record (packed rows have many).
    origins = OriginsCollector(name) if spec.packing_lengths is None else None
    if origins is not None:
        records = origins.passed(records)
    fs_, inner = fs.filesystem(path)
    # Locally: write under the job's temporary folder, then rename (a worker killed half-way, whose task the
    # runner retries elsewhere, leaves its partial file there, never in the version). On an object store the
    # upload itself is all-or-nothing.
    tmp = inner if fs.is_remote(path) else fs.temporary_path(path, _writing_dir(spec))
    if tmp != inner:
        fs_.makedirs(inner.rsplit("/", 1)[0], exist_ok=True)  # as fs.write_atomic does for the files beside it
    digest = hashlib.sha256()
    max_record = 0
    try:
        with fs_.open(tmp, "wb") as f:
            hashing = _HashingFile(f, digest)
            writer = TFRecordWriter(hashing)
            for record in records:
                writer.write(record)
                max_record = max(max_record, len(record))
            hashing.flush()
            offsets = writer.offsets
            size = hashing.written
    except BaseException:
        if tmp != inner and os.path.exists(tmp):  # records fail while streaming in (a duplicate key): no half file
            os.remove(tmp)
        raise
    offsets_data = write_offsets(offsets, size, writer.crcs)
    _write_version_file(spec, fs.join(spec.version_dir, offsets_name(split, dest, num_shards)), offsets_data)
    origins_entry = None
    if origins is not None:
        from taskdata.cache.origins import origins_sidecar

        origins_data = origins_sidecar(origins.rows())
        _write_version_file(spec, fs.join(spec.version_dir, origins_name(split, dest, num_shards)), origins_data)
        origins_entry = {"file": origins_name(split, dest, num_shards),
                         "sha256": hashlib.sha256(origins_data).hexdigest(), "bytes": len(origins_data)}
    if tmp != inner:
        os.replace(tmp, inner)
    result = {
        "file": name, "records": len(offsets), "bytes": size, "sha256": digest.hexdigest(),
        "offsets_file": offsets_name(split, dest, num_shards),
        "offsets_sha256": hashlib.sha256(offsets_data).hexdigest(), "max_record_bytes": max_record,
        **({} if origins_entry is None else {"origins": origins_entry}),
    }
    fs.write_atomic(shard_result_path(spec.tmp_dir, split, dest), canonical_json(result).encode())


def _writing_dir(spec: CacheJobSpec) -> str:
    """Where a version's files are written before they are renamed into place (removed with the job's tmp_dir)."""
    return fs.join(spec.tmp_dir, "writing")


def _write_version_file(spec: CacheJobSpec, path: str, data: bytes) -> None:
    """Writes a sidecar of the version as the shard itself is written: locally under ``_writing_dir``, then renamed
    into place; on an object store in one upload."""
    if fs.is_remote(path):
        fs.write_atomic(path, data)
        return
    inner = fs.filesystem(path)[1]
    staged = fs.temporary_path(path, _writing_dir(spec))
    with open(staged, "wb") as f:
        f.write(data)
    os.makedirs(os.path.dirname(inner), exist_ok=True)
    os.replace(staged, inner)


class _HashingFile:
    """A write-only file wrapper that hashes and counts what passes through it.

    Writes are gathered into blocks of ``block_bytes`` before they are hashed and written: a shard is
    written a record frame (~1 KB) at a time, and one sha256 update and one file write per frame cost
    more than the hashing itself. ``flush`` must be called once at the end.
    """

    def __init__(self, f: IO[bytes], digest: Any, block_bytes: int = 1 << 20):
        self._f = f
        self._digest = digest
        self._block: list[bytes] = []
        self._block_size = 0
        self._block_bytes = block_bytes
        self.written = 0

    def write(self, data: bytes) -> int:
        self._block.append(data)
        self._block_size += len(data)
        self.written += len(data)
        if self._block_size >= self._block_bytes:
            self.flush()
        return len(data)

    def flush(self) -> None:
        if self._block:
            block = b"".join(self._block)
            self._digest.update(block)
            self._f.write(block)
            self._block, self._block_size = [], 0

    def tell(self) -> int:
        return self.written


def _describe_record(record: bytes) -> str:
    """``source shard/ordinal`` of a record, for errors."""
    from taskdata.cache.provenance import ORIGIN
    from taskdata.example import decode_example

    origin = decode_example(record, (ORIGIN,)).get(ORIGIN)
    return "?" if origin is None or len(origin) < 2 else f"source shard {int(origin[0])}, example {int(origin[1])}"


class PreprocessShard(beam.DoFn):
    """(split, source shard index, source shard path) -> (split, output shard) -> segment."""

    _task: Task  # set by setup(), which Beam calls on the worker before process()

    def __init__(self, spec: CacheJobSpec):
        self._spec = spec

    def setup(self) -> None:
        self._task = load_task(self._spec)

    def process(self, element: tuple[str, int, str]) -> Iterator[tuple[tuple[str, int], tuple[str, int, int, int]]]:
        split, shard_index, source_shard = element
        yield from preprocess_source_shard(self._spec, split, shard_index, source_shard, self._task)
        beam.metrics.Metrics.counter("taskdata", "source_shards_done").inc()


class WriteShard(beam.DoFn):
    """(split, output shard) -> its segments, merged by key into the shard file."""

    def __init__(self, spec: CacheJobSpec):
        self._spec = spec

    def process(self, element: tuple[tuple[str, int], Iterable[tuple[str, int, int, int]]]) -> None:
        (split, dest), segments = element
        write_output_shard(self._spec, split, dest, list(segments))


def build_cache_pipeline(pipeline: beam.Pipeline, spec: CacheJobSpec, work: list[tuple[str, int, str]]) -> None:
    """Adds the cache transforms for ``work`` (split, source shard index, source shard path)."""
    _ = (
        pipeline
        | "SourceShards" >> beam.Create(work)
        | "SpreadWork" >> beam.Reshuffle()
        | "PreprocessShard" >> beam.ParDo(PreprocessShard(spec))
        | "GroupByOutputShard" >> beam.GroupByKey()
        | "WriteShard" >> beam.ParDo(WriteShard(spec))
    )


def read_json(path: str) -> dict[str, Any]:
    return json.loads(fs.read_bytes(path))
