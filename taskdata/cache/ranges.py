"""Ranged reads of remote files kept in flight: many requests at once, never more than a bound.

A ranged GET from an object store costs a round trip (tens of milliseconds) whatever its size, and
thousands may be in flight. ``RangeFetcher.start`` issues the reads of byte ranges of one file or of
many (a step of a shuffled epoch reads a few records of each of many shards: one call for all of them)
and returns at once; ``PendingRanges.result`` waits for them. The caller keeps as many started as it
likes (the trainer client: the steps of its read-ahead), and the fetcher keeps at most
``FetchOptions.max_in_flight`` requests in flight among all of them, the others queued in the order
they were started.

- Ranges of one file closer than ``max_gap`` bytes are read by one request (coalesced); the bytes
  between them are read and dropped, so a request reads at most ``max_gap`` bytes per range beyond
  what was asked. A request never spans two files.
- ``announce`` tells the fetcher the ranges later calls will ask for (the trainer client announces
  each step whose instructions it knows, and withdraws it when it starts it). A request is then extended
  over the announced ranges that chain onto the ranges asked now (each within ``max_gap`` of the next,
  up to ``max_request_bytes`` from its start), and the later calls find their bytes in it instead of
  asking again: records read in one step and the next ones are one request. What was fetched stays
  findable while the fetched bytes kept for later calls are at most ``cache_bytes`` (least recently
  used dropped first; a call whose bytes were dropped asks for them again).
- Filesystems with fsspec's async API (gcsfs for ``gs://``, s3fs for ``s3://``, HTTP) are read on
  fsspec's event loop with ``_cat_file``, the coroutine behind ``cat_file``, which fetches exactly the
  range asked (no metadata request first); other fsspec filesystems with ``cat_file`` in a pool of
  ``max_in_flight`` threads.
- A request that fails is retried, up to ``attempts`` tries with a growing pause between them, and one
  slower than ``timeout`` seconds is cancelled and retried (async filesystems; a thread cannot be
  cancelled). A file that is not there, or not readable, fails at once. Every result goes where its
  range was asked, so a retry never reorders anything and no range is ever left out: a read that
  still fails raises ``RangeReadError`` from ``result``, naming the file, the range and the error.
- A file shorter than a range asked (a truncated shard) is not an error here: ``result`` returns
  the whole ranges before the first one it cuts (and what it holds of that one) and the file's size,
  for the caller to name the record. (A range that starts past the end fails every try, e.g. with 416;
  only then is the file's size asked.)

Local files are not read here: ``CacheReader`` reads them with ``pread`` (microseconds; a thread's
hand-over would cost more than it hides).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import threading
import time
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from taskdata import fs

__all__ = ["FetchOptions", "PendingRanges", "RangeFetcher", "RangeReadError", "coalesce"]

# A range's key is (file id << _FILE_SHIFT) | byte offset, offsets below _OFFSET_LIMIT: two files' keys are
# then more than any max_gap apart, so no request ever spans two files.
_FILE_SHIFT = 40
_OFFSET_LIMIT = 1 << 39
_OFFSET_MASK = (1 << _FILE_SHIFT) - 1

# Errors that say the file itself is wrong (missing, unreadable): asking again cannot help.
_FINAL = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


class RangeReadError(RuntimeError):
    """A ranged read that failed every time it was tried: the store, not the file, failed (not an OSError,
    which commands report as a wrong file)."""


@dataclasses.dataclass(frozen=True)
class FetchOptions:
    """How a ``RangeFetcher`` reads.

    Args:
      max_in_flight: requests in flight at most, over every file and caller of one fetcher.
      max_gap: ranges of one file at most this many bytes apart are read by one request.
      max_request_bytes: a request is extended over later calls' ranges up to this many bytes (ranges
        asked now are never cut: a request holds at least them).
      cache_bytes: the most bytes of finished or running requests kept for later calls to find.
      timeout: seconds after which a request is cancelled and tried again (async filesystems).
      attempts: tries of a request before its error is raised.
      first_backoff: seconds of pause before the second try; each later pause doubles, up to 5 s.
    """

    max_in_flight: int = 64
    max_gap: int = 64 << 10
    max_request_bytes: int = 4 << 20
    cache_bytes: int = 64 << 20
    timeout: float = 30.0
    attempts: int = 5
    first_backoff: float = 0.05

    def __post_init__(self) -> None:
        for name, least in (("max_in_flight", 1), ("max_gap", 0), ("max_request_bytes", 1), ("cache_bytes", 0),
                            ("attempts", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"FetchOptions.{name} must be an integer >= {least} but got {value!r}.")
        if self.max_gap > _OFFSET_LIMIT:
            raise ValueError(f"FetchOptions.max_gap must be at most {_OFFSET_LIMIT:,} but got {self.max_gap:,}.")
        for name in ("timeout", "first_backoff"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"FetchOptions.{name} must be a positive number of seconds but got {value!r}.")

    def backoff(self, attempt: int) -> float:
        """The pause after failed try number ``attempt`` (1 for the first)."""
        return float(min(5.0, self.first_backoff * 2 ** (attempt - 1)))


def coalesce(begins: np.ndarray, ends: np.ndarray, max_gap: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The requests that read the ranges ``[begins[i], ends[i])`` (any order, overlaps allowed): ``(starts,
    stops, group)``, where request ``r`` reads ``[starts[r], stops[r])`` and range ``i`` lies in request
    ``group[i]``. Ranges at most ``max_gap`` bytes apart share a request."""
    begins = np.asarray(begins, np.int64)
    ends = np.asarray(ends, np.int64)
    if not len(begins):
        return begins, ends, np.zeros(0, np.int64)
    order = np.argsort(begins, kind="stable")
    b, e = begins[order], ends[order]
    reach = np.maximum.accumulate(e)  # the furthest byte any range so far reaches
    new = np.concatenate(([True], b[1:] - reach[:-1] > max_gap))
    first = np.flatnonzero(new)
    last = np.append(first[1:], len(b)) - 1
    group = np.empty(len(b), np.int64)
    group[order] = np.cumsum(new) - 1
    return b[first], reach[last], group


