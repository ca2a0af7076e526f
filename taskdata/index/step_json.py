"""The wire form of ``StepReads``: one step of a ``GET /shards`` answer, as JSON.

``to_json`` writes a step the way the assignment server answers (``server.models.StepReads`` documents
the shape), and ``from_json`` reads one back into an equal value, in any encoding. Integer columns (reads
and order) are JSON arrays (``encoding=ints``), base64 of little-endian int64 (``encoding=base64``: about
a quarter of the cost to write), or, with ``encoding=compact`` (what the trainer client asks for), base64 of
the narrowest type that holds them (``taskdata.index.columns``), and each task's files are not listed one
object per file but named once by a pattern (``CacheFiles.names_json``): an answer of 256 examples is
about a sixth of base64's bytes.

The text is put together here rather than by ``json``: every value is an int, a bool or a string
encoded once per cache version, so plain formatting yields exactly what ``json.dumps`` with compact
separators would (tests parse and compare every answer), several times faster.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import pybase64

from taskdata.index.columns import ColumnEncoding, base64_int64_bytes, column_array
from taskdata.index.host_slices import StepSlices
from taskdata.index.step_reads import READ_COLUMNS, CacheFiles, ReadsError, StepReads, TaskReads

__all__ = ["MAX_LOOKAHEAD", "StepJson", "from_json", "to_json"]

# Base64 of a buffer's bytes, as bytes (pybase64: see taskdata.index.columns).
_b64 = pybase64.b64encode

# The most steps one /shards request asks for (its lookahead window).
MAX_LOOKAHEAD = 64


def to_json(reads: StepReads, encoding: ColumnEncoding = "ints") -> bytes:
    """``reads`` as the JSON of one step of a ``/shards`` answer (compact, ASCII)."""
    compact = encoding == "compact"
    if encoding == "base64":
        write = _base64_column
    elif encoding == "ints":
        write = _int_column
    elif not compact:
        raise ValueError(f"encoding must be 'ints', 'base64' or 'compact' but got {encoding!r}.")
    positions = reads.positions
    # Pieces of bytes joined once: about half the time of formatting str and encoding it.
    parts: list[bytes | memoryview] = [
        _head(reads.step, reads.skipped, reads.global_batch_size, positions.start, positions.stop)
    ]
    for i, task in enumerate(reads.tasks):
        cache, columns = task.cache, task.columns
        parts.append(_task_head(i, cache))
        if compact:
            # The reads hold no negative value (TaskReads checks): one max per column is its bound.
            tops = columns.max(axis=1).tolist() if columns.shape[1] else [0] * len(columns)
            parts += [b',"names":', cache.names_json]
            for key, column, top in zip(_COMPACT_KEYS, columns, tops, strict=True):
                name, dtype = _compact_type(top)
                parts += [key, name, base64_int64_bytes(column) if dtype is None else _base64(column.astype(dtype))]
            parts.append(b'"}}')
            continue
        parts += [
            b',"files":[',
            cache.files_json_view(task.files),
            b'],"reads":{"shard":',
            write(columns[0]),
            b',"first_record":',
            write(columns[1]),
            b',"count":',
            write(columns[2]),
            b',"byte_offset":',
            write(columns[3]),
            b',"byte_length":',
            write(columns[4]),
            b"}}",
        ]
    if compact:  # the order holds task indices
        name, dtype = _compact_type(len(reads.tasks) - 1)
        order = base64_int64_bytes(reads.order) if dtype is None else _base64(reads.order.astype(dtype))
        parts += [b'],"order":"', name, order, b'"}']
    else:
        parts += [b'],"order":', write(reads.order), b"}"]
    return b"".join(parts)


# What comes before each read column's compact text (a JSON string): its key, and the end of the one before.
_COMPACT_KEYS = tuple(
    (b',"reads":{"%s":"' if i == 0 else b'","%s":"') % name.encode() for i, name in enumerate(READ_COLUMNS)
)


def _head(step: int, skipped: bool, global_batch_size: int, start: int, stop: int) -> bytes:
    """A step's JSON up to its first task."""
    return b'{"step":%d,"skipped":%s,"global_batch_size":%d,"positions":{"start":%d,"stop":%d},"tasks":[' % (
        step,
        b"true" if skipped else b"false",
        global_batch_size,
        start,
        stop,
    )


