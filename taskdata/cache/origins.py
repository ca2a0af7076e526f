"""The origins sidecar: every record's ``provenance/origin`` beside its shard, so the ledger reads no record.

The ledger names each example of a step by its provenance (``taskdata.cache.provenance``), which format 4
keeps in every record. Reading 2,048 scattered records (~1.6 KB each, both CRCs checked) and decoding them
only to learn four small numbers each cost most of a step ledger; the cache job writes those numbers a
second time, one fixed-width row per record in record order, so that the ledger takes its rows by index
from an array. Layout (little-endian)::

    b"TDORIGIN" | uint32 version (1) | uint32 width (4) | uint64 count | int64 rows[count][width]

The 24-byte header keeps the rows 8-byte aligned for a zero-copy numpy view. A row holds exactly the
record's ``provenance/origin`` values: source shard, ordinal, first document, documents after the first.
The manifest lists each shard's sidecar with its sha256 (``SplitManifest.origins``), and every
verification level checks it as it checks the offsets sidecar. Packed caches have none: a row of several
examples has several origins, and the ledger refuses packed caches anyway.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator

import numpy as np

from taskdata.cache.provenance import ORIGIN, ORIGIN_WIDTH

__all__ = ["OriginsCollector", "origins_sidecar", "read_origins"]

_MAGIC = b"TDORIGIN"
_VERSION = 1
_HEADER = struct.Struct("<8sIIQ")  # magic, version, row width, record count
# Records decoded at once while a shard is written: bounds the copy of their bytes, amortizes the decoder.
_CHUNK = 4096


def origins_sidecar(rows: np.ndarray) -> bytes:
    """The sidecar of a shard whose records' ``provenance/origin`` values are ``rows`` (``[records, 4]``)."""
    rows = np.asarray(rows)
    if rows.ndim != 2 or rows.shape[1] != ORIGIN_WIDTH or (rows.size and rows.min() < 0):
        raise ValueError(f"Origins rows must be a [records, {ORIGIN_WIDTH}] array of numbers >= 0 but got shape "
                         f"{rows.shape}{' with a negative number' if rows.ndim == 2 and rows.size else ''}.")
    return _HEADER.pack(_MAGIC, _VERSION, ORIGIN_WIDTH, len(rows)) + rows.astype("<i8").tobytes()


def read_origins(data: bytes, path: str, records: int) -> np.ndarray:
    """The ``[records, 4]`` int64 rows of a sidecar (a read-only view of ``data``). ``path`` names it in errors."""
    fix = "run 'taskdata verify' on the cache and rebuild it ('taskdata cache ... --force')"
    if len(data) < _HEADER.size:
        raise ValueError(f"Origins sidecar {path} has {len(data)} bytes, fewer than its {_HEADER.size}-byte header; "
                         f"it is truncated: {fix}.")
    magic, version, width, count = _HEADER.unpack_from(data)
    if magic != _MAGIC or version != _VERSION or width != ORIGIN_WIDTH:
        raise ValueError(f"Origins sidecar {path} is not a taskdata origins file of version {_VERSION} with "
                         f"{ORIGIN_WIDTH} numbers a row (magic {magic!r}, version {version}, width {width}): {fix}.")
    expected = _HEADER.size + 8 * ORIGIN_WIDTH * records
    if count != records or len(data) != expected:
        raise ValueError(f"Origins sidecar {path} says {count} rows in {len(data)} bytes; its shard has {records} "
                         f"records, which take {expected} bytes: {fix}.")
    return np.frombuffer(data, dtype="<i8", offset=_HEADER.size).reshape(records, ORIGIN_WIDTH)


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
        from taskdata.example import decode_batch

        origin = decode_batch(records, {ORIGIN: "int64"})[ORIGIN]
        counts = np.diff(origin.row_splits)
        bad = np.flatnonzero(counts != ORIGIN_WIDTH)
        if bad.size:
            raise ValueError(f"Record {self._count + int(bad[0])} of shard {self._shard} has {int(counts[bad[0]])} "
                             f"{ORIGIN} values; a record of one example has {ORIGIN_WIDTH}.")
        self._parts.append(np.asarray(origin.values, dtype=np.int64).reshape(-1, ORIGIN_WIDTH))
        self._count += len(records)

    def rows(self) -> np.ndarray:
        return np.concatenate(self._parts) if self._parts else np.zeros((0, ORIGIN_WIDTH), np.int64)
