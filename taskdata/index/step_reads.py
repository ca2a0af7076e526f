"""The reads of one step for one host slice: a frozen, column-based value that checks itself.

A host slice is a contiguous range of a step's positions (one data shard, or several consecutive
ones). Its reads are, per task of the run, its extents (consecutive records of one cache shard, one
ranged read each), as int64 columns (``READ_COLUMNS``): read ``i`` is records ``[first_record[i],
first_record[i] + count[i])`` of shard ``shard[i]``, ``byte_length[i]`` bytes at ``byte_offset[i]`` of
its file. A
task's examples are its reads' records, consumed in order; ``order`` says, example by example, which
task the next one comes from.

``taskdata.index.host_slices`` computes these values, ``taskdata.index.step_json`` writes and reads
them as ``/shards`` JSON; the server and every client source hold this one value.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Sequence

import numpy as np

__all__ = ["READ_COLUMNS", "CacheFiles", "ReadsError", "StepReads", "TaskReads"]

# The columns of a task's reads, in the order of ``TaskReads.columns``'s rows and of the JSON keys.
READ_COLUMNS = ("shard", "first_record", "count", "byte_offset", "byte_length")
# The smallest value each column may hold: a framed TFRecord record takes at least 16 bytes.
_MINIMUM = np.array([0, 0, 1, 0, 16], np.int64)
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode


class ReadsError(ValueError):
    """Read instructions that do not hold together; the message says what disagrees with what."""


def _check_int(value: object, what: str, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ReadsError(f"{what} must be an integer >= {minimum} but got {value!r}.")


def _check_str(value: object, what: str) -> None:
    if not isinstance(value, str) or not value:
        raise ReadsError(f"{what} must be a non-empty string but got {value!r}.")


def _frozen_int64(array: object, what: str, ndim: int = 1) -> np.ndarray:
    if not isinstance(array, np.ndarray) or array.dtype != np.int64 or array.ndim != ndim:
        raise ReadsError(f"{what} must be a {ndim}-D int64 numpy array but got {array!r}.")
    array.flags.writeable = False
    return array


def _ascending(shards: np.ndarray) -> bool:
    return bool(np.all(shards[1:] > shards[:-1])) and (not len(shards) or int(shards[0]) >= 0)


@dataclasses.dataclass(frozen=True, eq=False)
class CacheFiles:
    """One task's cache version as reads name it: the task, the version folder and shard files by index.

    ``uris[i]`` is the file of shard ``shards[i]``; ``shards`` ascend. A computed value names every shard
    of the version (``of``: shard ``s`` at ``s``); one decoded from an answer names the shards it lists.
    Each file's JSON object is encoded once, on first use (``files_json``). Compares by identity.
    """

    task: str
    version: str
    shards: np.ndarray
    uris: tuple[str, ...]

    def __post_init__(self) -> None:
        _check_str(self.task, "Task name")
        _check_str(self.version, f"Cache version of task {self.task!r}")
        _frozen_int64(self.shards, f"Shards of task {self.task!r}")
        if not isinstance(self.uris, tuple) or len(self.uris) != len(self.shards):
            raise ReadsError(
                f"Task {self.task!r}: {len(self.shards)} shards need as many URIs in a tuple, got {self.uris!r}."
            )
        if not _ascending(self.shards):
            raise ReadsError(
                f"Task {self.task!r}: file shards must ascend from 0 up, each once, but are {self.shards.tolist()}."
            )
        for shard, uri in zip(self.shards.tolist(), self.uris, strict=True):
            _check_str(uri, f"URI of shard {shard} of task {self.task!r}")

    @classmethod
    def of(cls, task: str, version: str, shard_uris: Sequence[str]) -> CacheFiles:
        """Every shard of a cache version: shard ``s``'s file is ``shard_uris[s]``."""
        return cls(task, version, np.arange(len(shard_uris), dtype=np.int64), tuple(shard_uris))

    @functools.cached_property
    def _dense(self) -> bool:
        return not len(self.shards) or int(self.shards[-1]) == len(self.shards) - 1

    def rows(self, shards: np.ndarray) -> np.ndarray:
        """Where ``shards`` are in ``uris``; ReadsError if this table does not name one of them."""
        rows = self._rows(shards)
        known = (rows >= 0) & (rows < len(self.shards))
        known[known] = self.shards[rows[known]] == shards[known]
        if not known.all():
            raise ReadsError(
                f"Task {self.task!r}: no file is given for shards {shards[~known].tolist()[:8]} (files name "
                f"shards {self.shards.tolist()[:8]}{'...' if len(self.shards) > 8 else ''})."
            )
        return rows

    def _rows(self, shards: np.ndarray) -> np.ndarray:
        """``rows`` of shards this table names (unchecked: a ``TaskReads``' files are checked when it is made)."""
        return shards if self._dense else np.searchsorted(self.shards, shards)

    def uri(self, shard: int) -> str:
        return self.uris[int(self.rows(np.array([shard], np.int64))[0])]

    @functools.cached_property
    def task_json(self) -> bytes:
        return _dumps(self.task).encode()

    @functools.cached_property
    def version_json(self) -> bytes:
        return _dumps(self.version).encode()

    @functools.cached_property
    def file_rows(self) -> np.ndarray:
        """Row ``i``: the JSON object of ``shards[i]``'s file and a comma (encoded on first use)."""
        # Row i: the JSON object {"shard": s, "uri": ...} of shards[i] and a comma, NUL-padded to a fixed
        # width. One gather copies the rows of any shards; with 65,536 shards that is ~5x faster than
        # joining 65,536 separate strings, whose scattered objects each cost a cache miss.
        rows = [
            _dumps({"shard": s, "uri": u}).encode() + b","
            for s, u in zip(self.shards.tolist(), self.uris, strict=True)
        ]
        return np.array(rows, dtype=bytes)

    @functools.cached_property
    def names_json(self) -> bytes:
        """The JSON object ``{"prefix", "digits", "suffix"}`` that names every file of this table: shard
        ``s``'s URI is ``prefix + str(s).zfill(digits) + suffix`` (``encoding=compact`` sends this instead
        of one object per file). ReadsError if the URIs are not named so (every taskdata cache is)."""
        prefix, digits, suffix = _name_pattern(self)
        return _dumps({"prefix": prefix, "digits": digits, "suffix": suffix}).encode()

    @classmethod
    def named(cls, task: str, version: str, shards: np.ndarray, prefix: str, digits: int, suffix: str) -> CacheFiles:
        """The files of ``shards`` (ascending) named as ``names_json`` says."""
        _check_int(digits, f"Digits of task {task!r}'s file names", 1)
        if not isinstance(prefix, str) or not isinstance(suffix, str) or not prefix:
            raise ReadsError(f"Task {task!r}: a file name prefix and suffix are strings (the prefix non-empty), "
                             f"not {prefix!r} and {suffix!r}.")
        return cls(task, version, shards, tuple(f"{prefix}{s:0{digits}d}{suffix}" for s in shards.tolist()))

    def files_json(self, shards: np.ndarray) -> bytes:
        """The JSON objects of ``shards``' files, comma-separated (the text inside ``[...]``), as ASCII.

        ``shards`` must be named by this table, as a ``TaskReads``' files are (the server writes each
        answer's files with this, so they are not checked again here).
        """
        return self.files_json_view(shards).tobytes()

    def files_json_view(self, shards: np.ndarray) -> memoryview:
        """``files_json(shards)`` as a memoryview: the server joins it into an answer as it is, without the
        copy that cutting the last comma off a ``bytes`` takes (31 KB of files in a base64 answer of 65,536
        shards)."""
        # JSON text here is ASCII (ensure_ascii) and holds no NUL byte: dropping NULs drops the padding.
        return memoryview(self.file_rows[self._rows(shards)].tobytes().replace(b"\0", b""))[:-1]


