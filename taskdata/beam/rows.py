"""Packed rows in the shard writer: a shard's examples, in their final (key-sorted) order, packed into rows.

Runs after the global order is fixed, on one output shard's records sorted by shuffle key, so the rows
are a pure function of the seed and the stable ids, like everything else in the cache. A row carries
the provenance of every example it holds, one list entry per segment (segment 1 first), so evaluation,
the ledger and the batch log can still name examples; the task name and preprocessing seed stay one
value (every example of a cache has the same).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from taskdata.cache.stats import FeatureStats
from taskdata.example import decode_example, encode_example
from taskdata.example.packing import assemble_row, packed_feature_names, plan_rows

__all__ = ["PER_SEGMENT_PROVENANCE", "PackedShard", "pack_records", "packed_feature_info"]

PROVENANCE = "provenance/"
# Provenance features that name one example: a list with one entry per segment in a packed row.
PER_SEGMENT_PROVENANCE = ("source_shard", "source_shard_index", "index_within_shard", "source_first_document",
                          "source_last_document")
_PER_ROW_PROVENANCE = ("task", "preprocessors_seed")


class PackedShard:
    """The rows of one output shard, and what they hold: examples, rows, non-padding tokens, row stats."""

    def __init__(self, rows: list[bytes], examples: int, tokens: Mapping[str, int], stats: FeatureStats):
        self.rows = rows
        self.examples = examples
        self.tokens = dict(tokens)
        self.stats = stats

    def result(self) -> dict[str, Any]:
        return {"examples": self.examples, "rows": len(self.rows), "tokens": self.tokens, "stats": self.stats.to_json()}


def pack_records(records: Sequence[bytes], lengths: Mapping[str, int], open_rows: int) -> PackedShard:
    """Packs cache records (examples with scalar provenance), in the order given, into encoded rows."""
    keys = list(lengths)
    examples = [decode_example(record) for record in records]
    sizes = np.array([[example[k].shape[0] for k in keys] for example in examples], dtype=np.int64)
    plan = plan_rows(sizes.reshape(len(examples), len(keys)), [lengths[k] for k in keys], open_rows)
    rows = []
    stats = FeatureStats()
    features = packed_feature_names(keys)
    for members in plan:
        chosen = [examples[i] for i in members]
        row: dict[str, Any] = assemble_row(chosen, lengths)
        for name in _PER_ROW_PROVENANCE:
            row[PROVENANCE + name] = chosen[0][PROVENANCE + name]
        for name in PER_SEGMENT_PROVENANCE:
            values = [example[PROVENANCE + name] for example in chosen]
            row[PROVENANCE + name] = ([v for value in values for v in value] if isinstance(values[0], list)
                                      else np.concatenate(values))
        rows.append(encode_example(row))
        stats.add(row, features)
    tokens = {k: int(sizes[:, i].sum()) if len(examples) else 0 for i, k in enumerate(keys)}
    return PackedShard(rows, len(examples), tokens, stats)


def packed_feature_info(info: Mapping[str, Mapping[str, Any]], lengths: Mapping[str, int]) -> dict[str, dict[str, Any]]:
    """seqio's ``info.{split}.json`` features of packed rows, from those of the examples they hold."""
    out = {key: dict(value) for key, value in info.items()}
    for key in lengths:
        for suffix in ("_segment_ids", "_positions"):
            out[key + suffix] = {"dtype": "int32", "shape": [None]}
    for name in PER_SEGMENT_PROVENANCE:
        out[PROVENANCE + name] = {**out[PROVENANCE + name], "shape": [None]}
    return dict(sorted(out.items()))