# A compact column's narrowest type for values in [0, top], as ``compact_column_bytes`` picks it.
_UNSIGNED = ((2**8, b"u1:", "<u1"), (2**16, b"u2:", "<u2"), (2**32, b"u4:", "<u4"))


def _compact_type(top: int) -> tuple[bytes, str | None]:
    """(type and colon, numpy dtype) of a compact column of values in [0, top]; dtype None for i8 (the
    column itself, little-endian int64). Any negative value takes i8, as in ``compact_column_bytes``."""
    if top >= 0:
        for limit, name, dtype in _UNSIGNED:
            if top < limit:
                return name, dtype
    return b"i8:", None


def _base64(values: np.ndarray) -> bytes:
    """Base64 of a contiguous array's bytes: the text of a compact column after its type."""
    return _b64(values.data)


@dataclasses.dataclass(frozen=True, eq=False)
class StepJson:
    """Each host slice of a computed step as ``to_json`` writes it: ``StepJson(slices, encoding)[i]`` is
    ``to_json(slices[i], encoding)``, byte for byte (tests compare them).

    The assignment server writes its answers from here. With ``encoding=compact`` what every slice of the
    step needs is done once, on first use: the bound of each column of every (task, slice), in one
    ``np.maximum.reduceat``, and the step's columns cast once to each narrow type some slice needs; a
    slice is then one base64 call per column (``to_json`` casts each column of each slice and takes a
    maximum per task). With ``encoding=base64`` a slice is one base64 call per column on a memoryview of
    the step's columns and its files' JSON (``CacheFiles.files_json_view``), with no ``StepReads`` cut and no
    per-column checks (``base64_int64_bytes``). ``encoding=ints`` writes ``to_json`` of the slice.
    """

    slices: StepSlices
    encoding: ColumnEncoding

    def __len__(self) -> int:
        return len(self.slices)

    def __getitem__(self, index: int) -> bytes:
        slices = self.slices
        if self.encoding == "ints" or not 0 <= index < slices.count:
            return to_json(slices[index], self.encoding)  # slices[index] names a slice that is not there
        if self.encoding == "base64":
            return self._base64_slice(index)
        types, rows, order, prefixes = self._compact()
        size, count, bounds = slices.per_slice, slices.count, slices.bounds
        first = slices.start + index * size
        parts = [_head(slices.step, slices.skipped, slices.global_batch_size, first, first + size)]
        for t, prefix in enumerate(prefixes):
            g = t * count + index
            a, b = bounds[g], bounds[g + 1]
            parts.append(prefix)
            for k, code in enumerate(types[g]):
                parts += (_KEY_TYPES[k][code], _b64(rows[code][k][a:b]))
            parts.append(b'"}}')
        taken = 0 if slices.skipped else size
        order_type, order_rows = order
        order_text = _b64(order_rows[index * taken : (index + 1) * taken])
        parts += [b'],"order":"', order_type, order_text, b'"}']
        return b"".join(parts)

    def _base64_slice(self, index: int) -> bytes:
        """``to_json(self.slices[index], "base64")``, from what ``_base64`` made for the whole step."""
        slices = self.slices
        rows, order, prefixes, (file_bounds, file_shards) = self._base64()
        size, count, bounds = slices.per_slice, slices.count, slices.bounds
        first = slices.start + index * size
        parts: list[bytes | memoryview] = [
            _head(slices.step, slices.skipped, slices.global_batch_size, first, first + size)
        ]
        for t, (prefix, cache) in enumerate(zip(prefixes, slices.files, strict=True)):
            g = t * count + index
            a, b = bounds[g], bounds[g + 1]
            parts += (prefix, cache.files_json_view(file_shards[file_bounds[g] : file_bounds[g + 1]]))
            for key, row in zip(_BASE64_KEYS, rows, strict=True):
                parts += (key, _b64(row[a:b]))
            parts.append(b'"}}')
        taken = 0 if slices.skipped else size
        parts += (b'],"order":"', _b64(order[index * taken : (index + 1) * taken]), b'"}')
        return b"".join(parts)

    def _base64(self) -> tuple[list[memoryview], memoryview, list[bytes], tuple[list[int], np.ndarray]]:
        """The step's read columns row by row and its order, as memoryviews of little-endian int64 (slicing
        one costs less than slicing an array); per task, its text before its files; the shards each group
        reads (``StepSlices.files_read``). Made on first use and kept, as ``_compact``'s."""
        made = self.__dict__.get("_made_base64")
        if made is not None:
            return made
        slices = self.slices
        columns = np.ascontiguousarray(slices.columns, "<i8")  # no copy on a little-endian machine
        order = np.ascontiguousarray(slices.order, "<i8")
        prefixes = [_task_head(t, cache) + b',"files":[' for t, cache in enumerate(slices.files)]
        made = self.__dict__["_made_base64"] = ([row.data for row in columns], order.data, prefixes, slices.files_read)
        return made

    def _compact(self) -> tuple[list[list[int]], dict[int, list[memoryview]], tuple[bytes, memoryview], list[bytes]]:
        """Per (task, slice) group, the type of each read column (an index into ``_TYPE_NAMES``); per type
        used, the step's read columns in it, row by row (memoryviews: slicing one costs less than slicing an
        array); the order's type and the order in it; per task, its text before its first column. Made on
        first use and kept (not a cached_property: Python 3.11's holds one lock for all instances while it
        computes, and the server writes steps in worker threads too; two threads may both make it, with
        equal results)."""
        made = self.__dict__.get("_made")
        if made is not None:
            return made
        slices = self.slices
        columns, bounds = slices.columns, np.array(slices.bounds, np.int64)
        # A group without reads writes empty columns, of type u1 (to_json's bound 0).
        types = np.zeros((len(bounds) - 1, len(columns)), np.int64)
        filled = (bounds[1:] > bounds[:-1]).nonzero()[0]
        if filled.size:
            # Groups hold consecutive columns: from each filled group's first column to the next one's.
            tops = np.maximum.reduceat(columns, bounds[filled], axis=1).T
            types[filled] = _TYPE_LIMITS.searchsorted(tops, side="right")
        rows = {
            code: [row.data for row in (columns if _TYPE_DTYPES[code] is None else columns.astype(_TYPE_DTYPES[code]))]
            for code in set(types.ravel().tolist())  # each type cast once, over the whole step
        }
        order_type, order_dtype = _compact_type(len(slices.files) - 1)
        order = slices.order if order_dtype is None else slices.order.astype(order_dtype)
        prefixes = [_task_head(t, cache) + b',"names":' + cache.names_json for t, cache in enumerate(slices.files)]
        made = self.__dict__["_made"] = (types.tolist(), rows, (order_type, order.data), prefixes)
        return made


