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
import concurrent.futures
import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from taskdata import fs

__all__ = ["FetchOptions", "PendingRanges", "RangeFetcher", "RangeReadError", "coalesce"]

# Errors that say the file itself is wrong (missing, unreadable): asking again cannot help.
_FINAL = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


class RangeReadError(OSError):
    """A ranged read that failed every time it was tried."""


@dataclasses.dataclass(frozen=True)
class FetchOptions:
    """How a ``RangeFetcher`` reads.

    Args:
      max_in_flight: requests in flight at most, over every file and caller of one fetcher.
      max_gap: ranges of one file at most this many bytes apart are read by one request.
      timeout: seconds after which a request is cancelled and tried again (async filesystems).
      attempts: tries of a request before its error is raised.
      first_backoff: seconds of pause before the second try; each later pause doubles, up to 5 s.
    """

    max_in_flight: int = 64
    max_gap: int = 64 << 10
    timeout: float = 30.0
    attempts: int = 5
    first_backoff: float = 0.05

    def __post_init__(self) -> None:
        for name, least in (("max_in_flight", 1), ("max_gap", 0), ("attempts", 1)):
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


def coalesce(begins: np.ndarray, sizes: np.ndarray, max_gap: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The requests that read the ranges ``[begins[i], begins[i] + sizes[i])`` (in increasing order, not
    overlapping): ``(starts, ends, first)``, where request ``r`` reads ``[starts[r], ends[r])`` and holds
    ranges ``first[r]`` up to ``first[r + 1]`` (the last up to the end)."""
    begins = np.asarray(begins, np.int64)
    ends = begins + np.asarray(sizes, np.int64)
    if not len(begins):
        return begins, ends, np.zeros(0, np.int64)
    if np.any(begins[1:] < ends[:-1]):
        raise ValueError("coalesce takes ranges in increasing order that do not overlap.")
    first = np.flatnonzero(np.concatenate(([True], begins[1:] - ends[:-1] > max_gap)))
    last = np.append(first[1:], len(begins)) - 1
    return begins[first], ends[last], first


class PendingRanges:
    """The reads of one file's ranges, started; ``result`` waits for them."""

    def __init__(self, path: str, begins: np.ndarray, sizes: np.ndarray, starts: np.ndarray, first: np.ndarray,
                 futures: Sequence[concurrent.futures.Future[bytes]]):
        self.path = path
        self._begins = begins
        self._sizes = sizes
        self._starts = starts
        self._first = first
        self._futures = futures
        self.nbytes = int(sizes.sum())

    def result(self) -> tuple[bytes, int | None]:
        """The ranges one after another in one buffer, and None; or, where the file ends early, the whole
        ranges before its end (and what the file holds of the first one it cuts), and the file's size."""
        if len(self._begins) == 1:  # one range, one request: its bytes as they came
            data = self._futures[0].result()
            if len(data) >= self.nbytes:
                return data[: self.nbytes] if len(data) > self.nbytes else data, None
            return data, fs.size(self.path)
        parts: list[memoryview] = []
        bounds = np.append(self._first, len(self._begins)).tolist()
        for r, future in enumerate(self._futures):
            view = memoryview(future.result())
            start = int(self._starts[r])
            for i in range(bounds[r], bounds[r + 1]):
                offset, size = int(self._begins[i]) - start, int(self._sizes[i])
                parts.append(view[offset : offset + size])
                if len(parts[-1]) < size:
                    return b"".join(parts), fs.size(self.path)
        return b"".join(parts), None

    def cancel(self) -> None:
        """Drops the reads that have not started (a reader that stops early)."""
        for future in self._futures:
            future.cancel()


class RangeFetcher:
    """Starts ranged reads of remote files, at most ``options.max_in_flight`` requests at once.

    Thread-safe: any thread may start reads and wait for them.
    """

    def __init__(self, options: FetchOptions | None = None):
        self.options = options or FetchOptions()
        self._semaphores: dict[int, asyncio.Semaphore] = {}  # per event loop, used only on that loop
        self._threads: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def start(self, path: str, begins: Sequence[int] | np.ndarray, sizes: Sequence[int] | np.ndarray) -> PendingRanges:
        """Starts reading ``[begins[i], begins[i] + sizes[i])`` of the remote file ``path`` (ranges in
        increasing order, not overlapping)."""
        if not fs.is_remote(path):
            raise ValueError(f"RangeFetcher reads remote files; {path!r} is local (read it with pread).")
        begin_array, size_array = np.asarray(begins, np.int64), np.asarray(sizes, np.int64)
        starts, ends, first = coalesce(begin_array, size_array, self.options.max_gap)
        filesystem, inner = fs.filesystem(path)
        get = self._starter(filesystem, inner)
        futures = [get(int(a), int(b)) for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]
        return PendingRanges(path, begin_array, size_array, starts, first, futures)

    def _starter(self, filesystem: Any, inner: str) -> Callable[[int, int], concurrent.futures.Future[bytes]]:
        if getattr(filesystem, "async_impl", False):
            loop = filesystem.loop
            return lambda a, b: asyncio.run_coroutine_threadsafe(self._get_async(filesystem, inner, a, b), loop)
        with self._lock:
            if self._threads is None:
                self._threads = concurrent.futures.ThreadPoolExecutor(
                    self.options.max_in_flight, thread_name_prefix="taskdata-ranges")
            threads = self._threads
        return lambda a, b: threads.submit(self._get_sync, filesystem, inner, a, b)

    async def _get_async(self, filesystem: Any, inner: str, start: int, end: int) -> bytes:
        loop_id = id(asyncio.get_running_loop())
        semaphore = self._semaphores.get(loop_id)
        if semaphore is None:
            semaphore = self._semaphores[loop_id] = asyncio.Semaphore(self.options.max_in_flight)
        errors: list[BaseException] = []
        for attempt in range(1, self.options.attempts + 1):
            async with semaphore:
                try:
                    return bytes(await asyncio.wait_for(
                        filesystem._cat_file(inner, start=start, end=end), self.options.timeout))
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
            if self._threads is not None:
                self._threads.shutdown(wait=False, cancel_futures=True)
                self._threads = None
