"""Where every example of a cache was born, in a few bytes per record.

Format ``taskdata.cache/4`` (what the cache job writes) gives every example one int64 feature,
``provenance/origin``, of four small numbers: its source shard index and its ordinal in that shard's output
stream (with the cache's task and split: its stable id ``task/split/shard/ordinal``), the first source
document it was made from, and how many documents after that one it spans. A packed row holds the four
numbers of each of its examples, segment 1 first. What is the same for a whole split is stated once, not
per record: the task and the preprocessing seed in the manifest, and the source files in the split's table
(``SplitManifest.source_files``, by source shard index). That is ~30 bytes per example; formats 2 and 3 spent
~300 on seqio-style features (the task and the source file's name as strings, each number under its own
long name), a quarter of a span-corruption record.

The cache job also writes each shard's origins once more, beside it (``taskdata.cache.origins``), so the
ledger takes them from an array (``origins_provenance``) instead of reading records.

Formats 2 and 3 are still read: ``provenance_spec`` names the features to decode for the manifest's format
and ``read_provenance`` turns either layout into the same columns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from taskdata.cache.format import CacheFormatError, Manifest
from taskdata.example import RaggedFeature
from taskdata.seeding import format_example_id

__all__ = [
    "ORIGIN",
    "ORIGIN_WIDTH",
    "Provenance",
    "origin_info",
    "origin_values",
    "origins_provenance",
    "provenance_spec",
    "read_provenance",
]

ORIGIN = "provenance/origin"
ORIGIN_WIDTH = 4  # source shard index, ordinal, first document, documents after the first

# Formats 2 and 3: seqio's provenance features, one value each (one per segment in a packed row).
_SOURCE_FILE = "provenance/source_shard"
_SOURCE_SHARD = "provenance/source_shard_index"
_ORDINAL = "provenance/index_within_shard"
_FIRST = "provenance/source_first_document"
_LAST = "provenance/source_last_document"
_SEQIO_STYLE = {_SOURCE_FILE: "string", _SOURCE_SHARD: "int64", _ORDINAL: "int64", _FIRST: "int64", _LAST: "int64"}


def origin_values(source_shard: int, ordinal: int, first_document: int, last_document: int) -> list[int]:
    """The ``provenance/origin`` numbers of one example."""
    if not 0 <= first_document <= last_document:
        raise ValueError(
            f"Example {source_shard}/{ordinal} names source documents {first_document}..{last_document}; a range of "
            "source documents runs from a first document >= 0 to a last one not before it. Check the preprocessor "
            "that sets _source_first/_source_last.")
    return [source_shard, ordinal, first_document, last_document - first_document]


def origin_info(packed: bool) -> dict[str, object]:
    """The ``info.{split}.json`` entry of ``provenance/origin`` (seqio parses it as [4] or, packed, [n, 4])."""
    return {"dtype": "int64", "shape": [None, ORIGIN_WIDTH] if packed else [ORIGIN_WIDTH]}


@dataclasses.dataclass(frozen=True, eq=False)
class Provenance:
    """The provenance of a batch of records, one entry per example (a packed row's examples segment 1 first).

    ``examples_per_record[i]`` is how many examples record ``i`` holds (1 unless the cache is packed).
    ``first_document``/``last_document`` are None where the cache does not record them (early format 2).
    """

    source_shard: np.ndarray  # int64
    ordinal: np.ndarray  # int64
    source_file: np.ndarray  # object (str)
    first_document: np.ndarray | None
    last_document: np.ndarray | None
    examples_per_record: np.ndarray

    def ids(self, task: str, split: str) -> list[str]:
        """The stable ids ``task/split/source shard/ordinal`` (``taskdata.seeding.format_example_id``)."""
        return [format_example_id(task, split, s, o)
                for s, o in zip(self.source_shard.tolist(), self.ordinal.tolist(), strict=True)]


def provenance_spec(manifest: Manifest) -> dict[str, str]:
    """The features (and decoder dtypes) to decode for the provenance of ``manifest``'s records."""
    if manifest.compact_provenance:
        return {ORIGIN: "int64"}
    spec = {name: dtype for name, dtype in _SEQIO_STYLE.items() if name in manifest.features}
    missing = sorted({_SOURCE_SHARD, _ORDINAL, _SOURCE_FILE} - set(spec))
    if missing:
        raise CacheFormatError(
            f"Cache of task {manifest.task!r} (format {manifest.format}) has no provenance features {missing}: it was "
            "not built by taskdata's cache job. Rebuild it with 'taskdata cache'.")
    return spec


def read_provenance(manifest: Manifest, split: str, decoded: Mapping[str, RaggedFeature]) -> Provenance:
    """The provenance of records decoded with (at least) ``provenance_spec(manifest)``."""
    if manifest.compact_provenance:
        return _compact(manifest, split, decoded[ORIGIN])
    return _seqio_style(manifest, decoded)


def _compact(manifest: Manifest, split: str, origin: RaggedFeature) -> Provenance:
    values = np.asarray(origin.values, dtype=np.int64)
    counts = np.diff(origin.row_splits)
    bad = np.flatnonzero((counts == 0) | (counts % ORIGIN_WIDTH != 0))
    if bad.size:
        raise CacheFormatError(
            f"Cache of task {manifest.task!r}, split {split!r}: record {int(bad[0])} of the batch has "
            f"{int(counts[bad[0]])} provenance/origin values; every example has {ORIGIN_WIDTH}.")
    return _from_origins(manifest, split, values.reshape(-1, ORIGIN_WIDTH), counts // ORIGIN_WIDTH)


def origins_provenance(manifest: Manifest, split: str, rows: np.ndarray) -> Provenance:
    """The provenance of records of one example each whose ``provenance/origin`` values are ``rows``
    (``[records, 4]``, as their shards' origins sidecars hold them: ``taskdata.cache.origins``)."""
    if not manifest.compact_provenance:
        raise CacheFormatError(f"Cache of task {manifest.task!r} is format {manifest.format}, whose records carry "
                               f"no {ORIGIN}; read their provenance with read_provenance.")
    return _from_origins(manifest, split, np.asarray(rows, np.int64), np.ones(len(rows), np.int64))


def _from_origins(manifest: Manifest, split: str, table: np.ndarray, examples_per_record: np.ndarray) -> Provenance:
    files = manifest.split(split).source_files
    assert files is not None  # a format 4 manifest lists every split's source files
    if table.size and (table.min() < 0 or table[:, 0].max() >= len(files)):
        row = int(np.flatnonzero((table < 0).any(axis=1) | (table[:, 0] >= len(files)))[0])
        raise CacheFormatError(
            f"Cache of task {manifest.task!r}, split {split!r}: provenance/origin {table[row].tolist()} names source "
            f"shard {int(table[row, 0])} of {len(files)} or a negative number; the cache is damaged.")
    source_shard = table[:, 0]
    return Provenance(
        source_shard=source_shard,
        ordinal=table[:, 1],
        source_file=np.asarray(files, dtype=object)[source_shard],
        first_document=table[:, 2],
        last_document=table[:, 2] + table[:, 3],
        examples_per_record=examples_per_record,
    )


def _seqio_style(manifest: Manifest, decoded: Mapping[str, RaggedFeature]) -> Provenance:
    source_shard = np.asarray(decoded[_SOURCE_SHARD].values, dtype=np.int64)
    names = decoded[_SOURCE_FILE].values
    first, last = decoded.get(_FIRST), decoded.get(_LAST)
    return Provenance(
        source_shard=source_shard,
        ordinal=np.asarray(decoded[_ORDINAL].values, dtype=np.int64),
        source_file=_strings(names),
        first_document=None if first is None else np.asarray(first.values, dtype=np.int64),
        last_document=None if last is None else np.asarray(last.values, dtype=np.int64),
        examples_per_record=np.diff(decoded[_SOURCE_SHARD].row_splits),
    )


def _strings(names: Sequence[bytes] | np.ndarray) -> np.ndarray:
    out = np.empty(len(names), dtype=object)
    out[:] = [name.decode() for name in names]
    return out
