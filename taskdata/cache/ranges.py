"""Ranged reads of remote files kept in flight: many requests at once, never more than a bound.

A ranged GET from an object store costs a round trip (tens of milliseconds) whatever its size, and
thousands may be in flight. ``RangeFetcher.start`` issues the reads of one file's byte ranges at once
and returns at once; ``PendingRanges.result`` waits for them. The caller keeps as many started as it
likes (the trainer client: the steps of its read-ahead), and the fetcher keeps at most
``FetchOptions.max_in_flight`` requests in flight among all of them, the others queued in the order
they were started.

- Ranges of one file closer than ``max_gap`` bytes are read by one request (coalesced); the bytes
  between them are read and dropped, so a request reads at most ``max_gap`` bytes per range beyond
  what was asked.
- ``start`` may be told the ranges of the same file that later calls will ask for (``later``: the
  trainer client passes those of the steps it knows the instructions of). A request is then extended
  over the later ranges that chain onto the ranges asked now (each within ``max_gap`` of the next, up
  to ``max_request_bytes`` from its start), and the later calls find their bytes in it instead of
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
  the whole ranges before its end and the file's size, for the caller to name the record. (A range
  that starts past the end fails every try, e.g. with 416; only then is the file's size asked.)

Local files are not read here: ``CacheReader`` reads them with ``pread`` (microseconds; a thread's
hand-over would cost more than it hides).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from taskdata import fs

__all__ = ["FetchOptions", "PendingRanges", "RangeFetcher", "RangeReadError", "coalesce"]

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


class PendingRanges:
    """The reads of one file's ranges, started; ``result`` waits for them."""

    def __init__(self, path: str, sizes: np.ndarray, pieces: Sequence[tuple[_Segment, int]]):
        self.path = path
        self._sizes = sizes
        self._pieces = pieces  # per range: the request holding it, and where in that request it starts

    def result(self) -> tuple[bytes, int | None]:
        """The ranges one after another in one buffer, and None; or, where the file ends early, the whole
        ranges before its end (and what the file holds of the first one it cuts), and the file's size."""
        if len(self._pieces) == 1:
            segment, offset = self._pieces[0]
            data, size = segment.future.result(), int(self._sizes[0])
            if offset == 0 and len(data) == size:  # one request of exactly this range: its bytes as they came
                return data, None
            part = data[offset : offset + size]
            return part, (None if len(part) == size else fs.size(self.path))
        parts: list[memoryview] = []
        for (segment, offset), size in zip(self._pieces, self._sizes.tolist(), strict=True):
            parts.append(memoryview(segment.future.result())[offset : offset + size])
            if len(parts[-1]) < size:
                return b"".join(parts), fs.size(self.path)
        return b"".join(parts), None

    def cancel(self) -> None:
        """Drops the reads that have not started (a reader that stops early)."""
        for segment, _ in self._pieces:
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