# Compact types by code (``_compact_type``'s, in order): code c holds values in [0, _TYPE_LIMITS[c]), the
# last (i8) any int64; a column's code is the number of limits at or below its bound.
_TYPE_NAMES = (*(name for _, name, _ in _UNSIGNED), b"i8:")
_TYPE_DTYPES = (*(dtype for _, _, dtype in _UNSIGNED), None)
# Per read column and type code: the text before the column's base64 (its key, then its type).
_KEY_TYPES = tuple(tuple(key + name for name in _TYPE_NAMES) for key in _COMPACT_KEYS)
# What comes before each read column's base64 text (a JSON string): the end of the files, or of the column
# before, and its key.
_BASE64_KEYS = (b"]" + _COMPACT_KEYS[0], *_COMPACT_KEYS[1:])
# An array, searched with its method: np.searchsorted on a tuple converts it first (~6 us a call).
_TYPE_LIMITS = np.array([limit for limit, _, _ in _UNSIGNED], np.int64)


def _task_head(index: int, cache: CacheFiles) -> bytes:
    """The start of the answer's ``index``-th task object, up to its version (a comma before all but the first)."""
    return b'%s%s,"version":%s' % (b',{"task":' if index else b'{"task":', cache.task_json, cache.version_json)


def _int_column(values: np.ndarray) -> bytes:
    return f"[{','.join(map(str, values.tolist()))}]".encode()