@dataclasses.dataclass(eq=False)
class _Segment:
    """One request's bytes ``[start, end)`` of a file, on their way (``future``)."""

    path: str
    start: int
    end: int
    future: concurrent.futures.Future[bytes]
    data: bytes | None = None  # once the request succeeded (read without the future's lock, by every step it holds)


class PendingRanges:
    """The reads of some files' ranges, started; ``result`` waits for them."""

    def __init__(self, paths: Sequence[str], file_index: np.ndarray, sizes: np.ndarray,
                 segments: Sequence[_Segment], held_by: np.ndarray, offsets: np.ndarray):
        self._paths = paths
        self._file_index = file_index  # per range: its file, an index into paths
        self._sizes = sizes
        self._segments = segments  # the requests that hold the ranges
        self._held_by = held_by  # per range: the request holding it (index into segments) ...
        self._offsets = offsets  # ... and where in that request it starts

    def result(self) -> tuple[bytes, int | None]:
        """The ranges one after another in one buffer, and None; or, where a file ends early, the whole
        ranges before the first range it cuts (and what the file holds of that one), and that file's size."""
        datas = [segment.future.result() if segment.data is None else segment.data for segment in self._segments]
        lengths = np.array([len(data) for data in datas], np.int64)
        cut = np.flatnonzero(self._offsets + self._sizes > lengths[self._held_by])
        last = int(cut[0]) if len(cut) else len(self._sizes) - 1
        if len(self._sizes) == 1 and self._offsets[0] == 0 and lengths[0] == self._sizes[0]:
            return datas[0], None  # one request of exactly this range: its bytes as they came
        views = [memoryview(data) for data in datas]
        parts = [views[g][o : o + n] for g, o, n in zip(self._held_by[: last + 1].tolist(),
                                                       self._offsets[: last + 1].tolist(),
                                                       self._sizes[: last + 1].tolist(), strict=True)]
        buffer = b"".join(parts)
        if not len(cut):
            return buffer, None
        return buffer, fs.size(self._paths[int(self._file_index[last])])

    def cancel(self) -> None:
        """Drops the reads that have not started (a reader that stops early)."""
        for segment in self._segments:
            segment.future.cancel()


