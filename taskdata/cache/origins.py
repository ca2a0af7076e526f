"""The origins sidecar: every record's ``provenance/origin`` beside its shard, so the ledger reads no record.

The ledger names each example of a step by its provenance (``taskdata.cache.provenance``), which format 4
keeps in every record. Reading 2,048 scattered records (~1.6 KB each, both CRCs checked) and decoding them
only to learn four small numbers each cost most of a step ledger; the cache job writes those numbers a
second time, beside the shard, so that the ledger takes them by record index from arrays. Layout
(little-endian)::

    b"TDORIGIN" | uint32 version (1) | uint8 widths[4] | uint64 count
        | column 0: count unsigned ints of widths[0] bytes, zero-padded to a multiple of 8 bytes
        | column 1 | column 2 | column 3 (likewise)

Column j holds number j of every record's ``provenance/origin``, in record order: source shard, ordinal,
first document, documents after the first; each in the fewest bytes (1, 2, 4 or 8) that hold its largest
value in this shard. Columns rather than rows of four int64s: a source shard index and a document count
fit a byte or two, an ordinal four, so a shard's sidecar is ~10 bytes a record instead of 32. That is what
a server keeps in memory per shard the ledger touches. The
header and the padding keep every column 8-byte aligned for zero-copy numpy views.

The manifest lists each shard's sidecar with its sha256 and byte size (``SplitManifest.origins``). The
ledger checks the sha256 when it first reads one; ``taskdata verify`` (full) hashes them all, and
``--level listing`` only checks each one's size from the listing of ``index/`` (it reads none). Packed caches have none: a row of several
examples has several origins, and the ledger refuses packed caches anyway.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterable, Iterator

import numpy as np

from taskdata.cache.provenance import ORIGIN, ORIGIN_WIDTH

__all__ = ["OriginTable", "OriginsCollector", "origins_sidecar", "read_origins"]

_MAGIC = b"TDORIGIN"
_VERSION = 1
_HEADER = struct.Struct(f"<8sI{ORIGIN_WIDTH}BQ")  # magic, version, each column's byte width, record count
_WIDTHS = (1, 2, 4, 8)
# Records decoded at once while a shard is written: bounds the copy of their bytes, amortizes the decoder.
_CHUNK = 4096


@dataclasses.dataclass(frozen=True, eq=False)
class OriginTable:
    """One shard's origins sidecar, parsed: a column of unsigned ints per ``provenance/origin`` number."""

    columns: tuple[np.ndarray, ...]

    def __len__(self) -> int:
        return len(self.columns[0])

    def rows(self, records: np.ndarray) -> np.ndarray:
        """The ``provenance/origin`` of records ``records`` of the shard, ``[len(records), 4]`` int64."""
        out = np.empty((len(records), ORIGIN_WIDTH), np.int64)
        for j, column in enumerate(self.columns):
            out[:, j] = column[records]
        return out


def origins_sidecar(rows: np.ndarray) -> bytes:
    """The sidecar of a shard whose records' ``provenance/origin`` values are ``rows`` (``[records, 4]``)."""
    rows = np.asarray(rows)
    if rows.ndim != 2 or rows.shape[1] != ORIGIN_WIDTH or (rows.size and rows.min() < 0):
        raise ValueError(f"Origins rows must be a [records, {ORIGIN_WIDTH}] array of numbers >= 0 but got shape "
                         f"{rows.shape}{' with a negative number' if rows.ndim == 2 and rows.size else ''}.")
    largest = rows.max(axis=0) if rows.size else np.zeros(ORIGIN_WIDTH, np.int64)
    widths = [next(w for w in _WIDTHS if int(m) < 1 << (8 * w)) for m in largest.tolist()]
    parts = [_HEADER.pack(_MAGIC, _VERSION, *widths, len(rows))]
    for j, width in enumerate(widths):
        column = rows[:, j].astype(f"<u{width}").tobytes()
        parts.append(column + bytes(-len(column) % 8))
    return b"".join(parts)


def read_origins(data: bytes, path: str, records: int) -> OriginTable:
    """The columns of a sidecar (read-only views of ``data``) of a shard of ``records`` records. ``path`` names
    it in errors."""
    fix = "run 'taskdata verify' on the cache and rebuild it ('taskdata cache ... --force')"
    if len(data) < _HEADER.size:
        raise ValueError(f"Origins sidecar {path} has {len(data)} bytes, fewer than its {_HEADER.size}-byte header; "
                         f"it is truncated: {fix}.")
    magic, version, *widths, count = _HEADER.unpack_from(data)
    if magic != _MAGIC or version != _VERSION or any(w not in _WIDTHS for w in widths):
        raise ValueError(f"Origins sidecar {path} is not a taskdata origins file of version {_VERSION} (magic "
                         f"{magic!r}, version {version}, column widths {widths}): {fix}.")
    sizes = [-(-records * w // 8) * 8 for w in widths]  # each column padded to a multiple of 8 bytes
    expected = _HEADER.size + sum(sizes)
    if count != records or len(data) != expected:
        raise ValueError(f"Origins sidecar {path} says {count} records in {len(data)} bytes; its shard has {records} "
                         f"records, which take {expected} bytes: {fix}.")
    columns, offset = [], _HEADER.size
    for width, size in zip(widths, sizes, strict=True):
        columns.append(np.frombuffer(data, dtype=f"<u{width}", count=records, offset=offset))
        offset += size
    return OriginTable(tuple(columns))


class OriginsCollector:
    """Collects the ``provenance/origin`` of records as they stream past on their way into a shard.

    ``collector.passed(records)`` yields the records unchanged; afterwards ``collector.rows()`` holds the
    origin of each one, decoded a chunk at a time (records of examples: exactly one origin each).
    """

    def __init__(self, shard: str):
        self._shard = shard
        self._parts: list[np.ndarray] = []
        self._count = 0

    def passed(self, records: Iterable[bytes]) -> Iterator[bytes]:
        chunk: list[bytes] = []
        for record in records:
            chunk.append(record)
            yield record
            if len(chunk) == _CHUNK:
                self._add(chunk)
                chunk = []
        if chunk:
            self._add(chunk)

    def _add(self, records: list[bytes]) -> None:
        from taskdata.example import ExampleDecodeError, decode_batch

        try:
            origin = decode_batch(records, {ORIGIN: "int64"})[ORIGIN]
        except ExampleDecodeError as error:
            raise ValueError(f"Record {self._count + error.record_index} of shard {self._shard}: {error.reason}. Every "
                             f"record the cache job writes carries its {ORIGIN} (taskdata.beam.pipeline."
                             "encode_cache_record).") from None
        counts = np.diff(origin.row_splits)
        bad = np.flatnonzero(counts != ORIGIN_WIDTH)
        if bad.size:
            raise ValueError(f"Record {self._count + int(bad[0])} of shard {self._shard} has {int(counts[bad[0]])} "
                             f"{ORIGIN} values; a record of one example has {ORIGIN_WIDTH}.")
        self._parts.append(np.asarray(origin.values, dtype=np.int64).reshape(-1, ORIGIN_WIDTH))
        self._count += len(records)

    def rows(self) -> np.ndarray:
        return np.concatenate(self._parts) if self._parts else np.zeros((0, ORIGIN_WIDTH), np.int64)