def _name_pattern(files: CacheFiles) -> tuple[str, int, str]:
    """``(prefix, digits, suffix)`` with every URI ``prefix + str(shard).zfill(digits) + suffix``."""
    if not files._dense or not len(files.uris):
        raise ReadsError(f"Task {files.task!r}: only a table of every shard of a cache names its files by a pattern.")
    first = files.uris[0]
    # The number of shard 0 is zeros only: try each such stretch from the right (the shard count comes after it).
    end = len(first)
    while (end := first.rfind("0", 0, end)) >= 0:
        start = end
        while start > 0 and first[start - 1] == "0":
            start -= 1
        prefix, digits, suffix = first[:start], end + 1 - start, first[end + 1 :]
        if prefix and all(u == f"{prefix}{s:0{digits}d}{suffix}" for s, u in enumerate(files.uris)):
            return prefix, digits, suffix
        end = start
    raise ReadsError(
        f"Task {files.task!r}: the files of cache version {files.version!r} are not named prefix + zero-padded "
        f"shard number + suffix ({first!r}, ...), which encoding=compact needs; ask for encoding=base64."
    )


@dataclasses.dataclass(frozen=True, eq=False)
class TaskReads:
    """One task's reads of a step: ``columns[k]`` is column ``READ_COLUMNS[k]``, one entry per read.

    ``files`` are the shards the reads touch, ascending, each once; ``cache`` names their files.
    """

    cache: CacheFiles
    files: np.ndarray
    columns: np.ndarray

    def __post_init__(self) -> None:
        if not isinstance(self.cache, CacheFiles):
            raise ReadsError(f"TaskReads.cache must be a CacheFiles but got {self.cache!r}.")
        task = self.task
        _frozen_int64(self.files, f"Files of task {task!r}")
        _frozen_int64(self.columns, f"Read columns of task {task!r}", ndim=2)
        if self.columns.shape[0] != len(READ_COLUMNS):
            raise ReadsError(
                f"Task {task!r}: read columns must be {len(READ_COLUMNS)} rows {READ_COLUMNS} but got "
                f"{self.columns.shape[0]}."
            )
        if self.columns.shape[1]:
            low = self.columns.min(axis=1)
            for name, value, minimum in zip(READ_COLUMNS, low.tolist(), _MINIMUM.tolist(), strict=True):
                if value < minimum:
                    raise ReadsError(
                        f"Task {task!r}: read column {name} holds {value}, below its minimum {minimum}."
                    )
        read = np.unique(self.columns[0])
        if not _ascending(self.files) or not np.array_equal(self.files, read):
            raise ReadsError(
                f"Task {task!r}: files name shards {self.files.tolist()} but the reads are of shards {read.tolist()}."
            )
        self.cache.rows(self.files)  # every file is named

    @property
    def task(self) -> str:
        return self.cache.task

    @property
    def version(self) -> str:
        return self.cache.version

    @property
    def shard(self) -> np.ndarray:
        return self.columns[0]

    @property
    def first_record(self) -> np.ndarray:
        return self.columns[1]

    @property
    def count(self) -> np.ndarray:
        return self.columns[2]

    @property
    def byte_offset(self) -> np.ndarray:
        return self.columns[3]

    @property
    def byte_length(self) -> np.ndarray:
        return self.columns[4]

    def __len__(self) -> int:
        """Number of reads."""
        return self.columns.shape[1]

    @property
    def num_examples(self) -> int:
        return int(self.count.sum())

    @property
    def file_uris(self) -> tuple[str, ...]:
        """The URI of each of ``files``."""
        return tuple(self.cache.uris[i] for i in self.cache._rows(self.files).tolist())

    def records(self) -> tuple[np.ndarray, np.ndarray]:
        """(shard, record) of each of this task's examples, in the order they are consumed."""
        counts = self.count
        shards = np.repeat(self.shard, counts)
        # Record k of read i is first_record[i] + k: a running index minus each read's start in it.
        starts = np.cumsum(counts) - counts
        records = np.arange(len(shards), dtype=np.int64) + np.repeat(self.first_record - starts, counts)
        return shards, records

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TaskReads):
            return NotImplemented
        return (
            (self.task, self.version) == (other.task, other.version)
            and np.array_equal(self.files, other.files)
            and self.file_uris == other.file_uris
            and np.array_equal(self.columns, other.columns)
        )

    # Unhashable, as __eq__ compares arrays; typeshed types object.__hash__ as a method, not Optional.
    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"TaskReads(task={self.task!r}, version={self.version!r}, reads={len(self)}, files={self.files.tolist()})"