def _settle(future: concurrent.futures.Future[bytes], task: asyncio.Task[bytes]) -> None:
    """Passes a request's outcome from its task on the event loop to the future the caller waits on."""
    with contextlib.suppress(concurrent.futures.InvalidStateError):  # the caller cancelled it meanwhile
        if task.cancelled():
            future.cancel()
        elif task.exception() is not None:
            future.set_exception(task.exception())
        else:
            future.set_result(task.result())


def _as_files(paths: str | Sequence[str], count: int, file_index: Sequence[int] | np.ndarray | None
              ) -> tuple[list[str], np.ndarray]:
    """(paths, file index per range) of ``start``'s and ``announce``'s arguments, checked."""
    files = [paths] if isinstance(paths, str) else list(paths)
    if file_index is None:
        if len(files) != 1:
            raise ValueError(f"Ranges of {len(files)} files need file_index: which file each range is of.")
        return files, np.zeros(count, np.int64)
    index = np.asarray(file_index, np.int64)
    if index.shape != (count,) or (count and (index.min() < 0 or index.max() >= len(files))):
        raise ValueError(f"file_index must give each of the {count} ranges a file in [0, {len(files)}).")
    return files, index


class RangeFetcher:
    """Starts ranged reads of remote files, at most ``options.max_in_flight`` requests at once.

    Every file's bytes live in one space of keys, ``(file id << 40) | offset`` (files up to 512 GiB), so that
    the ranges of many files are located, coalesced and extended in one pass of array operations, never
    across two files: a step of a shuffled epoch reads a few records of each of many shards.

    Thread-safe: any thread may start reads and wait for them.
    """

    def __init__(self, options: FetchOptions | None = None):
        self.options = options or FetchOptions()
        self._semaphores: dict[int, asyncio.Semaphore] = {}  # per event loop, used only on that loop
        self._threads: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock = threading.RLock()  # RLock: a request that fails at once drops itself under it
        self._file_ids: dict[str, int] = {}
        self._paths: list[str] = []
        # Requests later calls may find their bytes in, sorted by start key; when each was last used.
        self._starts = np.zeros(0, np.int64)
        self._ends = np.zeros(0, np.int64)
        self._used = np.zeros(0, np.int64)
        self._segments = np.empty(0, object)
        self._reach: tuple[np.ndarray, np.ndarray] | None = None  # _find's running maxima of the ends, when known
        self._clock = 0
        self._filesystems: dict[int, tuple[Any, str]] = {}  # per file id: its fsspec filesystem and inner path
        self._kept_bytes = 0
        # Ranges later calls will ask for, by the caller's token: (begin keys, end keys); all of them together.
        self._announced: dict[Hashable, tuple[np.ndarray, np.ndarray]] = {}
        self._later: tuple[np.ndarray, np.ndarray] | None = None
        self.requests = 0  # requests made so far (each retry of one counts once)

    def start(self, paths: str | Sequence[str], begins: Sequence[int] | np.ndarray, sizes: Sequence[int] | np.ndarray,
              file_index: Sequence[int] | np.ndarray | None = None) -> PendingRanges:
        """Starts reading ``[begins[i], begins[i] + sizes[i])`` of the remote file ``paths`` (one path), or of
        ``paths[file_index[i]]``. Requests are extended over the ranges ``announce``d for later calls."""
        begin_array, size_array = np.asarray(begins, np.int64), np.asarray(sizes, np.int64)
        files, index = _as_files(paths, len(begin_array), file_index)
        with self._lock:
            begin_keys = self._keys(files, index, begin_array)
            end_keys = begin_keys + size_array
            held_by = self._find(begin_keys, end_keys)
            found = held_by >= 0
            used = np.unique(held_by[found])
            self._clock += 1
            self._used[used] = self._clock
            segments = self._segments[used].tolist()
            which = np.zeros(len(begin_keys), np.int64)  # per range: its request, an index into segments
            which[found] = np.searchsorted(used, held_by[found])
            offsets = np.zeros(len(begin_keys), np.int64)  # per range: where in its request it starts
            offsets[found] = begin_keys[found] - self._starts[held_by[found]]
            missing = np.flatnonzero(~found)
            for segment, start_key, indices in self._request(begin_keys[missing], end_keys[missing]):
                which[missing[indices]] = len(segments)
                offsets[missing[indices]] = begin_keys[missing[indices]] - start_key
                segments.append(segment)
        return PendingRanges(files, index, size_array, segments, which, offsets)

    def announce(self, token: Hashable, paths: str | Sequence[str], begins: Sequence[int] | np.ndarray,
                 sizes: Sequence[int] | np.ndarray, file_index: Sequence[int] | np.ndarray | None = None) -> None:
        """Says that a later ``start`` will read these ranges (arguments as ``start``'s): until ``withdraw``
        (token), requests of the files may be extended over them, and that ``start`` finds them read."""
        begin_array, size_array = np.asarray(begins, np.int64), np.asarray(sizes, np.int64)
        files, index = _as_files(paths, len(begin_array), file_index)
        with self._lock:
            keys = self._keys(files, index, begin_array)
            self._announced[token] = (keys, keys + size_array)
            self._later = None

    def withdraw(self, token: Hashable | None = None) -> None:
        """Forgets the ranges announced with ``token`` (every announced range: None)."""
        with self._lock:
            if token is None:
                self._announced.clear()
            else:
                self._announced.pop(token, None)
            self._later = None

    def _keys(self, files: list[str], index: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        ids = []
        for path in files:
            found = self._file_ids.get(path)
            if found is None:
                if not fs.is_remote(path):
                    raise ValueError(f"RangeFetcher reads remote files; {path!r} is local (read it with pread).")
                found = self._file_ids[path] = len(self._paths)
                self._paths.append(path)
            ids.append(found)
        if len(offsets) and (offsets.min() < 0 or offsets.max() >= _OFFSET_LIMIT):
            raise ValueError(f"Byte offsets must lie in [0, {_OFFSET_LIMIT:,}) but got {offsets.min()}..{offsets.max()}.")
        return (np.asarray(ids, np.int64)[index] << _FILE_SHIFT) | offsets

    def _find(self, begin_keys: np.ndarray, end_keys: np.ndarray) -> np.ndarray:
        """The kept request that holds each range (its position; -1 where none does).

        Of the requests that start at or before a range, the one reaching furthest holds it if any does
        (requests may overlap: one extended over another's bytes); a request of another file never reaches
        a range's end."""
        count = len(self._starts)
        if not count:
            return np.full(len(begin_keys), -1, np.int64)
        if self._reach is None:
            furthest = np.maximum.accumulate(self._ends)
            self._reach = (furthest, np.maximum.accumulate(np.where(self._ends == furthest, np.arange(count), 0)))
        furthest, which = self._reach
        at = np.maximum(np.searchsorted(self._starts, begin_keys, side="right") - 1, 0)
        return np.where((self._starts[at] <= begin_keys) & (end_keys <= furthest[at]), which[at], -1)

    def _later_keys(self) -> tuple[np.ndarray, np.ndarray]:
        if self._later is None:
            parts = list(self._announced.values())
            self._later = (np.concatenate([b for b, _ in parts]) if parts else np.zeros(0, np.int64),
                           np.concatenate([e for _, e in parts]) if parts else np.zeros(0, np.int64))
        return self._later

    def _request(self, begins: np.ndarray, ends: np.ndarray) -> list[tuple[_Segment, int, np.ndarray]]:
        """Starts the requests that read the ranges ``[begins[i], ends[i])`` (keys), extended over the announced
        ranges that chain onto them: each request, its start key, and the indices of the ranges it holds."""
        options = self.options
        asked = len(begins)
        if not asked:
            return []
        later_begins, later_ends = self._later_keys()
        if len(later_begins) and options.cache_bytes:  # kept nowhere, later bytes would be lost
            begins = np.concatenate((begins, later_begins))
            ends = np.concatenate((ends, later_ends))
        starts, stops, group = coalesce(begins, ends, options.max_gap)
        # A request per group holding ranges asked now, extended over the later ranges of its group up to
        # max_request_bytes from its start, never short of the ranges asked now.
        asked_groups, of_asked = np.unique(group[:asked], return_inverse=True)
        need = np.zeros(len(starts), np.int64)
        np.maximum.at(need, group[:asked], ends[:asked])
        fits = ends <= np.maximum(need, starts + options.max_request_bytes)[group]
        reach = need.copy()
        np.maximum.at(reach, group[fits], ends[fits])
        stop = np.minimum(reach, stops)
        spans = list(zip(starts[asked_groups].tolist(), stop[asked_groups].tolist(), strict=True))
        by_group = np.argsort(of_asked, kind="stable")
        holds = np.split(by_group, np.cumsum(np.bincount(of_asked, minlength=len(asked_groups)))[:-1])
        by_filesystem: dict[int, tuple[Any, list[int]]] = {}
        inner_spans: list[tuple[str, int, int]] = []
        for k, (start, stop) in enumerate(spans):
            file_id = start >> _FILE_SHIFT
            found = self._filesystems.get(file_id)
            if found is None:
                found = self._filesystems[file_id] = fs.filesystem(self._paths[file_id])
            filesystem, inner = found
            by_filesystem.setdefault(id(filesystem), (filesystem, []))[1].append(k)
            inner_spans.append((inner, start & _OFFSET_MASK, stop & _OFFSET_MASK))
        futures: dict[int, concurrent.futures.Future[bytes]] = {}
        for filesystem, members_of in by_filesystem.values():
            futures.update(zip(members_of, self._launch(filesystem, [inner_spans[k] for k in members_of]), strict=True))
        made = []
        for k, ((start, stop), held) in enumerate(zip(spans, holds, strict=True)):
            segment = _Segment(self._paths[start >> _FILE_SHIFT], start & _OFFSET_MASK, stop & _OFFSET_MASK, futures[k])
            self.requests += 1
            made.append((segment, start, held))
        self._keep(np.array([start for start, _ in spans], np.int64), np.array([stop for _, stop in spans], np.int64),
                   [segment for segment, _, _ in made])
        for segment, _, _ in made:
            segment.future.add_done_callback(functools.partial(self._settled, segment))
        return made

    def _keep(self, starts: np.ndarray, stops: np.ndarray, segments: list[_Segment]) -> None:
        """Keeps requests for later calls to find (keys ``[starts[i], stops[i])``), then drops the least recently
        used ones while more than ``cache_bytes`` are kept."""
        order = np.argsort(starts, kind="stable")
        objects = np.empty(len(segments), object)
        objects[:] = segments
        at = np.searchsorted(self._starts, starts[order], side="left")
        self._clock += 1
        self._starts = np.insert(self._starts, at, starts[order])
        self._ends = np.insert(self._ends, at, stops[order])
        self._used = np.insert(self._used, at, self._clock)
        self._segments = np.insert(self._segments, at, objects[order])
        self._reach = None
        self._kept_bytes += int((stops - starts).sum())
        excess = self._kept_bytes - self.options.cache_bytes
        if excess > 0:
            oldest = np.argsort(self._used, kind="stable")
            count = int(np.searchsorted(np.cumsum((self._ends - self._starts)[oldest]), excess, side="left")) + 1
            self._forget(oldest[:count])

    def _forget(self, positions: np.ndarray) -> None:
        self._kept_bytes -= int((self._ends[positions] - self._starts[positions]).sum())
        self._starts = np.delete(self._starts, positions)
        self._ends = np.delete(self._ends, positions)
        self._used = np.delete(self._used, positions)
        self._segments = np.delete(self._segments, positions)
        self._reach = None

    def _settled(self, segment: _Segment, future: concurrent.futures.Future[bytes]) -> None:
        """Keeps a request's bytes; a request that failed (or was cancelled) is not found again: a later call
        asks anew."""
        if not future.cancelled() and future.exception() is None:
            segment.data = future.result()
        else:
            with self._lock:
                self._forget(np.flatnonzero([kept is segment for kept in self._segments.tolist()]))

    def _launch(self, filesystem: Any, spans: list[tuple[str, int, int]]) -> list[concurrent.futures.Future[bytes]]:
        """Starts a request per ``(path, start, stop)`` of ``spans``: on fsspec's event loop for an async
        filesystem (handed over once for all of them), in the thread pool otherwise."""
        if getattr(filesystem, "async_impl", False):
            futures: list[concurrent.futures.Future[bytes]] = [concurrent.futures.Future() for _ in spans]

            def launch() -> None:
                for (inner, start, stop), future in zip(spans, futures, strict=True):
                    task = loop.create_task(self._get_async(filesystem, inner, start, stop))
                    task.add_done_callback(functools.partial(_settle, future))

            loop = filesystem.loop
            loop.call_soon_threadsafe(launch)
            return futures
        with self._lock:
            if self._threads is None:
                self._threads = concurrent.futures.ThreadPoolExecutor(
                    self.options.max_in_flight, thread_name_prefix="taskdata-ranges")
            threads = self._threads
        return [threads.submit(self._get_sync, filesystem, inner, start, stop) for inner, start, stop in spans]

    async def _get_async(self, filesystem: Any, inner: str, start: int, end: int) -> bytes:
        loop_id = id(asyncio.get_running_loop())
        semaphore = self._semaphores.get(loop_id)
        if semaphore is None:
            semaphore = self._semaphores[loop_id] = asyncio.Semaphore(self.options.max_in_flight)
        errors: list[BaseException] = []
        for attempt in range(1, self.options.attempts + 1):
            async with semaphore:
                try:
                    async with asyncio.timeout(self.options.timeout):
                        return bytes(await filesystem._cat_file(inner, start=start, end=end))
                except _FINAL:
                    raise
                except Exception as error:
                    errors.append(error)
            if attempt < self.options.attempts:
                await asyncio.sleep(self.options.backoff(attempt))
        if await self._past_end_async(filesystem, inner, start):
            return b""  # the file ends before the range (a 416 every time): the caller names what is missing
        raise self._failed(inner, start, end, errors)

    @staticmethod
    async def _past_end_async(filesystem: Any, inner: str, start: int) -> bool:
        """Whether the file ends at or before ``start`` (a range there fails, e.g. with 416, every time)."""
        try:
            return int((await filesystem._info(inner))["size"]) <= start
        except Exception:
            return False

    def _get_sync(self, filesystem: Any, inner: str, start: int, end: int) -> bytes:
        errors: list[BaseException] = []
        for attempt in range(1, self.options.attempts + 1):
            try:
                return bytes(filesystem.cat_file(inner, start=start, end=end))
            except _FINAL:
                raise
            except Exception as error:
                errors.append(error)
            if attempt < self.options.attempts:
                time.sleep(self.options.backoff(attempt))
        try:
            if int(filesystem.size(inner)) <= start:
                return b""
        except Exception:
            pass
        raise self._failed(inner, start, end, errors)

    def _failed(self, inner: str, start: int, end: int, errors: list[BaseException]) -> RangeReadError:
        last = errors[-1]
        what = "timed out" if isinstance(last, TimeoutError) else f"{type(last).__name__}: {last}"
        return RangeReadError(
            f"Reading bytes {start}..{end - 1} of {inner} failed {len(errors)} times (last: {what}). The store did "
            f"not answer in time or refused; check its address, credentials and network, or allow more with "
            f"FetchOptions(attempts=..., timeout=...) (now {self.options.attempts} tries, "
            f"{self.options.timeout:g} s each)."
        )

    def close(self) -> None:
        with self._lock:
            self._starts = self._ends = self._used = np.zeros(0, np.int64)
            self._segments = np.empty(0, object)
            self._reach = None
            self._announced.clear()
            self._later = None
            self._kept_bytes = 0
            if self._threads is not None:
                self._threads.shutdown(wait=False, cancel_futures=True)
                self._threads = None
