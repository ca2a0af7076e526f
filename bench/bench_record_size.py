"""Bytes per example and per token of cache records: format 4's compact provenance next to format 2/3's.

Builds caches of the built-in tasks on the built-in C4-format corpus (in process; the split given, by
default validation) with the cache job as it is: ``c4_span_corruption``, ``c4_prefix_lm`` and
``c4_sentence_prefix_lm`` (sentences) packed into rows (``--pack``). The same records as formats 2 and 3 wrote them
are made from each record by ``seqio_style_record`` (its provenance/origin replaced by the seqio-style
features, the task, the seed and the source file name from the manifest); ``tests/test_provenance.py``
checks that this gives, byte for byte, the records of caches built before format 4. So "before" and
"after" are the same examples in the same run. Per example: framed record bytes (TFRecord's 16 bytes of
framing included; a packed row's bytes shared among its examples) and provenance bytes; per token:
record bytes over the non-padding tokens of every token feature.

    PYTHONPATH=. python bench/bench_record_size.py [--split validation] [--write]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._report import write_section
from taskdata.cache.format import Manifest
from taskdata.cache.provenance import ORIGIN, ORIGIN_WIDTH
from taskdata.example import decode_example, encode_example

FRAMING = 16  # TFRecord: length, its CRC, data CRC


def seqio_style_record(record: bytes, manifest: Manifest, split: str) -> bytes:
    """``record`` (format 4) as the cache job wrote it in format 2, or 3 for a packed row: the same features,
    with seqio-style provenance (task, source file name, seed and each number under its own name)."""
    example = decode_example(record)
    origins = np.asarray(example.pop(ORIGIN)).reshape(-1, ORIGIN_WIDTH)
    files = manifest.split(split).source_files
    assert files is not None
    names = [files[s] for s in origins[:, 0].tolist()]
    numbers = {
        "provenance/source_shard_index": origins[:, 0],
        "provenance/index_within_shard": origins[:, 1],
        "provenance/source_first_document": origins[:, 2],
        "provenance/source_last_document": origins[:, 2] + origins[:, 3],
    }
    example["provenance/task"] = manifest.task
    example["provenance/preprocessors_seed"] = [manifest.seed]
    example["provenance/source_shard"] = [n.encode() for n in names] if manifest.packing else names[0]
    example.update(numbers)
    return encode_example(example)


def provenance_bytes(record: bytes) -> int:
    """The bytes a record spends on provenance: its size less that of the same record without it."""
    example = decode_example(record)
    return len(record) - len(encode_example({k: v for k, v in example.items() if not k.startswith("provenance/")}))


def measure(version_dir: str, split: str) -> dict[str, Any]:
    from taskdata.cache.reader import CacheReader

    with CacheReader(version_dir) as reader:
        manifest = reader.manifest
        records = [r for s, n in enumerate(reader.record_counts(split)) for r in reader.read(split, s, 0, n)]
        token_features = [k for k, v in manifest.features.items() if not k.startswith("provenance/")
                          and v["dtype"] != "string" and not k.endswith(("_segment_ids", "_positions"))]
    decoded = [decode_example(r) for r in records]
    examples = sum(len(np.asarray(d[ORIGIN])) // ORIGIN_WIDTH for d in decoded)
    tokens = sum(int(np.count_nonzero(d[k])) for d in decoded for k in token_features)
    before = [seqio_style_record(r, manifest, split) for r in records]
    out: dict[str, Any] = {"records": len(records), "examples": examples, "tokens": tokens}
    for name, batch in (("before", before), ("after", records)):
        out[name] = {
            "bytes": sum(len(r) + FRAMING for r in batch),
            "provenance": sum(provenance_bytes(r) for r in batch),
        }
    return out


def build_caches(split: str, output: str) -> dict[str, str]:
    """Version folders of the measured caches, built in process on the built-in corpus."""
    from taskdata.beam.job import CacheOptions, run_cache_job
    from taskdata.config import Config
    from taskdata.tasks import default_registry

    registry = default_registry(Config())
    built = {}
    for label, task, pack in (("c4_span_corruption", "c4_span_corruption", False),
                              ("c4_prefix_lm", "c4_prefix_lm", False),
                              ("c4_sentence_prefix_lm packed", "c4_sentence_prefix_lm", True)):
        options = CacheOptions(task=task, output=os.path.join(output, label.replace(" ", "_")), splits=(split,),
                               progress=False, pack=pack, num_shards=2)
        built[label] = run_cache_job(options, registry, log=lambda message: None).version_dir
    return built


def report(results: dict[str, dict[str, Any]], split: str) -> list[str]:
    lines = [f"built-in corpus, split {split}, cache job in process; before: the same records with format 2/3's "
             "seqio-style provenance (what caches built before format 4 hold), after: format 4's provenance/origin"]
    for label, r in results.items():
        b, a = r["before"], r["after"]
        per = f"{r['examples']:,} examples" + (f" in {r['records']:,} rows" if r["records"] != r["examples"] else "")
        lines.append(
            f"{label} ({per}, {r['tokens']:,} tokens): bytes per example {b['bytes'] / r['examples']:,.1f} -> "
            f"{a['bytes'] / r['examples']:,.1f} ({a['bytes'] / b['bytes']:.3f}x); provenance bytes per example "
            f"{b['provenance'] / r['examples']:,.1f} -> {a['provenance'] / r['examples']:,.1f} "
            f"({a['provenance'] / b['provenance']:.3f}x; {b['provenance'] / b['bytes']:.1%} -> "
            f"{a['provenance'] / a['bytes']:.1%} of the bytes); bytes per token {b['bytes'] / r['tokens']:.3f} -> "
            f"{a['bytes'] / r['tokens']:.3f}"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", default="validation", help="the split to build and measure (default validation)")
    parser.add_argument("--write", action="store_true", help="write the figures into BENCHMARKS.md")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-record-size-") as output:
        built = build_caches(args.split, output)
        results = {label: measure(version_dir, args.split) for label, version_dir in built.items()}
    lines = report(results, args.split)
    print("\n".join(lines))
    if args.write:
        write_section("Record size", lines)


if __name__ == "__main__":
    main()