@dataclasses.dataclass(frozen=True, eq=False)
class StepReads:
    """What one host slice reads at ``step``: one ``TaskReads`` per task of the run, in the run's order.

    ``positions`` are the stream positions the slice covers (kept for a skipped step, which reads
    nothing); ``order[i]`` is the index into ``tasks`` that example ``i`` of the slice comes from.
    """

    step: int
    skipped: bool
    global_batch_size: int
    positions: range
    tasks: tuple[TaskReads, ...]
    order: np.ndarray

    def __post_init__(self) -> None:
        _check_int(self.step, "Step", 0)
        _check_int(self.global_batch_size, f"Step {self.step}: global batch size", 1)
        if not isinstance(self.skipped, bool):
            raise ReadsError(f"Step {self.step}: skipped must be a bool but got {self.skipped!r}.")
        positions = self.positions
        if not isinstance(positions, range) or positions.step != 1 or positions.start < 0:
            raise ReadsError(
                f"Step {self.step}: positions must be a range of step 1 from 0 up, not {positions!r}."
            )
        if not isinstance(self.tasks, tuple) or not all(isinstance(t, TaskReads) for t in self.tasks):
            raise ReadsError(f"Step {self.step}: tasks must be a tuple of TaskReads but got {self.tasks!r}.")
        names = [t.task for t in self.tasks]
        if len(set(names)) != len(names):
            raise ReadsError(f"Step {self.step}: tasks {names} name a task twice.")
        order = _frozen_int64(self.order, f"Step {self.step}: order")
        expected = 0 if self.skipped else len(positions)
        if len(order) != expected:
            raise ReadsError(
                f"Step {self.step}: {len(order)} examples in the order but the host covers {len(positions)} "
                f"positions{' of a skipped step (which reads none)' if self.skipped else ''}."
            )
        if len(order) and not 0 <= int(order.min()) <= int(order.max()) < len(self.tasks):
            bad = int(order[(order < 0) | (order >= len(self.tasks))][0])
            raise ReadsError(
                f"Step {self.step}: order names task index {bad} but the step has {len(self.tasks)} tasks."
            )
        taken = np.bincount(order, minlength=len(self.tasks)).tolist()
        for task, count in zip(self.tasks, taken, strict=True):
            if task.num_examples != count:
                raise ReadsError(
                    f"Step {self.step}: task {task.task!r} has reads for {task.num_examples} records but the "
                    f"order takes {count} examples from it."
                )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StepReads):
            return NotImplemented
        return (
            (self.step, self.skipped, self.global_batch_size, self.positions, self.tasks)
            == (other.step, other.skipped, other.global_batch_size, other.positions, other.tasks)
        ) and np.array_equal(self.order, other.order)

    # Unhashable, as __eq__ compares arrays; typeshed types object.__hash__ as a method, not Optional.
    __hash__ = None  # type: ignore[assignment]


def assemble(
    step: int,
    skipped: bool,
    global_batch_size: int,
    positions: range,
    tasks: Sequence[tuple[CacheFiles, np.ndarray, np.ndarray]],
    order: np.ndarray,
) -> StepReads:
    """A ``StepReads`` of the index math's own making, built without its checks.

    The host slices the index math cuts are correct by construction (tests check every kind of plan
    against the checks and against ``assign``); checking them again would cost about twice what writing
    the server's answer does (~85 us against ~35-50 us for a host of 256 examples: a dozen numpy calls
    per task). Its arrays must be read-only already.
    """
    built = []
    for cache, files, columns in tasks:
        value = object.__new__(TaskReads)
        value.__dict__.update(cache=cache, files=files, columns=columns)
        built.append(value)
    out = object.__new__(StepReads)
    out.__dict__.update(
        step=step,
        skipped=skipped,
        global_batch_size=global_batch_size,
        positions=positions,
        tasks=tuple(built),
        order=order,
    )
    return out
