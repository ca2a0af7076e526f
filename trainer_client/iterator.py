"""``DataIterator``: this host's numpy batch for every step from a start step, prefetched in the background.

Two daemon threads keep the train step fed: a fetcher asks the assignment source for windows of
``lookahead`` steps ahead of the reader, and a reader turns instructions into batches (verified reads,
interleave, padding) and queues up to ``prefetch`` of them. ``next()`` only takes a ready batch, so
the train step waits only when reading is slower than training; ``waited_seconds`` measures that.

The reader keeps the reads of up to ``read_ahead`` steps in flight (``BatchReader.start``) while it
finishes the oldest, in step order, as long as the bytes they read stay within ``read_ahead_bytes``
(the oldest step is always read, however large). From an object store that is what hides its latency:
a step's ranged reads, and the next steps', are requests in flight together (at most
``FetchOptions.max_in_flight``), not one round trip after another. The instructions of the steps after
those (up to ``lookahead`` steps ahead) are announced to the reader, so that a request for one step also
reads what later steps need next to it in the same shard (``RangeFetcher``): a block whose records the
plan's epoch order spreads over many steps is read once. From local disk none of this changes anything
(local shards are read when their step is finished).

With ``workers=N`` the reader hands the steps, in order, to N worker processes
(``trainer_client.read_workers``) that read whole batches on other cores, ``SLOTS_PER_WORKER`` steps each ahead. It
starts them once the first batch is queued and reads steps itself until they have started, so the first
batch does not wait for them. Either way the batches are the same, byte for byte.

The data state of a run is one step number plus the fingerprint of what decided the steps before it
(``DataState``; ``RunPlan.fingerprint_before``: the run's fingerprint, for a plan without stages).
Resuming from a state checks that fingerprint against the source's run before anything is read, so a
checkpoint resumes after a stage was appended at or after its step, and never after any change to the
steps it trained. Every batch is checked to be the step that comes next: a resume that cannot be
honoured is an error, never a silent restart from step 0.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import dataclasses
import enum
import queue
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from taskdata.cache.ranges import FetchOptions
from taskdata.index import MAX_LOOKAHEAD, slice_positions
from trainer_client.assignments import AssignmentError, AssignmentSource, HostSlice, RunInfo, StepReads
from trainer_client.local_source import LocalAssignments
from trainer_client.read_workers import SLOTS_PER_WORKER, LocalSteps, PlannedStep, ReadWorkers
from trainer_client.reading import BatchReader, ClientBatch, PendingBatch

__all__ = ["DataIterator", "DataState", "ResumeError"]


# Iterators not closed yet. Their reading threads are daemons: left running into the interpreter's
# teardown, one that wakes inside numpy C++ code (np.unique releases the GIL) is ended by pthread_exit,
# whose unwinding through that code calls std::terminate: the process aborts after its last line (seen
# 1 run in 20 of README's Grain snippet, whose iterators are never closed). So they are closed at exit,
# while the interpreter is still whole (atexit runs before the teardown stops daemon threads).
_OPEN: weakref.WeakSet[DataIterator] = weakref.WeakSet()


@atexit.register
def _close_open_iterators() -> None:
    for iterator in list(_OPEN):
        iterator.close()


class ResumeError(RuntimeError):
    """A data state that cannot be honoured (other run, other data): never trained on."""


@dataclasses.dataclass(frozen=True)
class DataState:
    """Where a run's data stream stands: the next step to train, and the fingerprint of the run's plan
    as far as it decides the steps before it (``RunPlan.fingerprint_before(step)``)."""

    step: int
    fingerprint: str

    def __post_init__(self) -> None:
        if isinstance(self.step, bool) or not isinstance(self.step, int) or self.step < 0:
            raise ResumeError(f"Data state step must be an integer >= 0 but got {self.step!r}.")
        if not isinstance(self.fingerprint, str) or not self.fingerprint:
            raise ResumeError(
                f"Data state fingerprint must be a non-empty string but got {self.fingerprint!r}; a state "
                "without its run's fingerprint cannot be checked against the run."
            )

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "fingerprint": self.fingerprint}

    @classmethod
    def from_dict(cls, data: Any) -> DataState:
        if not isinstance(data, dict) or set(data) != {"step", "fingerprint"}:
            raise ResumeError(f"A data state must be {{'step': int, 'fingerprint': str}} but got {data!r}.")
        return cls(data["step"], data["fingerprint"])


class _Done(enum.Enum):
    """The fetch thread's last instruction (every step up to ``stop_step`` is queued), or what a waiting
    thread gets when the iterator stops. An enum, so that the queues' item types can name it."""

    DONE = enum.auto()