class RangeFetcher:
    """Starts ranged reads of remote files, at most ``options.max_in_flight`` requests at once.

    Thread-safe: any thread may start reads and wait for them.
    """

    def __init__(self, options: FetchOptions | None = None):
        self.options = options or FetchOptions()
        self._semaphores: dict[int, asyncio.Semaphore] = {}  # per event loop, used only on that loop
        self._threads: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock = threading.RLock()  # RLock: a request that fails at once drops itself under it
        # Requests later calls may find their bytes in: per file, by start; all of them, least recently used first.
        self._by_file: dict[str, dict[int, _Segment]] = {}
        self._recent: collections.OrderedDict[tuple[str, int], _Segment] = collections.OrderedDict()
        self._kept_bytes = 0
        self.requests = 0  # requests made so far (each retry of one counts once)

    def start(self, path: str, begins: Sequence[int] | np.ndarray, sizes: Sequence[int] | np.ndarray,
              later: tuple[np.ndarray, np.ndarray] | None = None) -> PendingRanges:
        """Starts reading ``[begins[i], begins[i] + sizes[i])`` of the remote file ``path``; ``later`` holds
        (begins, sizes) of ranges of the same file that later calls will ask for."""
        if not fs.is_remote(path):
            raise ValueError(f"RangeFetcher reads remote files; {path!r} is local (read it with pread).")
        begin_array, size_array = np.asarray(begins, np.int64), np.asarray(sizes, np.int64)
        end_array = begin_array + size_array
        with self._lock:
            pieces: list[tuple[_Segment, int] | None] = [self._find(path, b, e) for b, e in
                                                         zip(begin_array.tolist(), end_array.tolist(), strict=True)]
            missing = [i for i, piece in enumerate(pieces) if piece is None]
            if missing:
                for segment, held in self._request(path, begin_array[missing], end_array[missing], later):
                    for i in held:
                        pieces[missing[i]] = (segment, int(begin_array[missing[i]]) - segment.start)
        assert all(piece is not None for piece in pieces)
        return PendingRanges(path, size_array, pieces)  # type: ignore[arg-type]

    def _find(self, path: str, begin: int, end: int) -> tuple[_Segment, int] | None:
        """A request of ``path`` that holds ``[begin, end)`` (marked as used now), and where in it it starts."""
        for segment in self._by_file.get(path, {}).values():
            if segment.start <= begin and end <= segment.end:
                self._recent.move_to_end((path, segment.start))
                return segment, begin - segment.start
        return None

    def _request(self, path: str, begins: np.ndarray, ends: np.ndarray,
                 later: tuple[np.ndarray, np.ndarray] | None) -> list[tuple[_Segment, list[int]]]:
        """Starts the requests that read ``[begins[i], ends[i])``, extended over the ``later`` ranges that chain
        onto them; each request with the indices of the ranges it holds."""
        options = self.options
        asked = len(begins)
        if later is not None and len(later[0]) and options.cache_bytes:  # kept nowhere, later bytes would be lost
            begins = np.concatenate((begins, later[0]))
            ends = np.concatenate((ends, later[0] + later[1]))
        starts, stops, group = coalesce(begins, ends, options.max_gap)
        filesystem, inner = fs.filesystem(path)
        spans: list[tuple[int, int]] = []
        holds: list[list[int]] = []
        for g in np.unique(group[:asked]).tolist():
            held = np.flatnonzero(group[:asked] == g)
            start = int(starts[g])
            # Extended over later ranges up to max_request_bytes, never short of the ranges asked now.
            need = int(ends[held].max())
            members = np.flatnonzero(group == g)
            fits = ends[members][ends[members] <= max(need, start + options.max_request_bytes)]
            stop = min(max(need, int(fits.max()) if len(fits) else need), int(stops[g]))
            spans.append((start, stop))
            holds.append(held.tolist())
        made = []
        for (start, stop), future, indices in zip(spans, self._launch(filesystem, inner, spans), holds, strict=True):
            segment = _Segment(path, start, stop, future)
            self.requests += 1
            self._keep(segment)
            made.append((segment, indices))
        return made

    def _keep(self, segment: _Segment) -> None:
        key = (segment.path, segment.start)
        old = self._recent.pop(key, None)
        if old is not None:
            self._kept_bytes -= old.end - old.start
        self._by_file.setdefault(segment.path, {})[segment.start] = segment
        self._recent[key] = segment
        self._kept_bytes += segment.end - segment.start
        segment.future.add_done_callback(functools.partial(self._drop_failed, segment))
        while self._kept_bytes > self.options.cache_bytes and self._recent:
            self._forget(*self._recent.popitem(last=False))

    def _forget(self, key: tuple[str, int], segment: _Segment) -> None:
        self._kept_bytes -= segment.end - segment.start
        kept = self._by_file.get(key[0], {})
        if kept.get(key[1]) is segment:
            del kept[key[1]]
            if not kept:
                del self._by_file[key[0]]

    def _drop_failed(self, segment: _Segment, future: concurrent.futures.Future[bytes]) -> None:
        """A request that failed (or was cancelled) is not found again: a later call asks anew."""
        if future.cancelled() or future.exception() is not None:
            with self._lock:
                key = (segment.path, segment.start)
                if self._recent.get(key) is segment:
                    del self._recent[key]
                    self._forget(key, segment)

    def _launch(self, filesystem: Any, inner: str, spans: list[tuple[int, int]]) -> list[concurrent.futures.Future[bytes]]:
        """Starts a request per ``(start, stop)`` of ``spans``: on fsspec's event loop for an async filesystem
        (handed over once for all of them), in the thread pool otherwise."""
        if getattr(filesystem, "async_impl", False):
            futures: list[concurrent.futures.Future[bytes]] = [concurrent.futures.Future() for _ in spans]

            def launch() -> None:
                for (start, stop), future in zip(spans, futures, strict=True):
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
        return [threads.submit(self._get_sync, filesystem, inner, start, stop) for start, stop in spans]

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
            self._by_file.clear()
            self._recent.clear()
            self._kept_bytes = 0
            if self._threads is not None:
                self._threads.shutdown(wait=False, cancel_futures=True)
                self._threads = None
