"""Worker processes that read whole host batches: the read path on more than one core.

``ReadWorkers`` starts ``count`` processes (running this module's ``main``), each with its own
``BatchReader`` over the same run. Step ``k`` of a session goes to worker ``k mod count`` and its
batch comes back from that worker, so batches are delivered in step order and are byte for byte the
ones one in-process reader gives (``BatchReader.read`` is a function of the step's instructions).

Nothing is pickled: a worker gets its run as the plan's JSON, each step as the ``/shards`` wire JSON
of its instructions (``taskdata.index.to_json``), over a pair of pipes of its own (its stdout stays
free for logs). Over a local source (``LocalSteps``: the cache version folders and the host's slice)
a worker gets only step numbers (``PlannedStep``) and computes each step's instructions itself with the
index math ``LocalAssignments`` runs, so that neither the iterator's process nor the worker spends
its time on the instructions' JSON. A worker reading from an object store starts the reads of every
step it has been sent before it finishes the oldest (``BatchReader.start``), so that their requests
are in flight together. It decodes each batch's int32 arrays straight into one of its
``2 * SLOTS_PER_WORKER`` slot files shared with the iterator (anonymous memory files, ``memfd``, where the
system has them; unlinked temporary files elsewhere), the one the request names, and answers with a
fixed binary header (the feature layout only when it changes). The iterator hands the batch out as
views of the slot, no copy at all, and sends no step into a slot while anything still references the
batch handed out of it (``_Slot.held``); where the caller holds ``SLOTS_PER_WORKER`` such batches of a
worker, a batch is copied out instead, so that a slot is always free. A worker ends when its request pipe
closes, so it cannot outlive the process that started it (nor can its slots: nothing names them but
the two processes' descriptors); ``close`` also waits for each one to exit (and kills it after a
timeout).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import dataclasses
import functools
import io
import json
import mmap
import os
import queue
import select
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from typing import IO, Any

import numpy as np

from taskdata import fs
from taskdata.cache.format import CacheFormatError
from taskdata.cache.ranges import FetchOptions
from taskdata.cache.tfrecord import CorruptRecordError
from taskdata.index import RunPlan, StepReads, from_json, to_json
from trainer_client.assignments import AssignmentError, HostSlice, RunInfo
from trainer_client.local_source import LocalAssignments
from trainer_client.reading import BatchReader, ClientBatch, PendingBatch

__all__ = ["SLOTS_PER_WORKER", "LocalSteps", "PlannedStep", "ReadWorkerError", "ReadWorkers", "keep_batch_memory"]

_LENGTH = struct.Struct("<Q")
# A worker's reply: a fixed header (step, slot, bytes of the body that follows) read in one system call, so
# that a batch costs no JSON on either side. Its slot is where the batch is, or one of these codes.
_REPLY = struct.Struct("<qqq")
_READY, _ERROR = -1, -2
# What a worker sets glibc's malloc to (as MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ would): keep
# the memory of a batch for the next one instead of returning it to the system and faulting it in again
# (each batch allocates and frees megabytes: ~20% of a worker's CPU under load).
MMAP_THRESHOLD, TRIM_THRESHOLD = 16 << 20, 128 << 20
# Errors a worker reports by name and that are raised again, with that type and message, in the train
# loop (a subclass as the first of these it is an instance of; CorruptRecordError with all its fields).
_ERRORS: dict[str, type[Exception]] = {
    "AssignmentError": AssignmentError,
    "CacheFormatError": CacheFormatError,
    "IndexError": IndexError,
    "ValueError": ValueError,
}


class ReadWorkerError(RuntimeError):
    """A read worker failed in a way that is not an error of the data (it exited, or broke the protocol)."""


@dataclasses.dataclass(frozen=True)
class LocalSteps:
    """What a worker needs to compute its steps' instructions itself: the run's cache version folders
    (task -> folder, as ``LocalAssignments`` takes them) and the slice of every batch this host reads."""

    version_dirs: Mapping[str, str]
    host_slice: HostSlice

    def __post_init__(self) -> None:
        if not isinstance(self.host_slice, HostSlice):
            raise TypeError(f"LocalSteps.host_slice must be a HostSlice but got {self.host_slice!r}.")
        bad = {task: path for task, path in self.version_dirs.items() if not isinstance(path, str) or not path}
        if bad or not self.version_dirs:
            raise ValueError(
                f"LocalSteps.version_dirs must map each task to its cache version folder but got "
                f"{dict(self.version_dirs)!r}; pass LocalAssignments.version_dirs."
            )


@dataclasses.dataclass(frozen=True)
class PlannedStep:
    """A step a worker with ``LocalSteps`` reads: its number, and what the batch says about it without its
    instructions (this host's ``positions`` of a global batch of ``global_batch_size``)."""

    step: int
    global_batch_size: int
    positions: range

    def __post_init__(self) -> None:
        if isinstance(self.step, bool) or not isinstance(self.step, int) or self.step < 0:
            raise ValueError(f"PlannedStep.step must be an integer >= 0 but got {self.step!r}.")
        if not isinstance(self.positions, range) or len(self.positions) > self.global_batch_size:
            raise ValueError(
                f"PlannedStep.positions must be a range within a global batch of {self.global_batch_size} but got "
                f"{self.positions!r}."
            )


def _send(out: IO[bytes], message: bytes) -> None:
    """One message: its length, then its bytes."""
    out.write(_LENGTH.pack(len(message)))
    out.write(message)
    out.flush()


def _receive_exactly(source: io.BufferedReader | io.FileIO, target: memoryview, what: str) -> None:
    got = 0
    while got < len(target):
        more = source.readinto(target[got:])
        if not more:
            raise EOFError(f"the pipe closed {len(target) - got} bytes before the end of {what}")
        got += more


def _receive_message(source: io.BufferedReader | io.FileIO, what: str) -> bytes:
    header = bytearray(_LENGTH.size)
    _receive_exactly(source, memoryview(header), what)
    body = bytearray(_LENGTH.unpack(header)[0])
    _receive_exactly(source, memoryview(body), what)
    return bytes(body)


def _widen(pipe: int) -> None:
    """Makes a pipe hold 1 MiB (Linux's default limit for unprivileged processes; elsewhere a no-op), so
    that the setup (a plan's JSON) is written before the worker has started reading."""
    try:
        import fcntl

        fcntl.fcntl(pipe, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    except (ImportError, OSError):
        pass


# A worker's steps in flight at most, each with a slot of its own (``ReadWorkers``' callers send up to this
# many per worker): with more, a worker reads further ahead of a caller whose steps come unevenly.
SLOTS_PER_WORKER = 4
# Slot files per worker: those of the steps in flight, and as many more for batches handed out as views of
# their slot (``ReadWorkers.receive``) that something still references. A batch that finds that many
# views held is copied out of its slot instead, so a slot is always free for the next step.
_SLOT_FILES = 2 * SLOTS_PER_WORKER
# A request: the slot to write the batch into, then the step (its number, or its instructions).
_REQUEST = struct.Struct("<q")


def _slot_file() -> int:
    """A file descriptor of an empty file that no name reaches: freed once every process closes it."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create("taskdata-read-worker-slot")
    with tempfile.TemporaryFile() as handle:  # unlinked at once where the system allows it
        return os.dup(handle.fileno())


class _Slot:
    """One slot file as this process maps it, remapped when the other side has grown the file."""

    def __init__(self, fd: int):
        self.fd = fd
        self.map: mmap.mmap | None = None
        self.size = os.fstat(fd).st_size  # as this process last saw or made it
        # The iterator's side: the array whose views make up the batch last handed out of this slot without
        # a copy, kept while the caller may hold it (None: nothing handed out, or nothing to track).
        self.region: np.ndarray | None = None
        self.in_flight = False  # a step sent to be written here and not received yet

    def held(self) -> bool:
        """Whether a batch handed out as views of this slot is still referenced: every array made from it
        (views of views, memoryviews, ...) references ``region``, so only ours and getrefcount's argument
        remain once the caller has dropped them all (the check cannot race: no one else can make a new one)."""
        if self.region is not None and sys.getrefcount(self.region) <= 2:
            self.region = None
        return self.region is not None

    def grow(self, size: int) -> None:
        """Makes the file at least ``size`` bytes (the worker's side: the iterator remaps it as it reads)."""
        if size > self.size:
            os.ftruncate(self.fd, size)
            self.size = size

    def view(self, size: int) -> memoryview:
        if not size:
            return memoryview(b"")  # an empty file cannot be mapped
        if self.map is None or len(self.map) < size:
            self._drop_map()
            self.map = mmap.mmap(self.fd, max(size, os.fstat(self.fd).st_size))
        return memoryview(self.map)

    def _drop_map(self) -> None:
        # Arrays handed out without a copy may still view the old map: it is then unmapped when the last of
        # them goes, and its pages stay as they were (nothing writes them again).
        if self.map is not None:
            with contextlib.suppress(BufferError):
                self.map.close()
            self.map = None

    def close(self) -> None:
        self._drop_map()
        os.close(self.fd)


class _SlotWriter:
    """Carves one batch's arrays out of a slot, one after another as the decoder asks for them (an
    ``Allocate``: ``BatchReader.read`` decodes into them), growing the file where they do not fit. A
    feature asked for again with the same shape gets the same bytes (the generic path after a refusal)."""

    def __init__(self, slot: _Slot):
        self.slot = slot
        self.placed: dict[str, tuple[int, int, int]] = {}  # name -> (byte offset, rows, length)
        self.given: dict[str, np.ndarray] = {}  # name -> the array given last
        self.end = 0

    def __call__(self, name: str, rows: int, length: int) -> np.ndarray:
        placed = self.placed.get(name)
        if placed is None or placed[1:] != (rows, length):
            placed = self.placed[name] = (self.end, rows, length)
            self.end += rows * length * 4
        offset = placed[0]
        if not rows * length:
            array = np.zeros((rows, length), np.int32)  # nothing to place (an empty file cannot be mapped)
        else:
            self.slot.grow(offset + rows * length * 4)
            view = self.slot.view(offset + rows * length * 4)
            array = np.frombuffer(view, np.int32, rows * length, offset).reshape(rows, length)
        self.given[name] = array
        return array

    def layout(self, features: Mapping[str, np.ndarray]) -> list[list[Any]]:
        """[name, byte offset, rows, length] of each feature of a batch, in its order, with any array that
        is not already where the writer put it (a skipped step has none) copied there."""
        layout = []
        for name, array in features.items():
            if array is not self.given.get(name):
                self(name, *array.shape)[...] = array
            layout.append([name, *self.placed[name]])
        return layout


class _Worker:
    def __init__(self, index: int, setup: bytes):
        self.slots = [_Slot(_slot_file()) for _ in range(_SLOT_FILES)]
        requests_read, requests_write = os.pipe()
        replies_read, replies_write = os.pipe()
        slot_fds = [slot.fd for slot in self.slots]
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", "from trainer_client.read_workers import main; main()",
                 "--requests", str(requests_read), "--replies", str(replies_write),
                 "--slots", *map(str, slot_fds)],
                pass_fds=(requests_read, replies_write, *slot_fds),
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        except BaseException:
            for slot in self.slots:
                slot.close()
            os.close(requests_write)
            os.close(replies_read)
            raise
        finally:
            os.close(requests_read)
            os.close(replies_write)
        _widen(requests_write)
        self.index = index
        self.requests = os.fdopen(requests_write, "wb")
        self.replies = os.fdopen(replies_read, "rb", buffering=0)
        self.ready = False
        self.layout: list[tuple[str, int, int, int]] = []  # the last layout this worker sent
        self.layout_end = 0  # bytes that layout spans
        self.sent: collections.deque[_Slot] = collections.deque()  # the slots of the steps in flight, in order
        self.next_slot = 0  # where the search for a free slot starts: the one after the slot used last
        self._header = bytearray(_REPLY.size)
        _send(self.requests, setup)

    def poll_ready(self) -> bool:
        """Whether the worker has said it is ready (its imports and reader set up); never blocks."""
        if not self.ready and select.select([self.replies], [], [], 0)[0]:
            self._take_ready()
        return self.ready

    def _take_ready(self) -> None:
        _, code, body = self._receive("its ready message")
        if code != _READY:
            raise ReadWorkerError(f"Read worker {self.index} (pid {self.process.pid}) did not start: {code} {body!r}")
        self.ready = True

    def _receive(self, what: str) -> tuple[int, int, bytes]:
        """A reply: (step, slot or code, body)."""
        try:
            _receive_exactly(self.replies, memoryview(self._header), what)
            step, slot, size = _REPLY.unpack(self._header)
            body = bytearray(size)
            if size:
                _receive_exactly(self.replies, memoryview(body), what)
        except EOFError as error:
            raise self._ended(error) from None
        return step, slot, bytes(body)

    def _ended(self, error: EOFError | BrokenPipeError) -> ReadWorkerError:
        code = self.process.wait(timeout=10)
        return ReadWorkerError(
            f"Read worker {self.index} (pid {self.process.pid}) exited with code {code} ({error}); see its "
            "output above. Read with workers=0 to get the error in this process."
        )

    def request(self, message: bytes) -> None:
        """Sends a step, to be written into a free slot: neither in flight nor holding a batch still referenced."""
        for k in range(len(self.slots)):
            index = (self.next_slot + k) % len(self.slots)
            slot = self.slots[index]
            if not slot.in_flight and not slot.held():
                break
        else:  # receive() keeps fewer held than there are slots beyond the steps in flight
            raise ReadWorkerError(f"Read worker {self.index} has no free slot: {len(self.sent)} steps in flight.")
        try:
            _send(self.requests, _REQUEST.pack(index) + message)
        except BrokenPipeError as error:  # the worker is gone: say which and how, as a reply cut short does
            raise self._ended(error) from None
        slot.in_flight = True
        self.sent.append(slot)
        self.next_slot = index + 1

    def batch(self, step_reads: StepReads | PlannedStep, copy: bool) -> ClientBatch:
        """The batch of the oldest step sent to this worker (``step_reads``); see ``ReadWorkers.receive``."""
        if not self.ready:
            self._take_ready()
        step, index, body = self._receive(f"the header of step {step_reads.step}")
        expected = self.sent.popleft()
        expected.in_flight = False
        if index == _ERROR:
            kind, message = json.loads(body)["error"]
            if kind == "CorruptRecordError":
                raise CorruptRecordError(*message)
            raise _ERRORS.get(kind, ReadWorkerError)(message)
        if step != step_reads.step or not 0 <= index < len(self.slots) or self.slots[index] is not expected:
            raise ReadWorkerError(
                f"Read worker {self.index} answered step {step} (slot {index}) when step {step_reads.step} was due "
                f"in slot {self.slots.index(expected)}."
            )
        if body:  # a new layout (the first batch, or another shape): later batches that keep it send none
            self.layout = [(name, offset, rows, length) for name, offset, rows, length in json.loads(body)]
            self.layout_end = max((offset + rows * length * 4 for _, offset, rows, length in self.layout), default=0)
        slot = self.slots[index]
        view = slot.view(self.layout_end)
        if not copy:
            view = view.toreadonly()  # its arrays cannot be made writable either
        region = np.frombuffer(view, np.uint8, self.layout_end) if self.layout_end else np.zeros(0, np.uint8)
        if copy:
            if sum(other.held() for other in self.slots if other is not slot) < len(self.slots) - SLOTS_PER_WORKER:
                slot.region = region  # handed out as views: the slot is not written again while they live
            else:  # the caller holds that many batches: this one is copied, its slot free again at once
                region = region.copy()
        features = {}
        for name, offset, rows, length in self.layout:
            features[name] = region[offset : offset + rows * length * 4].view(np.int32).reshape(rows, length)
        return ClientBatch(step_reads.step, False, step_reads.global_batch_size, step_reads.positions, features)

    def close(self, timeout: float) -> None:
        with contextlib.suppress(BrokenPipeError):  # a worker that is gone already
            self.requests.close()  # the worker's signal to exit
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.replies.close()
        for slot in self.slots:
            slot.close()


class ReadWorkers:
    """``count`` read worker processes for one run; step ``k`` of each session goes to worker ``k mod count``.

    Not thread-safe: one thread sends the requests and takes the batches, in step order.
    """

    def __init__(
        self,
        info: RunInfo,
        lengths: Mapping[str, int],
        count: int,
        *,
        verify_crc: bool = True,
        local: LocalSteps | None = None,
        fetch: FetchOptions | None = None,
    ):
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"The number of read workers must be a positive integer but got {count!r}.")
        local_setup = None if local is None else {
            "version_dirs": dict(local.version_dirs), "host_slice": [local.host_slice.index, local.host_slice.count]}
        setup = json.dumps({"plan": info.plan.to_dict(), "split": info.split, "lengths": dict(lengths),
                            "verify_crc": verify_crc, "local": local_setup,
                            "fetch": dataclasses.asdict(fetch or FetchOptions())}).encode()  # fmt: skip
        self.local = local
        self._workers: list[_Worker] = []
        try:
            for index in range(count):
                self._workers.append(_Worker(index, setup))
        except BaseException:
            self.close()
            raise
        self._sent = 0
        self._received = 0

    @property
    def count(self) -> int:
        return len(self._workers)

    @property
    def pids(self) -> list[int]:
        return [worker.process.pid for worker in self._workers]

    def ready(self) -> bool:
        """Whether every worker has started (until then, a caller reads in its own process); never blocks."""
        return all([worker.poll_ready() for worker in self._workers])

    @property
    def in_flight(self) -> int:
        return self._sent - self._received

    def send(self, step: StepReads | PlannedStep) -> None:
        """Sends the next step (steps go out in order; their batches come back in the same order); at most
        ``SLOTS_PER_WORKER`` per worker may be in flight (a worker writes the next one's batch where its first
        one is).

        Workers started with ``local`` take a ``PlannedStep`` (its number is all that is sent), others the
        step's instructions."""
        if self.in_flight >= SLOTS_PER_WORKER * len(self._workers):
            raise ReadWorkerError(
                f"{self.in_flight} steps are in flight to {len(self._workers)} read workers, the most they hold: "
                f"receive a batch before sending step {step.step}."
            )
        if isinstance(step, PlannedStep) != (self.local is not None):
            raise TypeError(
                f"Read workers {'with' if self.local else 'without'} LocalSteps take "
                f"{'a PlannedStep' if self.local else 'StepReads'} but got {type(step).__name__} for step "
                f"{step.step}."
            )
        message = str(step.step).encode() if isinstance(step, PlannedStep) else to_json(step, "base64")
        self._workers[self._sent % len(self._workers)].request(message)
        self._sent += 1

    def receive(self, step: StepReads | PlannedStep, *, copy: bool = True) -> ClientBatch:
        """The batch of the oldest step sent and not yet received (``step``, as it was sent).

        With ``copy`` (the default) the batch is the caller's: its arrays are never written again while anything
        references any of them (writable views of the worker's slot, not sent another step until they are all
        gone, or a copy when ``SLOTS_PER_WORKER`` of that worker's slots are so held). A process forked from this
        one shares the slots: a batch it keeps after this process has dropped it may be written again.
        With ``copy=False`` its arrays are read-only views of the worker's slot: intact until step
        ``step.step + SLOTS_PER_WORKER * count`` is sent (that worker writes it into the same slot at the
        earliest), and after ``close``."""
        batch = self._workers[self._received % len(self._workers)].batch(step, copy)
        self._received += 1
        return batch

    def close(self, timeout: float = 10.0) -> None:
        """Ends every worker and waits for it (killing one that has not exited after ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        for worker in self._workers:
            worker.close(max(0.0, deadline - time.monotonic()))
        self._workers = []


# --- the worker process ---------------------------------------------------------------------------


def _reply(out: IO[bytes], step: int, slot: int, body: bytes = b"") -> None:
    out.write(_REPLY.pack(step, slot, len(body)) + body)
    out.flush()


def _error_reply(error: Exception) -> bytes:
    if isinstance(error, CorruptRecordError):
        detail: Any = [error.path, error.record_index, error.byte_offset, error.reason]
        return json.dumps({"error": ["CorruptRecordError", detail]}).encode()
    kind = next((name for name, cls in _ERRORS.items() if isinstance(error, cls)), None)
    message = str(error) if kind else f"{type(error).__name__}: {error}"
    return json.dumps({"error": [kind or "ReadWorkerError", message]}).encode()


def _next_request(requests: io.BufferedReader) -> bytes | None:
    """The next request off the pipe (None at its end), read in this thread."""
    try:
        return _receive_message(requests, "a request")
    except (EOFError, OSError):
        return None


def _drain(requests: io.BufferedReader, into: queue.SimpleQueue[bytes | None]) -> None:
    """Takes every request off the pipe as it comes (None at its end), so that the iterator never waits
    to send while this worker waits for it to take a batch: neither pipe can fill both ways at once."""
    while (message := _next_request(requests)) is not None:
        into.put(message)
    into.put(None)  # the iterator closed the pipe (or ended): nothing more to read


def _serve(requests: io.BufferedReader, replies: IO[bytes], slot_fds: list[int]) -> None:
    setup = json.loads(_receive_message(requests, "the setup message"))
    info = RunInfo(RunPlan.from_dict(setup["plan"]), setup["split"])
    local = setup["local"]
    # With a local source the worker computes its steps' instructions as the iterator's source would, and
    # reads with the same cache readers (each sidecar loaded once per process).
    steps = None if local is None else (LocalAssignments(info.plan, local["version_dirs"]), HostSlice(*local["host_slice"]))
    readers = None if steps is None else steps[0].readers
    reader = BatchReader(info, setup["lengths"], verify_crc=setup["verify_crc"], readers=readers,
                         fetch=FetchOptions(**setup["fetch"]))
    pending: queue.SimpleQueue[bytes | None] | None = None
    if steps is None or any(fs.is_remote(d) for d in local["version_dirs"].values()):
        # Requests are taken off the pipe as they come, so that this thread can see the steps waiting and
        # start their reads (from an object store: in flight together) before it finishes the oldest.
        pending = queue.SimpleQueue()
        threading.Thread(target=_drain, args=(requests, pending), daemon=True, name="taskdata-requests").start()
        next_request = pending.get
    else:
        # Local caches gain nothing from reading ahead, and a step number is a few bytes (at most
        # SLOTS_PER_WORKER in flight, as are replies of a few bytes): neither pipe can fill, so this
        # thread reads the requests itself, without the thread (and its hand-over of the GIL every step)
        # that instructions need.
        next_request = functools.partial(_next_request, requests)
    slots = [_Slot(fd) for fd in slot_fds]
    sent_layout: list[list[Any]] | None = None  # the layout the iterator holds: sent again only when it changes
    started: collections.deque[tuple[int, PendingBatch | Exception]] = collections.deque()  # (slot, step), in order
    _reply(replies, -1, _READY)
    try:
        while True:
            if not started or (pending is not None and not pending.empty()):
                if (message := next_request()) is None:
                    break
                index, message = _REQUEST.unpack_from(message)[0], message[_REQUEST.size :]
                try:
                    if steps is None:
                        step_reads = from_json(message)
                    else:
                        source, host_slice = steps
                        step_reads = source.fetch(int(message), 1, host_slice)[0]
                    started.append((index, reader.start(step_reads)))
                except Exception as error:  # reported to the train loop in step order, which raises it
                    started.append((index, error))
                continue
            index, head = started.popleft()
            # The batch is decoded straight into its slot: no arrays of its own, no copy.
            writer = _SlotWriter(slots[index])
            try:
                if isinstance(head, Exception):
                    raise head
                batch = reader.finish(head, writer)
            except Exception as error:  # reported to the train loop, which raises it
                _reply(replies, -1, _ERROR, _error_reply(error))
                continue
            step, layout = batch.step, writer.layout(batch.features)
            del batch, writer  # views of the slot would keep its map from being closed or remapped
            _reply(replies, step, index, b"" if layout == sent_layout else json.dumps(layout).encode())
            sent_layout = layout
    finally:
        reader.close()
        if steps is not None:
            steps[0].close()
        for slot in slots:
            slot.close()


def keep_batch_memory() -> None:
    """Sets glibc's malloc thresholds as above for this whole process (elsewhere does nothing).

    Every read worker calls it. A trainer that reads in its own process (``workers=0``) may call it at
    start-up (or start with the equivalent ``MALLOC_`` variables): on a loaded machine the read path then
    took about half the CPU per example, on an idle one the same (BENCHMARKS.md, "Host read path against
    tf.data"), for at most ``TRIM_THRESHOLD`` of freed memory kept by the process.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(-1, TRIM_THRESHOLD)  # M_TRIM_THRESHOLD
    mallopt(-3, MMAP_THRESHOLD)  # M_MMAP_THRESHOLD


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A read worker of trainer_client.read_workers (not run by hand).")
    parser.add_argument("--requests", type=int, required=True)
    parser.add_argument("--replies", type=int, required=True)
    parser.add_argument("--slots", type=int, nargs="+", required=True)
    args = parser.parse_args(argv)
    keep_batch_memory()
    # Buffered: one system call takes every request already in the pipe.
    requests, replies = os.fdopen(args.requests, "rb"), os.fdopen(args.replies, "wb")
    with contextlib.suppress(BrokenPipeError), requests, replies:  # BrokenPipeError: the iterator is gone
        _serve(requests, replies, args.slots)