_DONE = _Done.DONE


def _step_bytes(step_reads: StepReads) -> int:
    """The bytes of the records a step's instructions name."""
    return sum(int(task.byte_length.sum()) for task in step_reads.tasks)
_Item = TypeVar("_Item")
_Arg = TypeVar("_Arg")


class DataIterator:
    """Yields ``ClientBatch`` for steps ``start, start + 1, ...`` (up to ``stop_step``, exclusive).

    Args:
      source: ``ServerAssignments`` or ``LocalAssignments`` (the iterator closes it).
      lengths: padded length of every feature to deliver, e.g. ``{"inputs": 512, "targets": 114}``.
      start: step 0 of a new run (an int), or the ``DataState`` of a checkpoint to resume from.
      host_slice: the slice of every global batch this host reads (default: process index of count).
      lookahead: steps of instructions known ahead of the train step, fetched in requests of this many
        steps (at most ``MAX_LOOKAHEAD``, 64, what the server answers at once). Default: 16, or the plan's
        epoch order's ``read_horizon`` plus ``read_ahead`` where that is more (the windowed order: a block's
        records are dealt out over that many steps, and read with one request when they are all known).
      prefetch: batches read ahead of the train step.
      read_ahead: steps whose reads may be in flight at once.
      read_ahead_bytes: the most bytes that the records of steps started and not finished may hold (one
        step is always read, whatever its size).
      fetch: how remote shards are read: ``FetchOptions(max_in_flight, max_gap, timeout, attempts)``.
      workers: processes that read batches (0: the reading thread of this process reads them). Over a
        ``LocalAssignments`` source each worker computes its own steps' instructions (this process
        computes only the steps it reads itself: skipped ones, and those before the workers have started).
      copy_batches: with workers, whether a batch's arrays are the caller's (the default): never written
        again while anything references them (views of the worker's shared memory, which it writes no
        other batch into until they are all gone; copies when the caller holds ``SLOTS_PER_WORKER`` of
        a worker's batches; ``ReadWorkers.receive``). With False they are read-only views of it, saving a copy of every batch, valid until
        the caller asks for the next batch: the arrays of step ``k`` stay intact until the caller calls
        ``next()`` for step ``k + 1`` (the workers do not write that memory before); that call (or
        ``restore``) ends them, and they must not be read after it: copy what must live longer. After ``close`` nothing writes them. Batches this process reads
        itself (skipped steps, the first steps while the workers start, ``workers=0``) are its own arrays.
    """

    def __init__(
        self,
        source: AssignmentSource,
        lengths: Mapping[str, int],
        *,
        start: int | DataState = 0,
        host_slice: HostSlice | None = None,
        lookahead: int | None = None,
        prefetch: int = 4,
        stop_step: int | None = None,
        verify_crc: bool = True,
        workers: int = 0,
        copy_batches: bool = True,
        read_ahead: int = 8,
        read_ahead_bytes: int = 64 << 20,
        fetch: FetchOptions | None = None,
    ):
        for value, what in ((lookahead, "lookahead"), (prefetch, "prefetch"), (read_ahead, "read_ahead"),
                            (read_ahead_bytes, "read_ahead_bytes")):
            if value is None and what == "lookahead":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{what} must be a positive integer but got {value!r}.")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
            raise ValueError(f"workers must be an integer >= 0 (0: read in this process) but got {workers!r}.")
        if not isinstance(copy_batches, bool):
            raise ValueError(f"copy_batches must be True or False but got {copy_batches!r}.")
        self._source = source
        info = source.run_info()
        if lookahead is None:
            lookahead = max(16, info.plan.epoch_order.read_horizon + read_ahead)
        if isinstance(start, DataState):
            try:
                self._check_run(start)
            except ResumeError:
                source.close()
                raise
            first = start.step
        elif isinstance(start, int) and not isinstance(start, bool) and start >= 0:
            first = start
        else:
            source.close()
            raise ResumeError(f"start must be a step (int >= 0) or a DataState but got {start!r}.")
        if host_slice is None:
            import jax

            host_slice = HostSlice(jax.process_index(), jax.process_count())
        self.host_slice = host_slice
        self._next_step = first
        self._stop_step = stop_step
        # Over a local source the reader shares its cache readers: each sidecar is read once per process.
        readers = source.readers if isinstance(source, LocalAssignments) else None
        self._reader = BatchReader(info, lengths, verify_crc=verify_crc, readers=readers, fetch=fetch)
        self._read_ahead = read_ahead
        self._read_ahead_bytes = read_ahead_bytes
        self._fetch_options = fetch
        self._workers = workers
        # Over a local source the workers compute their steps' instructions; the fetch thread queues only
        # the steps' numbers and positions (PlannedStep), and this process computes the instructions of
        # the steps it reads itself, under this lock (the source serves one thread at a time).
        self._local = isinstance(source, LocalAssignments) and workers > 0
        self._source_lock = threading.Lock()
        self._copy_batches = copy_batches
        # The step the caller asked for last (``next()``): with copy_batches=False the workers' memory of the
        # steps before it may be written again, and of no later step (the reading thread waits for this).
        self._asked = first
        self._asked_changed = threading.Condition()
        self._pool: ReadWorkers | None = None
        self._pool_lock = threading.Lock()  # the reading thread starts the pool; closing stops it
        self.workers_serving = False  # whether batches now come from the worker processes
        self._lookahead = lookahead
        self._prefetch = prefetch
        self.waited_seconds = 0.0
        self.delivered = 0
        self._start_threads(first)
        _OPEN.add(self)

    def _start_threads(self, first: int) -> None:
        self._instructions: queue.Queue[StepReads | PlannedStep | BaseException | _Done] = queue.Queue(
            maxsize=self._lookahead
        )
        self._batches: queue.Queue[ClientBatch | BaseException] = queue.Queue(maxsize=self._prefetch)
        self._stopping = threading.Event()
        self.workers_serving = False
        self._threads = [
            threading.Thread(
                target=self._guard,
                args=(self._fetch, first, self._instructions),
                daemon=True,
                name="taskdata-fetch",
            ),
            threading.Thread(
                target=self._guard, args=(self._read, None, self._batches), daemon=True, name="taskdata-read"
            ),
        ]
        for thread in self._threads:
            thread.start()

    @property
    def info(self) -> RunInfo:
        """The run as the source knows it now (a server source adopts stages appended while it runs)."""
        return self._source.run_info()

    def _check_run(self, state: DataState) -> None:
        # The fingerprint of the steps before the state's step: a stage appended at or after it changes
        # neither side, so a checkpoint resumes across it (and across nothing else).
        expected = self.info.plan.fingerprint_before(state.step)
        if state.fingerprint != expected:
            raise ResumeError(
                f"The checkpoint's data state belongs to a run with fingerprint {state.fingerprint}, but run "
                f"{self.info.name!r} has fingerprint {expected}: its batches would differ from the ones the "
                f"checkpoint was trained on (both fingerprints are of the steps before the checkpoint's step "
                f"{state.step}; a stage appended at or after it would change neither). Resume against the run "
                "the checkpoint was made with, or start a new training run from step 0 deliberately."
            )

    def state(self) -> DataState:
        """The state to checkpoint after training every batch delivered so far."""
        return DataState(self._next_step, self.info.plan.fingerprint_before(self._next_step))

    def restore(self, state: DataState) -> None:
        """Goes on from ``state`` as if built with ``start=state`` (what a checkpoint restore calls).

        A state of another run is refused with the same ``ResumeError`` as at construction, and the
        iterator is left as it was. Batches read ahead for the old position are dropped.
        """
        if not isinstance(state, DataState):
            raise ResumeError(f"restore takes a DataState but got {state!r}.")
        self._check_run(state)
        stuck = self._stop_threads()
        if stuck:
            # The source and the reader serve one thread each: never start others beside these.
            raise RuntimeError(
                f"Threads {stuck} did not stop within 10 s (a read or request that hangs), so the iterator "
                f"cannot move to step {state.step}. Build a new DataIterator with start=state instead."
            )
        self._next_step = state.step
        self._ask(state.step)
        self._start_threads(state.step)

    def __iter__(self) -> DataIterator:
        return self

    def __next__(self) -> ClientBatch:
        if self._stop_step is not None and self._next_step >= self._stop_step:
            raise StopIteration
        started = time.perf_counter()
        self._ask(self._next_step)  # the caller's batch before this one is done with
        item = self._batches.get()
        self.waited_seconds += time.perf_counter() - started
        if isinstance(item, BaseException):
            self._batches.put(item)  # every later call fails the same way
            raise item
        if item.step != self._next_step:
            raise ResumeError(
                f"Expected the batch of step {self._next_step} but got step {item.step}; refusing to train on "
                "another step than the next one."
            )
        self._next_step += 1
        self.delivered += 1
        return item

    def _ask(self, step: int) -> None:
        if not self._copy_batches:
            with self._asked_changed:
                self._asked = step
                self._asked_changed.notify_all()

    def _may_send(self, step: int, pool: ReadWorkers) -> bool:
        """Whether the worker may write ``step``'s batch now: with copy_batches=False only once the caller
        has asked for a step after the one whose memory it writes it into (``step - SLOTS_PER_WORKER * count``)."""
        return self._copy_batches or step - SLOTS_PER_WORKER * pool.count < self._asked

    def _wait_asked(self, step: int, pool: ReadWorkers) -> None:
        with self._asked_changed:
            self._asked_changed.wait_for(lambda: self._may_send(step, pool), timeout=0.1)

    def close(self) -> None:
        _OPEN.discard(self)
        self._stop_threads()
        # A next() waiting in another thread (tf.data's, say) gets this instead of waiting forever. Never a
        # blocking put: a batch a thread queued as it stopped may fill the queue, and is dropped for this.
        closed = RuntimeError("The DataIterator was closed; build a new one to read on.")
        while True:
            try:
                self._batches.put_nowait(closed)
                break
            except queue.Full:
                with contextlib.suppress(queue.Empty):
                    self._batches.get_nowait()
        self._reader.close()
        self._source.close()

    def _stop_threads(self) -> list[str]:
        """Stops the background threads; the names of those that did not stop within 10 s."""
        self._stopping.set()
        for q in (self._instructions, self._batches):
            try:
                while True:
                    q.get_nowait()
            except queue.Empty:
                pass
        for thread in self._threads:
            thread.join(timeout=10)
        with self._pool_lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None
        return [thread.name for thread in self._threads if thread.is_alive()]

    @property
    def worker_pids(self) -> list[int]:
        """The process ids of the read workers now running (none with ``workers=0``)."""
        return self._pool.pids if self._pool is not None else []

    def __enter__(self) -> DataIterator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- background threads -----------------------------------------------------------------------

    def _put(self, q: queue.Queue[_Item], item: _Item) -> bool:
        while not self._stopping.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _get(self, q: queue.Queue[_Item]) -> _Item | _Done:
        while not self._stopping.is_set():
            try:
                return q.get(timeout=0.1)
            except queue.Empty:
                continue
        return _DONE

    def _guard(self, work: Callable[[_Arg], None], arg: _Arg, out: queue.Queue[_Item | BaseException]) -> None:
        # An error in a background thread reaches the train loop at its next ``next()``.
        try:
            work(arg)
        except BaseException as error:
            self._put(out, error)

    def _fetch(self, step: int) -> None:
        while self._stop_step is None or step < self._stop_step:
            # A window is one request: at most what the server answers at once.
            count = min(self._lookahead, MAX_LOOKAHEAD)
            if self._stop_step is not None:
                count = min(count, self._stop_step - step)
            window = self._planned(step, count) if self._local else self._fetch_reads(step, count)
            for item in window:
                if not self._put(self._instructions, item):
                    return
            step += count
        self._put(self._instructions, _DONE)

    def _fetch_reads(self, step: int, count: int) -> list[StepReads]:
        with self._source_lock:
            return self._source.fetch(step, count, self.host_slice)

    def _planned(self, step: int, count: int) -> list[StepReads | PlannedStep]:
        """What ``_fetch_reads`` gives for a window, with each step the workers read as its number and
        positions only (the same positions, from the same plan; the same errors, raised for the window)."""
        plan = self.info.plan
        window: list[StepReads | PlannedStep] = []
        for k in range(step, step + count):
            if plan.is_skipped(k):
                window += self._fetch_reads(k, 1)  # read in this process: no data, no index math
            else:
                positions = slice_positions(plan, k, self.host_slice.index, self.host_slice.count)
                window.append(PlannedStep(k, len(plan.positions(k)), positions))
        return window

    def _reads_of(self, item: StepReads | PlannedStep) -> StepReads:
        """The instructions of a step this process reads itself."""
        if isinstance(item, StepReads):
            return item
        reads = self._fetch_reads(item.step, 1)[0]
        self._check_slice(reads)
        return reads

    def _check_slice(self, item: StepReads) -> None:
        step_positions = self.info.plan.positions(item.step)
        rows = self.host_slice.rows(len(step_positions))
        expected = range(step_positions.start + rows.start, step_positions.start + rows.stop)
        if item.positions != expected or item.global_batch_size != len(step_positions):
            raise AssignmentError(
                f"Step {item.step}: instructions cover positions {item.positions} of a global batch of "
                f"{item.global_batch_size}, but host slice {self.host_slice.index} of {self.host_slice.count} of "
                f"run {self.info.name!r} is positions {expected} of {len(step_positions)}."
            )

    def _read(self, _: None) -> None:
        if self._workers:
            self._read_pooled()
            return
        self._reader.forget_announced()
        known: collections.deque[StepReads | BaseException] = collections.deque()  # announced, not started
        started: collections.deque[PendingBatch | BaseException] = collections.deque()  # in step order
        received_all = False
        try:
            while not received_all or known or started:
                if self._stopping.is_set():
                    return
                if not received_all:
                    received_all = self._receive(known, started)
                self._start_known(known, started)
                if not started:
                    continue
                head = started.popleft()
                if isinstance(head, BaseException):
                    raise head  # after the batch of every step before it
                if not self._put(self._batches, self._reader.finish(head)):
                    return
        finally:
            for pending in started:
                if isinstance(pending, PendingBatch):
                    pending.cancel()

    def _receive(self, known: collections.deque[StepReads | BaseException],
                 started: collections.deque[PendingBatch | BaseException]) -> bool:
        """Takes the instructions that have come, up to ``lookahead`` steps ahead, announcing each to the
        reader (waiting for one only when there is nothing else to do); True after the last one (or an error)."""
        while len(known) + len(started) < self._lookahead:
            item: StepReads | PlannedStep | BaseException | _Done
            if known or started:
                try:
                    item = self._instructions.get_nowait()
                except queue.Empty:
                    return False
            else:
                item = self._get(self._instructions)
            if item is _DONE:
                return True
            if isinstance(item, BaseException):
                known.append(item)
                return True
            assert isinstance(item, StepReads)  # without workers the fetch thread sends instructions only
            known.append(item)
            self._reader.announce(item)
        return False

    def _start_known(self, known: collections.deque[StepReads | BaseException],
                     started: collections.deque[PendingBatch | BaseException]) -> None:
        """Starts the reads of the next steps, within ``read_ahead`` steps and ``read_ahead_bytes``."""
        held = sum(_step_bytes(p.step_reads) for p in started if isinstance(p, PendingBatch))
        opened = False
        while known and len(started) < self._read_ahead and (not started or held < self._read_ahead_bytes):
            if not opened:  # only a prefetch of sidecars: what fails here fails again, in order, below
                with contextlib.suppress(Exception):
                    self._reader.open([s for s in known if isinstance(s, StepReads)][: self._read_ahead])
                opened = True
            item = known.popleft()
            if isinstance(item, BaseException):
                known.clear()
                started.append(item)
                return
            try:
                self._check_slice(item)
                started.append(self._reader.start(item))
            except Exception as error:
                known.clear()
                started.append(error)
                return
            held += _step_bytes(item)

    def _start_pool(self) -> ReadWorkers | None:
        """The read workers, started now (None if the iterator is stopping)."""
        with self._pool_lock:
            if not self._stopping.is_set():
                reader = self._reader
                local = None
                if self._local:
                    assert isinstance(self._source, LocalAssignments)
                    local = LocalSteps(self._source.version_dirs, self.host_slice)
                self._pool = ReadWorkers(
                    reader.info, reader.lengths, self._workers, verify_crc=reader.verify_crc, local=local,
                    fetch=self._fetch_options,
                )
            return self._pool

    def _read_pooled(self) -> None:
        """``_read`` through worker processes: steps go out in order, up to ``SLOTS_PER_WORKER`` per worker ahead, and their
        batches are queued in that order. The workers start once the first batch is queued; until they
        all have, and for skipped steps, this thread reads the step itself."""
        ahead: collections.deque[StepReads | PlannedStep | ClientBatch] = collections.deque()  # in step order
        pool: ReadWorkers | None = None
        held: StepReads | PlannedStep | None = None  # the next step, waiting for the caller (copy_batches=False)
        item: StepReads | PlannedStep | BaseException | _Done
        finished = False
        while not finished or ahead or held is not None:
            if self._stopping.is_set():
                return
            while not finished and (pool is None or pool.in_flight < SLOTS_PER_WORKER * pool.count):
                if held is not None:
                    item, held = held, None
                elif ahead:
                    try:
                        item = self._instructions.get_nowait()
                    except queue.Empty:
                        break
                else:
                    item = self._get(self._instructions)
                if item is _DONE:
                    finished = True
                    break
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, StepReads):
                    self._check_slice(item)
                if (isinstance(item, StepReads) and item.skipped) or pool is None or not pool.ready():
                    ahead.append(self._reader.read(self._reads_of(item)))
                    break  # deliver it now: the train step may be waiting for it
                if not self._may_send(item.step, pool):
                    held = item
                    if not ahead:  # every batch before it is queued: wait for the caller to take one
                        self._wait_asked(item.step, pool)
                    break
                pool.send(item)
                ahead.append(item)
                self.workers_serving = True
            if not ahead:
                continue
            head = ahead.popleft()
            if isinstance(head, ClientBatch):
                batch = head
            else:
                assert pool is not None  # only the pool's steps are instructions here
                batch = pool.receive(head, copy=self._copy_batches)
            if not self._put(self._batches, batch):
                return
            if pool is None:
                pool = self._start_pool()
                if pool is None:
                    return
