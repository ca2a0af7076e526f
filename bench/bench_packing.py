"""Packing at cache time: how full the rows are, next to seqio's trim_and_pack, and what packing costs the job.

Builds a C4-format corpus with the built-in recipe, then caches ``c4_sentence_prefix_lm`` (one example per
sentence, rows of 256 + 256 tokens) with and without ``--pack``, alternating, each a fresh
``taskdata cache`` process (Beam's in-process runner, start-up and verification included). Efficiency is
non-padding tokens / row tokens over the train split: for taskdata's packed cache; for seqio 0.0.20's
``trim_and_pack_dataset`` over the very same examples in the same order (each shard of the unpacked cache,
which is the order the cache job packs); for next fit (one open row, seqio's rule without its
128-example windows); and for one example per row (no packing).

    PYTHONPATH=. python bench/bench_packing.py --docs 2000 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from bench._measure import run_measured
from bench._report import write_section
from taskdata.cache.format import load_manifest
from taskdata.cache.reader import CacheReader
from taskdata.example.packing import plan_rows
from taskdata.tasks import corpus

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")
TASK = "c4_sentence_prefix_lm"


def run_job(corpus_dir: str, output: str, vocab: str, pack: bool) -> tuple[float, float, str]:
    env = dict(os.environ, TASKDATA_VOCAB=vocab, PYTHONPATH=os.getcwd())
    command = [sys.executable, "-m", "taskdata", "cache", "--task", TASK, "--c4-dir", corpus_dir, "--output", output,
               "--split", "train", "--num-shards", "4", "--force", "--quiet", *(["--pack"] if pack else [])]
    job = run_measured(command, env, what="cache job", sample_rss=False)
    return job["seconds"], job["cpu"], job["stdout"].strip().splitlines()[-1]


def packing_alone(shards: list[list[dict[str, np.ndarray]]], lengths: dict[str, int], open_rows: int) -> float:
    """Seconds of the packing work in the job (entries made, then packed into encoded rows), in this process."""
    from taskdata.beam.rows import encode_entry, pack_entries

    started = time.process_time()
    for examples in shards:
        entries = [encode_entry(e, list(lengths), "c4-train.00000-of-00004", 0, i) for i, e in enumerate(examples)]
        pack_entries(entries, lengths, open_rows)
    return time.process_time() - started


def shard_examples(version_dir: str) -> list[list[dict[str, np.ndarray]]]:
    """The examples of every train shard of an unpacked cache, in the shard's (key) order."""
    reader = CacheReader(version_dir)
    spec = {"inputs": "int32", "targets": "int32"}
    out = []
    for shard, count in enumerate(reader.record_counts("train")):
        decoded = reader.decode(reader.read("train", shard, 0, count), spec)
        out.append([{k: np.asarray(decoded[k].row(i)) for k in spec} for i in range(count)])
    return out


