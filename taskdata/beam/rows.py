"""Packed rows in the shard writer: a shard's examples, in their final (key-sorted) order, packed into rows.

Runs after the global order is fixed, on one output shard's examples sorted by shuffle key, so the rows
are a pure function of the seed and the stable ids, like everything else in the cache. A row carries
the provenance of every example it holds (``provenance/origin``: four numbers per segment, segment 1
first), so evaluation, the ledger and the batch log can still name examples.

Between the stages a packed task's example travels as a compact *entry*, not as a ``tf.train.Example``:
its provenance numbers, its source shard's name and its token arrays, which the writer reads back with
a few ``numpy`` calls (a parsed ``tf.train.Example`` per example would cost more than the packing).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from taskdata.cache.provenance import ORIGIN, origin_info, origin_values
from taskdata.cache.stats import FeatureStats
from taskdata.example import encode_example
from taskdata.example.packing import assemble_rows, packed_feature_names, plan_rows

__all__ = ["PackedShard", "describe_entry", "encode_entry", "pack_entries", "packed_feature_info"]

# source shard index, ordinal, first and last source document, length of the source shard's name.
_HEADER = struct.Struct("<qqqqH")


def encode_entry(example: Mapping[str, Any], features: Sequence[str], source_shard: str, shard_index: int,
                 ordinal: int) -> bytes:
    """One example of a packed task as it travels to the shard writer: provenance, then each feature's tokens."""
    first = example.get("_source_first", example.get("_source_index", ordinal))
    last = example.get("_source_last", example.get("_source_index", ordinal))
    origin_values(shard_index, ordinal, int(first), int(last))  # checks the document range where it is made
    name = source_shard.rsplit("/", 1)[-1].encode()
    arrays = [np.asarray(example[k], dtype="<i8") for k in features]
    sizes = struct.pack(f"<{len(features)}I", *(a.shape[0] for a in arrays))
    return b"".join([_HEADER.pack(shard_index, ordinal, int(first), int(last), len(name)), name, sizes,
                     *(a.tobytes() for a in arrays)])


def _decode_entries(entries: Sequence[bytes], features: Sequence[str]) -> tuple[np.ndarray, list[bytes], dict[str, Any]]:
    """(provenance numbers [n, 4], source shard names, feature -> (flat tokens, row splits))."""
    numbers = np.zeros((len(entries), 4), dtype=np.int64)
    names: list[bytes] = []
    sizes = np.zeros((len(entries), len(features)), dtype=np.int64)
    payloads = []
    sizes_format = struct.Struct(f"<{len(features)}I")
    for i, entry in enumerate(entries):
        *head, name_length = _HEADER.unpack_from(entry)
        numbers[i] = head
        start = _HEADER.size + name_length
        names.append(entry[_HEADER.size : start])
        sizes[i] = sizes_format.unpack_from(entry, start)
        payloads.append(entry[start + sizes_format.size :])
    flat = np.frombuffer(b"".join(payloads), dtype="<i8")
    # Example i's tokens start at its payload's start; feature f's after features 0..f-1 of the same example.
    example_starts = np.concatenate([[0], np.cumsum(sizes.sum(axis=1))])[:-1]
    tokens = {}
    for f, key in enumerate(features):
        starts = example_starts + sizes[:, :f].sum(axis=1)
        index = np.repeat(starts, sizes[:, f]) + (np.arange(int(sizes[:, f].sum()))
                                                  - np.repeat(np.cumsum(sizes[:, f]) - sizes[:, f], sizes[:, f]))
        tokens[key] = (flat[index], np.concatenate([[0], np.cumsum(sizes[:, f])]).astype(np.int64))
    return numbers, names, tokens


def describe_entry(entry: bytes) -> str:
    """``source_shard(#index)/ordinal`` of an entry, for errors."""
    index, ordinal, _, _, name_length = _HEADER.unpack_from(entry)
    return f"{entry[_HEADER.size : _HEADER.size + name_length].decode()}(#{index})/{ordinal}"


class PackedShard:
    """The rows of one output shard, and what they hold: examples, rows, non-padding tokens, row stats."""

    def __init__(self, rows: list[bytes], examples: int, tokens: Mapping[str, int], stats: FeatureStats):
        self.rows = rows
        self.examples = examples
        self.tokens = dict(tokens)
        self.stats = stats

    def result(self) -> dict[str, Any]:
        return {"examples": self.examples, "rows": len(self.rows), "tokens": self.tokens, "stats": self.stats.to_json()}


def pack_entries(entries: Sequence[bytes], lengths: Mapping[str, int], open_rows: int) -> PackedShard:
    """Packs entries (``encode_entry``), in the order given, into encoded rows with their provenance."""
    keys = list(lengths)
    numbers, _, tokens = _decode_entries(entries, keys)
    sizes = np.stack([np.diff(tokens[k][1]) for k in keys], axis=1) if entries else np.zeros((0, len(keys)), np.int64)
    plan = plan_rows(sizes, [lengths[k] for k in keys], open_rows)
    arrays = assemble_rows(tokens, plan, lengths)
    stats = FeatureStats()
    features = packed_feature_names(keys)
    # provenance/origin per example: source shard, ordinal, first document, documents after the first.
    origins = numbers.copy()
    origins[:, 3] -= origins[:, 2]
    rows = []
    for r, members in enumerate(plan):
        row: dict[str, Any] = {name: arrays[name][r] for name in features}
        row[ORIGIN] = origins[members].reshape(-1)
        rows.append(encode_example(row))
        stats.add(row, features)
    return PackedShard(rows, len(entries), {k: int(sizes[:, i].sum()) for i, k in enumerate(keys)}, stats)


def packed_feature_info(info: Mapping[str, Mapping[str, Any]], lengths: Mapping[str, int]) -> dict[str, dict[str, Any]]:
    """seqio's ``info.{split}.json`` features of packed rows, from those of the examples they hold."""
    out = {key: dict(value) for key, value in info.items()}
    for key in lengths:
        for suffix in ("_segment_ids", "_positions"):
            out[key + suffix] = {"dtype": "int32", "shape": [None]}
    out[ORIGIN] = origin_info(packed=True)
    return dict(sorted(out.items()))
