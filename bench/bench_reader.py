"""Read throughput of one cache shard on one core: raw bytes, framing + CRC, full decode, TensorFlow.

Writes a synthetic shard of span-corruption-shaped examples (``inputs`` 512 and ``targets`` 114
random ids below 32,100, plus ``_task``, ``_shard`` and ``_index`` provenance features) with
taskdata's own writer, then reads it back, pinned to one core, in several ways:

- raw bytes (16 MiB reads, page cache warm): the ceiling;
- framing + both CRCs, sequentially (``iter_records``) and by ranged reads (``ShardReader.read``);
- the trainer's gathered reads (``CacheReader.read_records``, framing + CRCs + each record's place
  checked against the sidecar): contiguous runs (epoch 0) and scattered records (later epochs);
- full decode to numpy (``ShardReader.read_batch``), with and without CRC checks, for several
  batch sizes, and ``decode_batch`` alone on records already in memory;
- the peer, in the same run: TensorFlow's ``tf.data.TFRecordDataset`` + ``tf.io.parse_example``
  (batched, ragged) and the per-example ``parse_single_example`` map that seqio's cached reader uses.

And the write side's encoder: ``encode_example`` on records shaped like the cache job's
(``encode_cache_record``: the two token arrays plus ``provenance/origin``), each record once and
a small set of records over and over (its arrays in the CPU cache, as right after preprocessing),
against building and serializing a ``tf.train.Example`` with TensorFlow.

Every figure is the best of ``--repeats`` runs, in examples (or bytes) per CPU-second of this
process, which is pinned to one core (so TensorFlow's thread pools share that core too).
Appends its figures to the "Reader" section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import time
from collections.abc import Callable

import numpy as np

from taskdata import example as example_codec
from taskdata.cache import tfrecord
from taskdata.cache.shard_reader import ShardReader
from taskdata.example import decode_example

SECTION = "## Reader"
VOCAB = 32_100
INPUTS, TARGETS = 512, 114
SPEC = {"inputs": "int32", "targets": "int32", "_task": "string", "_shard": "int64", "_index": "int64"}


def make_shard(directory: pathlib.Path, records: int, seed: int) -> tuple[str, tfrecord.RecordIndex, int]:
    """(shard path, sidecar, max record bytes) of a freshly written synthetic shard, in a complete
    one-shard cache version folder (manifest and COMPLETED) that ``CacheReader`` opens."""
    (directory / "index").mkdir(parents=True, exist_ok=True)
    path = directory / "train.tfrecord-00000-of-00001"
    rng = np.random.default_rng(seed)
    longest = 0
    with open(path, "wb") as f:
        writer = tfrecord.TFRecordWriter(f)
        for i in range(records):
            record = example_codec.encode_example(
                {
                    "inputs": rng.integers(0, VOCAB, INPUTS, dtype=np.int32),
                    "targets": rng.integers(0, VOCAB, TARGETS, dtype=np.int32),
                    "_task": "c4_span_corruption",
                    "_shard": 17,
                    "_index": i,
                }
            )
            longest = max(longest, len(record))
            writer.write(record)
    sidecar = writer.offsets_sidecar()
    (directory / "index" / "train.tfrecord-00000-of-00001.offsets").write_bytes(sidecar)
    write_version_files(directory, path, sidecar, records, longest)
    return str(path), tfrecord.read_record_index(sidecar, "sidecar"), longest


def write_version_files(directory: pathlib.Path, path: pathlib.Path, sidecar: bytes, records: int, longest: int) -> None:
    import hashlib

    from taskdata.cache.format import Manifest, ShardEntry, SplitManifest, completed_bytes, manifest_bytes

    entry = ShardEntry(
        file=path.name, records=records, bytes=path.stat().st_size,
        sha256=hashlib.sha256(path.read_bytes()).hexdigest(), offsets_file=f"index/{path.name}.offsets",
        offsets_sha256=hashlib.sha256(sidecar).hexdigest(), max_record_bytes=longest,
    )
    manifest = Manifest(
        task="bench", task_fingerprint="0" * 64, fingerprints={}, seed=0, taskdata_version="bench",
        sequence_length={}, features={name: {"dtype": dtype, "shape": [None]} for name, dtype in SPEC.items()},
        splits={"train": SplitManifest(shards=(entry,), source_shards=1, counters={}, source_files=("bench",))},
    )
    data = manifest_bytes(manifest)
    (directory / "manifest.json").write_bytes(data)
    (directory / "COMPLETED").write_bytes(completed_bytes(data))


def gather(version_dir: str, order: np.ndarray, batch: int) -> None:
    from taskdata.cache.reader import CacheReader

    with CacheReader(version_dir) as reader:
        for first in range(0, len(order), batch):
            records = order[first : first + batch]
            reader.read_records("train", np.zeros(len(records), dtype=np.int64), records)


def cache_job_rows(count: int, seed: int) -> list[dict[str, object]]:
    """Records as the cache job encodes them: token ids (``eos`` = 1 up) and provenance features."""
    rng = np.random.default_rng(seed)
    return [
        {
            "inputs": rng.integers(1, VOCAB, INPUTS, dtype=np.int32),
            "targets": rng.integers(1, VOCAB, TARGETS, dtype=np.int32),
            "provenance/origin": [42, i, 3 * i, 2],
        }
        for i in range(count)
    ]


def tensorflow_encoder() -> Callable[[dict[str, object]], bytes]:
    """Builds and serializes a ``tf.train.Example`` from one record, as a TensorFlow writer would."""
    import tensorflow as tf

    def encode(row: dict[str, object]) -> bytes:
        feature = {}
        for name, value in row.items():
            if isinstance(value, str):
                feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode()]))
            else:
                values = value.tolist() if isinstance(value, np.ndarray) else value
                feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=values))
        example = tf.train.Example(features=tf.train.Features(feature=feature))
        return example.SerializeToString(deterministic=True)

    return encode


def best_cpu_seconds(run: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        run()
        best = min(best, time.process_time() - start)
    return best


def read_raw(path: str) -> None:
    with open(path, "rb", buffering=0) as f:
        while f.read(16 << 20):
            pass


def iterate_records(path: str) -> None:
    with open(path, "rb") as f:
        for _ in tfrecord.iter_records(f, path):
            pass


def read_ranges(path: str, index: tfrecord.RecordIndex, longest: int, batch: int) -> None:
    with ShardReader(path, index, longest) as reader:
        for first in range(0, reader.num_records, batch):
            reader.read(first, min(batch, reader.num_records - first))


def read_decoded(path: str, index: tfrecord.RecordIndex, longest: int, batch: int, verify_crc: bool) -> None:
    with ShardReader(path, index, longest, verify_crc=verify_crc) as reader:
        for first in range(0, reader.num_records, batch):
            reader.read_batch(first, min(batch, reader.num_records - first), SPEC)


def tensorflow_readers(path: str, batch: int) -> dict[str, Callable[[], object]]:
    import tensorflow as tf

    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    options = tf.data.Options()
    options.threading.private_threadpool_size = 1
    ragged = {
        "inputs": tf.io.RaggedFeature(tf.int64),
        "targets": tf.io.RaggedFeature(tf.int64),
        "_task": tf.io.RaggedFeature(tf.string),
        "_shard": tf.io.RaggedFeature(tf.int64),
        "_index": tf.io.RaggedFeature(tf.int64),
    }
    varlen = {name: tf.io.VarLenFeature(f.dtype) for name, f in ragged.items()}
    batched = (
        tf.data.TFRecordDataset(path)
        .batch(batch)
        .map(lambda x: tf.io.parse_example(x, ragged))
        .with_options(options)
    )
    single = (
        tf.data.TFRecordDataset(path)
        .map(lambda x: tf.io.parse_single_example(x, varlen))
        .with_options(options)
    )

    def drain(dataset: tf.data.Dataset) -> Callable[[], None]:
        def run() -> None:
            for _ in dataset:
                pass

        return run

    # Same values as ours (a correctness check of the peer, not a timing).
    first = next(iter(batched))
    ours = example_codec.decode_batch([r.numpy() for r in tf.data.TFRecordDataset(path).take(batch)], SPEC)
    assert first["inputs"].flat_values.numpy().tolist() == ours["inputs"].values.tolist()
    return {"batched": drain(batched), "single": drain(single)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=1024, help="records per read (the main figures)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", default=str(pathlib.Path(__file__).resolve().parent / "out" / "reader"))
    parser.add_argument("--encode-records", type=int, default=5_000, help="cache-job records to encode")
    parser.add_argument("--no-tf", action="store_true", help="skip the TensorFlow peer")
    parser.add_argument("--no-write", action="store_true", help="print only, do not touch BENCHMARKS.md")
    args = parser.parse_args()

    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    path, index, longest = make_shard(pathlib.Path(args.dir), args.records, args.seed)
    n = index.count
    size = int(index.offsets[-1])
    tokens = n * (INPUTS + TARGETS)
    read_raw(path)  # warm the page cache

    lines = [
        f"shard: {n:,} examples (inputs {INPUTS}, targets {TARGETS} random ids < {VOCAB:,}, _task/_shard/_index), "
        f"{size / 1e6:.1f} MB, {size / n:,.0f} bytes per record"
    ]

    def report(label: str, seconds: float, unit: str = "examples") -> None:
        rate = n / seconds
        extra = f", {tokens / seconds / 1e6:.1f}M tokens/s" if unit == "examples" else ""
        lines.append(f"{label}: {rate:,.0f} {unit}/s{extra} ({seconds * 1e6 / n:.1f} us each)")
        print(lines[-1], flush=True)

    seconds = best_cpu_seconds(lambda: read_raw(path), args.repeats)
    lines.append(f"raw read (16 MiB reads): {size / seconds / 1e6:,.0f} MB/s")
    print(lines[-1], flush=True)
    report(
        "framing + CRC, iter_records (sequential)",
        best_cpu_seconds(lambda: iterate_records(path), args.repeats),
        "records",
    )
    report(
        f"framing + CRC, ShardReader.read (batches of {args.batch})",
        best_cpu_seconds(lambda: read_ranges(path, index, longest, args.batch), args.repeats),
        "records",
    )
    version_dir = str(pathlib.Path(path).parent)
    report(
        f"framing + CRC + place, CacheReader.read_records (contiguous runs of {args.batch}, epoch 0)",
        best_cpu_seconds(lambda: gather(version_dir, np.arange(n), args.batch), args.repeats),
        "records",
    )
    scattered = np.random.default_rng(args.seed).permutation(n)
    report(
        f"framing + CRC + place, CacheReader.read_records (scattered, {args.batch} random records per call)",
        best_cpu_seconds(lambda: gather(version_dir, scattered, args.batch), args.repeats),
        "records",
    )
    for batch in sorted({64, 256, args.batch, 4096}):
        report(
            f"full decode with CRC, ShardReader.read_batch (batches of {batch})",
            best_cpu_seconds(lambda b=batch: read_decoded(path, index, longest, b, True), args.repeats),
        )
    report(
        f"full decode without CRC (batches of {args.batch})",
        best_cpu_seconds(lambda: read_decoded(path, index, longest, args.batch, False), args.repeats),
    )
    with ShardReader(path, index, longest) as reader:
        records = reader.read(0, n)
    report(
        f"decode_batch alone, records in memory (batches of {args.batch})",
        best_cpu_seconds(
            lambda: [
                example_codec.decode_batch(records[i : i + args.batch], SPEC) for i in range(0, n, args.batch)
            ],
            args.repeats,
        ),
    )
    sample = records[: max(1, n // 10)]
    seconds = best_cpu_seconds(lambda: [example_codec.decode_example(r) for r in sample], args.repeats)
    lines.append(
        f"decode_example, one record at a time (generic parser): {len(sample) / seconds:,.0f} examples/s"
    )
    print(lines[-1], flush=True)

    rows = cache_job_rows(args.encode_records, args.seed)
    warm = rows[:256]
    encode = example_codec.encode_example
    seconds = best_cpu_seconds(lambda: [encode(r) for r in rows], args.repeats)
    shape = f"inputs {INPUTS}, targets {TARGETS} int32 ids + provenance/origin"
    lines.append(
        f"encode_example, cache-job records ({shape}), {len(rows):,} records once each: "
        f"{len(rows) / seconds:,.0f} examples/s ({seconds * 1e6 / len(rows):.1f} us each)"
    )
    print(lines[-1], flush=True)
    seconds = best_cpu_seconds(lambda: [encode(r) for _ in range(20) for r in warm], args.repeats) / 20
    lines.append(
        f"encode_example, the same records, {len(warm)} of them encoded over and over (cache-warm): "
        f"{len(warm) / seconds:,.0f} examples/s ({seconds * 1e6 / len(warm):.1f} us each)"
    )
    print(lines[-1], flush=True)

    if not args.no_tf:
        tf_encode = tensorflow_encoder()
        sample_rows = rows[: max(1, len(rows) // 10)]
        # The same message as ours (a correctness check of the peer, not a timing).
        assert decode_example(tf_encode(rows[0])).keys() == decode_example(encode(rows[0])).keys()
        assert np.array_equal(decode_example(tf_encode(rows[0]))["inputs"], rows[0]["inputs"])
        seconds = best_cpu_seconds(lambda: [tf_encode(r) for r in sample_rows], args.repeats)
        lines.append(
            "TensorFlow tf.train.Example + SerializeToString(deterministic=True), same records: "
            f"{len(sample_rows) / seconds:,.0f} examples/s ({seconds * 1e6 / len(sample_rows):.1f} us each)"
        )
        print(lines[-1], flush=True)
        readers = tensorflow_readers(path, args.batch)
        report(
            f"TensorFlow TFRecordDataset + parse_example (ragged, batches of {args.batch})",
            best_cpu_seconds(readers["batched"], args.repeats),
        )
        report(
            "TensorFlow TFRecordDataset + parse_single_example per record (seqio's cached reader)",
            best_cpu_seconds(readers["single"], args.repeats),
        )

    if args.no_write:
        return
    command = "PYTHONPATH=. python bench/bench_reader.py" + (
        f" --records {args.records}" if args.records != 50_000 else ""
    )
    entry = [
        f"- {datetime.date.today().isoformat()}, 2 cores (shared; this process pinned to core {core}), "
        f"per CPU-second, best of {args.repeats}, `{command}`:"
    ] + [f"  - {line}" for line in lines]
    write_section(entry)


def write_section(entry: list[str]) -> None:
    path = pathlib.Path(__file__).resolve().parent.parent / "BENCHMARKS.md"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    start = text.find(SECTION + "\n")
    if start < 0:
        path.write_text(text.rstrip("\n") + f"\n\n{SECTION}\n" + "\n".join(entry) + "\n")
        return
    end = text.find("\n## ", start + len(SECTION))
    end = len(text) if end < 0 else end + 1
    section = text[start:end].rstrip("\n") + "\n" + "\n".join(entry) + "\n"
    path.write_text(text[:start] + section + ("\n" + text[end:] if end < len(text) else ""))


if __name__ == "__main__":
    main()