def seqio_rows(shards: list[list[dict[str, np.ndarray]]], lengths: dict[str, int]) -> tuple[int, int, float]:
    """(rows, non-padding tokens, seconds) of seqio's trim_and_pack_dataset, shard by shard."""
    from taskdata.seqio_bridge import import_seqio

    seqio = import_seqio()
    import tensorflow as tf

    rows = tokens = 0
    started = time.monotonic()
    for examples in shards:
        dataset = tf.data.Dataset.from_generator(
            lambda examples=examples: ({k: e[k] for k in lengths} for e in examples),
            output_signature={k: tf.TensorSpec([None], tf.int32) for k in lengths})
        for row in seqio.utils.trim_and_pack_dataset(dataset, lengths).as_numpy_iterator():
            rows += 1
            tokens += sum(int((row[f"{k}_segment_ids"] > 0).sum()) for k in lengths)
    return rows, tokens, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    vocab = corpus.ensure_builtin_vocabulary()
    corpus_dir = os.path.join(OUT, f"packing-corpus-{args.docs}")
    if not os.path.exists(os.path.join(corpus_dir, "CORPUS.json")):
        corpus.build_corpus(corpus_dir, num_train_docs=args.docs, num_validation_docs=50, train_files=4,
                            validation_files=1)
    load = os.getloadavg()[0]
    times: dict[bool, list[float]] = {False: [], True: []}
    cpu: dict[bool, list[float]] = {False: [], True: []}
    dirs: dict[bool, str] = {}
    for _ in range(args.rounds):
        for pack in (False, True):
            seconds, used, dirs[pack] = run_job(corpus_dir, os.path.join(OUT, f"packing-cache-{pack}"), vocab, pack)
            times[pack].append(seconds)
            cpu[pack].append(used)
            print(f"pack={pack}: {seconds:.1f} s wall, {used:.1f} s CPU", flush=True)

    manifest = load_manifest(dirs[True])
    lengths = dict(manifest.packing["lengths"])
    width = sum(lengths.values())
    counters = manifest.split("train").counters
    examples, rows = counters["packing/examples"], counters["packing/rows"]
    tokens = sum(counters[f"packing/{k}_tokens"] for k in lengths)
    shards = shard_examples(dirs[False])
    assert sum(len(s) for s in shards) == examples
    seqio_count, seqio_tokens, seqio_seconds = seqio_rows(shards, lengths)
    next_fit = sum(len(plan_rows(np.array([[len(e[k]) for k in lengths] for e in s]), list(lengths.values()), 1))
                   for s in shards)
    unpacked, packed = statistics.median(times[False]), statistics.median(times[True])
    unpacked_cpu, packed_cpu = statistics.median(cpu[False]), statistics.median(cpu[True])
    alone = packing_alone(shards, lengths, manifest.packing["open_rows"])
    lines = [
        f"{args.docs:,} built-in corpus documents -> {examples:,} examples of {TASK} (train, 4 shards), "
        f"{tokens:,} tokens, rows of {lengths}",
        f"taskdata packed cache (first fit, {manifest.packing['open_rows']} open rows): {rows:,} rows, "
        f"efficiency {tokens / (rows * width):.1%} (non-padding tokens / row tokens)",
        f"seqio trim_and_pack_dataset on the same examples in the same order: {seqio_count:,} rows, "
        f"efficiency {seqio_tokens / (seqio_count * width):.1%} ({seqio_tokens:,} tokens: "
        f"{'the same' if seqio_tokens == tokens else 'NOT the same'}); packing took seqio {seqio_seconds:.1f} s",
        f"next fit (one open row): {next_fit:,} rows, efficiency {tokens / (next_fit * width):.1%}; one example per "
        f"row (unpacked): {examples:,} rows, efficiency {tokens / (examples * width):.1%}",
        f"cache job (median of {args.rounds}, interleaved, fresh process each, start-up and verification "
        f"included): CPU time unpacked {unpacked_cpu:.1f} s, --pack {packed_cpu:.1f} s: "
        f"{packed_cpu / unpacked_cpu - 1:+.1%} (target <= +10%); wall time unpacked {unpacked:.1f} s, --pack "
        f"{packed:.1f} s: {packed / unpacked - 1:+.1%}; all runs (wall): unpacked "
        f"{', '.join(f'{t:.1f}' for t in times[False])}, packed {', '.join(f'{t:.1f}' for t in times[True])}",
        f"the packing work alone (entries made, planned, assembled and encoded as rows, in this process): "
        f"{alone:.2f} s CPU, {alone / examples * 1e6:.1f} us per example = {alone / unpacked_cpu:.1%} of the unpacked "
        f"job's CPU time (and the packed job writes {examples / rows:.0f}x fewer records)",
        f"cache size: unpacked {_bytes(dirs[False]) / 1e6:.1f} MB, packed {_bytes(dirs[True]) / 1e6:.1f} MB; "
        f"machine load (1-minute average, 2 cores shared with other work) {load:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after",
    ]
    print("\n".join(lines))
    write_section("Packing", lines)


def _bytes(version_dir: str) -> int:
    manifest = json.loads(Path(version_dir, "manifest.json").read_text())
    return sum(sh["bytes"] for s in manifest["splits"].values() for sh in s["shards"])


if __name__ == "__main__":
    main()
