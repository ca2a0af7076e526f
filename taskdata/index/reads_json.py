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

import binascii
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from taskdata.index.columns import ColumnEncoding, base64_int64_bytes, column_array
from taskdata.index.reads import READ_COLUMNS, CacheFiles, ReadsError, StepReads, TaskReads

__all__ = ["MAX_LOOKAHEAD", "from_json", "to_json"]

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
    parts = [
        b'{"step":%d,"skipped":%s,"global_batch_size":%d,"positions":{"start":%d,"stop":%d},"tasks":['
        % (
            reads.step,
            b"true" if reads.skipped else b"false",
            reads.global_batch_size,
            positions.start,
            positions.stop,
        )
    ]
    for i, task in enumerate(reads.tasks):
        cache, columns = task.cache, task.columns
        parts += [
            b',{"task":' if i else b'{"task":',
            cache.task_json,
            b',"version":',
            cache.version_json,
        ]
        if compact:
            # The reads hold no negative value (TaskReads checks): one max per column is its bound.
            tops = columns.max(axis=1).tolist() if columns.shape[1] else [0] * len(columns)
            parts += [b',"names":', cache.names_json]
            for key, column, top in zip(_COMPACT_KEYS, columns, tops, strict=True):
                parts += [key, *_compact_pieces(column, top)]
            parts.append(b'"}}')
            continue
        parts += [
            b',"files":[',
            cache.files_json(task.files),
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
        parts += [b'],"order":"', *_compact_pieces(reads.order, len(reads.tasks) - 1), b'"}']
    else:
        parts += [b'],"order":', write(reads.order), b"}"]
    return b"".join(parts)


# What comes before each read column's compact text (a JSON string): its key, and the end of the one before.
_COMPACT_KEYS = tuple(
    (b',"reads":{"%s":"' if i == 0 else b'","%s":"') % name.encode() for i, name in enumerate(READ_COLUMNS)
)


def _compact_pieces(values: np.ndarray, top: int) -> tuple[bytes, bytes]:
    """``compact_column_bytes(values, top)`` in two pieces, type and base64, for values in [0, top]:
    the same text with about half of its Python work (to_json writes 16 columns per answer)."""
    if top < 0:
        return b"i8:", base64_int64_bytes(values)
    if top < 256:
        return b"u1:", binascii.b2a_base64(values.astype("<u1").data, newline=False)
    if top < 65536:
        return b"u2:", binascii.b2a_base64(values.astype("<u2").data, newline=False)
    if top < 2**32:
        return b"u4:", binascii.b2a_base64(values.astype("<u4").data, newline=False)
    return b"i8:", base64_int64_bytes(values)


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