def _base64_column(values: np.ndarray) -> bytes:
    return b'"' + base64_int64_bytes(values) + b'"'


def from_json(data: bytes | str | Mapping[str, Any]) -> StepReads:
    """One step of a ``/shards`` answer (its text, or the parsed object), in either encoding, checked.

    ReadsError names what does not fit: a missing or mistyped field, columns of different lengths,
    an order naming a task that is not there, counts the order does not take.
    """
    raw = json.loads(data) if isinstance(data, (bytes, str)) else data
    try:
        step = _integer(raw, "step")
        positions = raw["positions"]
        tasks = tuple(_task_from_json(task, step) for task in raw["tasks"])
        return StepReads(
            step=step,
            skipped=raw["skipped"],
            global_batch_size=raw["global_batch_size"],
            positions=range(_integer(positions, "start"), _integer(positions, "stop")),
            tasks=tasks,
            order=column_array(raw["order"]),
        )
    except ReadsError:
        raise
    except (KeyError, TypeError, ValueError) as error:
        raise ReadsError(
            f"A /shards step does not have the expected shape: {type(error).__name__}: {error}."
        ) from None


def _integer(raw: Mapping[str, Any], key: str) -> int:
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ReadsError(f"A /shards step's {key!r} must be an integer but is {value!r}.")
    return value


def _task_from_json(raw: Mapping[str, Any], step: int) -> TaskReads:
    task = raw["task"]
    keys = tuple(sorted(raw))
    if keys not in (_LISTED_KEYS, _NAMED_KEYS):
        raise ReadsError(
            f"Step {step}: a task's reads have keys {list(_LISTED_KEYS)} (encodings ints and base64) or "
            f"{list(_NAMED_KEYS)} (compact), not {list(keys)}: is this client older than the server?"
        )
    reads = raw["reads"]
    if sorted(reads) != sorted(READ_COLUMNS):
        raise ReadsError(
            f"Step {step}: the reads of task {task!r} must be columns {READ_COLUMNS}, not {sorted(reads)}."
        )
    columns = [column_array(reads[name]) for name in READ_COLUMNS]
    lengths = {name: len(column) for name, column in zip(READ_COLUMNS, columns, strict=True)}
    if len(set(lengths.values())) > 1:
        raise ReadsError(
            f"Step {step}: the read columns of task {task!r} must have one length, but have {lengths}."
        )
    if "names" in raw:  # compact: the files of the shards read, named by the cache's pattern
        names = raw["names"]
        if sorted(names) != ["digits", "prefix", "suffix"]:
            raise ReadsError(f"Step {step}: task {task!r}'s file names are prefix, digits and suffix, not {sorted(names)}.")
        shards = np.unique(columns[0])
        cache = CacheFiles.named(task, raw["version"], shards, names["prefix"], names["digits"], names["suffix"])
    else:
        files = raw["files"]
        cache = CacheFiles(
            task,
            raw["version"],
            np.array([_integer(f, "shard") for f in files], np.int64).reshape(-1),
            tuple(f["uri"] for f in files),
        )
    return TaskReads(cache, cache.shards, np.stack(columns))


_LISTED_KEYS = ("files", "reads", "task", "version")
_NAMED_KEYS = ("names", "reads", "task", "version")
