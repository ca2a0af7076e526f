"""DataIterator(workers=N): the batches of the in-process reader, byte for byte, from worker processes that
stop with the iterator (or with the process that started them) and report errors as the reader would."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from taskdata.cache.tfrecord import CorruptRecordError
from taskdata.index import BatchSchedule, SkipRange
from taskdata.runs import CacheResolver, RunStore, StoredRun
from tests.client_helpers import LENGTHS, REPO, features_equal, shared_root
from trainer_client.assignments import HostSlice
from trainer_client.iterator import DataIterator, DataState
from trainer_client.local_source import LocalAssignments
from trainer_client.read_workers import (
    SLOTS_PER_WORKER,
    LocalSteps,
    PlannedStep,
    ReadWorkerError,
    ReadWorkers,
)
from trainer_client.reading import BatchReader

pytestmark = pytest.mark.slow  # cache jobs (Beam), subprocesses


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return shared_root(tmp_path_factory)


def local(root, run="mix4"):
    return LocalAssignments.from_cache_root(RunStore(root).get(run), root)


def collect(source, host_slice, *, start=0, stop=40, workers=0, **kwargs):
    """The batches of steps [start, stop); with workers, taken slowly until the workers serve (the reading
    thread reads the first steps itself while they start), and then most of them come from the workers."""
    batches = []
    with DataIterator(source, LENGTHS, start=start, host_slice=host_slice, stop_step=stop, workers=workers,
                      **kwargs) as it:  # fmt: skip
        for batch in it:
            batches.append((batch.step, batch.features))
            if workers and not it.workers_serving:
                time.sleep(0.05)
        assert it.workers_serving == bool(workers)
    return batches


def gone(pid: int, timeout: float = 10.0) -> bool:
    """Whether process ``pid`` has exited (and been reaped, or is a zombie of a dead parent) within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def same(a, b) -> bool:
    return [s for s, _ in a] == [s for s, _ in b] and all(
        features_equal(x, y) and all(x[k].tobytes() == y[k].tobytes() for k in x)
        for (_, x), (_, y) in zip(a, b, strict=True))  # fmt: skip


def test_workers_deliver_the_batches_of_the_in_process_reader_byte_for_byte(root):
    # 120 steps of 16: several epochs of the toy caches (about 345 records each), so scattered reads too.
    for host_slice in (HostSlice(0, 1), HostSlice(1, 4)):
        plain = collect(local(root), host_slice, stop=120)
        for workers in (1, 3):
            assert same(collect(local(root), host_slice, stop=120, workers=workers, prefetch=2), plain)
    # Negative control: another seed's run gives other batches after the first epoch.
    other = collect(local(root, "other_seed"), HostSlice(0, 1), start=200, stop=260, workers=2)
    mine = collect(local(root), HostSlice(0, 1), start=200, stop=260, workers=2)
    assert not any(features_equal(a[1], b[1]) for a, b in zip(other, mine, strict=True))


def test_resuming_with_workers_gives_the_tail_of_the_uninterrupted_run(root):
    uninterrupted = collect(local(root), HostSlice(2, 4), stop=120)
    fingerprint = local(root).run_info().fingerprint
    for k in (1, 37):
        resumed = collect(local(root), HostSlice(2, 4), start=DataState(k, fingerprint), stop=120, workers=2)
        assert same(resumed, uninterrupted[k:])
    with DataIterator(local(root), LENGTHS, host_slice=HostSlice(2, 4), stop_step=120, workers=2) as it:
        for _ in range(20):
            next(it)
        first_pids = it.worker_pids
        it.restore(DataState(5, fingerprint))
        assert all(gone(pid) for pid in first_pids)  # the old workers stopped with the old position
        assert same([(b.step, b.features) for b in it], uninterrupted[5:])


def test_skipped_steps_with_workers_deliver_no_data_and_shift_nothing(root):
    plan = RunStore(root).get("mix4").plan
    skipping = type(plan)(**{**{f: getattr(plan, f) for f in plan.__dataclass_fields__}, "skip": (SkipRange(30, 33),)})
    dirs = {c.task: c.version_dir for c in CacheResolver(root).resolve_run(RunStore(root).get("mix4"))}
    with DataIterator(LocalAssignments(skipping, dirs), LENGTHS, host_slice=HostSlice(0, 4), stop_step=40,
                      workers=2) as it:  # fmt: skip
        batches = list(it)
    plain = collect(LocalAssignments(plan, dirs), HostSlice(0, 4))
    assert [b.step for b in batches if b.skipped] == [30, 31, 32]
    assert all(features_equal(b.features, f) for b, (_, f) in zip(batches, plain, strict=True) if not b.skipped)


def test_closing_the_iterator_ends_every_worker(root):
    it = DataIterator(local(root), LENGTHS, host_slice=HostSlice(0, 1), workers=2)
    while not it.workers_serving:
        next(it)
    pids = it.worker_pids
    assert len(pids) == 2 and all(not gone(pid, timeout=0) for pid in pids)
    it.close()
    assert it.worker_pids == [] and all(gone(pid) for pid in pids)


# The imports of the small trainer scripts these tests run in their own processes.
TRAINER_IMPORTS = (
    "import sys, time\n"
    "from taskdata.runs import RunStore\n"
    "from tests.client_helpers import LENGTHS\n"
    "from trainer_client.assignments import HostSlice\n"
    "from trainer_client.iterator import DataIterator\n"
    "from trainer_client.local_source import LocalAssignments\n"
)

def test_workers_do_not_outlive_a_killed_trainer(root):
    script = (
        TRAINER_IMPORTS +
        f"source = LocalAssignments.from_cache_root(RunStore({root!r}).get('mix4'), {root!r})\n"
        "it = DataIterator(source, LENGTHS, host_slice=HostSlice(0, 1), workers=2)\n"
        "while not it.workers_serving:\n"
        "    next(it)\n"
        "print(*it.worker_pids, flush=True)\n"
        "time.sleep(600)\n"
    )
    trainer = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": REPO})  # fmt: skip
    try:
        pids = [int(p) for p in trainer.stdout.readline().split()]
        assert len(pids) == 2 and all(not gone(pid, timeout=0) for pid in pids)
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
    assert all(gone(pid) for pid in pids), "a read worker outlived the process that started it"


def test_a_read_error_in_a_worker_reaches_the_train_loop_with_its_type_and_place(tmp_path, root):
    copy = str(tmp_path / "copy")
    shutil.copytree(root, copy)
    dirs = {c.task: c.version_dir.replace(root, copy, 1)
            for c in CacheResolver(root).resolve_run(RunStore(root).get("mix4"))}  # fmt: skip
    plan = RunStore(root).get("mix4").plan
    clean = collect(LocalAssignments(plan, dirs), HostSlice(0, 1), stop=200)
    with DataIterator(LocalAssignments(plan, dirs), LENGTHS, host_slice=HostSlice(0, 1), stop_step=200, prefetch=1,
                      workers=2) as it:  # fmt: skip
        deadline = time.monotonic() + 120
        while not it.workers_serving and time.monotonic() < deadline:
            assert features_equal(next(it).features, clean[it.state().step - 1][1])
            time.sleep(0.02)  # let the workers start before the reading thread has read everything
        # Damage a record of a step well past what has been read: only a worker reads it.
        target = LocalAssignments(plan, dirs).fetch(it.state().step + 10, 1, HostSlice(0, 1))[0].tasks[1]
        shard, record = int(target.shard[0]), int(target.first_record[0])
        path = f"{dirs['toy_random']}/train.tfrecord-{shard:05d}-of-00003"
        with open(path, "r+b") as f:
            f.seek(int(target.byte_offset[0]) + 14)  # inside the record's payload
            f.write(b"\xff\xfe")
        with pytest.raises(CorruptRecordError, match=rf"-of-00003: record {record} at byte offset") as error:
            for batch in it:
                assert features_equal(batch.features, clean[batch.step][1])
        assert error.value.path.endswith(path.rsplit("/", 1)[1]) and error.value.record_index == record
        assert error.value.reason == "the CRC of the record data does not match"
        with pytest.raises(CorruptRecordError):
            next(it)


def test_the_read_path_and_its_workers_do_not_import_tensorflow(root):
    script = (
        TRAINER_IMPORTS +
        "from trainer_client.read_workers import _serve\n"
        f"source = LocalAssignments.from_cache_root(RunStore({root!r}).get('mix4'), {root!r})\n"
        "with DataIterator(source, LENGTHS, host_slice=HostSlice(0, 1), stop_step=120, workers=1) as it:\n"
        "    for _ in it:\n"
        "        time.sleep(0 if it.workers_serving else 0.05)\n"
        "    assert it.workers_serving\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'jax', 'seqio')))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": REPO})  # fmt: skip
    assert done.stdout.strip() == "[]", done.stdout
    # Negative control: the check sees TensorFlow when it is imported.
    seen = subprocess.run([sys.executable, "-c", "import sys, tensorflow; print('tensorflow' in sys.modules)"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    assert seen.stdout.strip() == "True"


def test_workers_must_be_a_count():
    with pytest.raises(ValueError, match=r"workers must be an integer >= 0 \(0: read in this process\) but got -1"):
        DataIterator(None, LENGTHS, workers=-1)  # type: ignore[arg-type]


def test_keep_batch_memory_stops_the_page_faults_of_each_batchs_temporaries():
    # A batch's temporaries (a record buffer, varint ends, words, padded output), allocated and freed again
    # and again: glibc gives their memory back and faults it in anew each time, unless told to keep it.
    script = (
        "import resource, sys, numpy as np\n"
        "from trainer_client.read_workers import keep_batch_memory\n"
        "if sys.argv[1] == 'keep':\n"
        "    keep_batch_memory()\n"
        "def batch():\n"
        "    arrays = [np.ones(n, np.uint8) for n in (300_000, 1_300_000, 1_280_000, 640_000)]\n"
        "for _ in range(5):\n"
        "    batch()\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "for _ in range(100):\n"
        "    batch()\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)\n"
    )
    faults = {mode: int(subprocess.run([sys.executable, "-c", script, mode], cwd=REPO, capture_output=True, text=True,
                                       check=True, env={**os.environ, "PYTHONPATH": REPO}).stdout)
              for mode in ("keep", "default")}
    assert faults["keep"] < 100 < 10_000 < faults["default"], faults


def test_a_worker_that_dies_is_an_error_in_the_train_loop_naming_it(root):
    with DataIterator(local(root), LENGTHS, host_slice=HostSlice(0, 1), prefetch=1, workers=2) as it:
        while not it.workers_serving:
            next(it)
            time.sleep(0.05)
        victim = it.worker_pids[1]
        os.kill(victim, signal.SIGKILL)
        with pytest.raises(ReadWorkerError, match=rf"Read worker 1 \(pid {victim}\) exited with code -9"):
            for _ in range(50):
                next(it)
    assert gone(victim) and it.worker_pids == []


def test_batches_that_grow_along_a_ramp_come_back_whole_from_the_workers_slots(root):
    # Each worker writes its batches into slot files (SLOTS_PER_WORKER) that it grows when a batch no longer fits (the
    # batch size ramps from 4 to 32 examples a step); every batch still equals the in-process reader's.
    plan = dataclasses.replace(RunStore(root).get("mix1").plan, name="ramp",
                               schedule=BatchSchedule(start=4, end=32, ramp_steps=28, multiple_of=4))  # fmt: skip

    def source():
        return LocalAssignments.from_cache_root(StoredRun(plan), root)

    plain = collect(source(), HostSlice(0, 1), stop=40)
    assert [len(features["inputs"]) for _, features in plain][::13] == [4, 16, 28, 32]
    assert same(collect(source(), HostSlice(0, 1), stop=40, workers=2, prefetch=1), plain)


def test_one_step_more_than_a_worker_has_slots_is_refused(root):
    # A worker writes step SLOTS_PER_WORKER's batch into its first step's slot: that batch must be taken first.
    source = local(root)
    steps = source.fetch(0, SLOTS_PER_WORKER + 1, HostSlice(0, 1))
    pool = ReadWorkers(source.run_info(), LENGTHS, 1)
    try:
        for step in steps[:-1]:
            pool.send(step)
        with pytest.raises(ReadWorkerError, match=f"{SLOTS_PER_WORKER} steps are in flight to 1 read workers"):
            pool.send(steps[-1])
        first = pool.receive(steps[0])
        pool.send(steps[-1])
        assert [pool.receive(s).step for s in steps[1:]] == list(range(1, SLOTS_PER_WORKER + 1)) and first.step == 0
    finally:
        pool.close()
        source.close()


class Counting:
    """A source that is not a ``LocalAssignments`` (as ``ServerAssignments`` is not), counting the steps it
    computes instructions for: the iterator sends such a source's instructions to its workers."""

    def __init__(self, source):
        self.source, self.steps = source, []

    def run_info(self):
        return self.source.run_info()

    def fetch(self, first_step, num_steps, host_slice):
        self.steps += range(first_step, first_step + num_steps)
        return self.source.fetch(first_step, num_steps, host_slice)

    def close(self):
        self.source.close()


def test_over_a_local_source_the_workers_compute_their_steps_instructions(root, monkeypatch):
    # The iterator computes the instructions of the steps it reads itself only (the first ones, while the
    # workers start): the workers compute the rest from step numbers, and the batches are the same bytes.
    source = local(root)
    computed = []
    fetch = source.fetch

    def counting_fetch(first_step, num_steps, host_slice):
        computed.extend(range(first_step, first_step + num_steps))
        return fetch(first_step, num_steps, host_slice)

    monkeypatch.setattr(source, "fetch", counting_fetch)
    plain = collect(local(root), HostSlice(1, 2), stop=80)
    assert same(collect(source, HostSlice(1, 2), stop=80, workers=2), plain)
    assert len(computed) < 40 and computed == list(range(len(computed)))
    # Negative control: a source that is not local has every step's instructions computed here and sent.
    counting = Counting(local(root))
    assert same(collect(counting, HostSlice(1, 2), stop=80, workers=2), plain)
    assert counting.steps == list(range(80))


def test_workers_with_local_steps_take_step_numbers_and_refuse_instructions(root):
    source = local(root)
    steps = source.fetch(5, 2, HostSlice(1, 4))
    planned = [PlannedStep(s.step, s.global_batch_size, s.positions) for s in steps]
    pool = ReadWorkers(source.run_info(), LENGTHS, 1, local=LocalSteps(source.version_dirs, HostSlice(1, 4)))
    reader = BatchReader(source.run_info(), LENGTHS)
    try:
        with pytest.raises(TypeError, match="Read workers with LocalSteps take a PlannedStep but got StepReads"):
            pool.send(steps[0])
        for step in planned:
            pool.send(step)
        for step, reads in zip(planned, steps, strict=True):
            got, expected = pool.receive(step), reader.read(reads)
            assert (got.step, got.positions, got.global_batch_size) == (reads.step, reads.positions, reads.global_batch_size)
            assert all(got.features[k].tobytes() == expected.features[k].tobytes() for k in expected.features)
    finally:
        pool.close()
        reader.close()
        source.close()
    with pytest.raises(ValueError, match="PlannedStep.positions must be a range within a global batch of 8"):
        PlannedStep(0, 8, range(0, 9))


def test_skip_ranges_and_a_ramp_with_local_workers_equal_the_in_process_reader(root):
    plan = dataclasses.replace(RunStore(root).get("mix4").plan, name="ramp_skip", skip=(SkipRange(3, 5), SkipRange(21, 24)),
                               schedule=BatchSchedule(start=8, end=32, ramp_steps=30, multiple_of=8))  # fmt: skip

    def source():
        return LocalAssignments.from_cache_root(StoredRun(plan), root)

    plain = collect(source(), HostSlice(3, 4), stop=48)
    pooled = collect(source(), HostSlice(3, 4), stop=48, workers=2, prefetch=1)
    assert same(pooled, plain)
    assert [s for s, f in pooled if not f] == [3, 4, 21, 22, 23]
    assert {len(f["inputs"]) for _, f in pooled if f} == {2, 4, 6, 8}


def test_a_batch_the_hosts_cannot_split_fails_at_the_same_step_with_the_same_error_with_workers(root):
    # Batches of 16, 24, 32 on 16 hosts: the first batch of 24 cannot be split. Both paths deliver the
    # same steps before it (the window holding it fails as a whole) and then raise the same error.
    plan = dataclasses.replace(RunStore(root).get("mix1").plan, name="unsplittable",
                               schedule=BatchSchedule(start=16, end=32, ramp_steps=40, multiple_of=8))  # fmt: skip

    def run(workers):
        delivered = []
        source = LocalAssignments.from_cache_root(StoredRun(plan), root)
        with (DataIterator(source, LENGTHS, host_slice=HostSlice(0, 16), workers=workers, lookahead=4) as it,
              pytest.raises(Exception) as raised):  # fmt: skip
            for batch in it:
                delivered.append(batch.step)
                time.sleep(0.02 if workers and not it.workers_serving else 0)
        return delivered, type(raised.value), str(raised.value)

    plain = run(0)
    assert plain[0] and "cannot split evenly" in plain[2]
    assert run(2) == plain


def test_uncopied_batches_equal_the_copied_ones_through_a_ramp_and_a_restore(root):
    # The slots grow along the ramp while earlier views may still exist; a restore starts new workers.
    plan = dataclasses.replace(RunStore(root).get("mix4").plan, name="ramp_views", skip=(SkipRange(9, 11),),
                               schedule=BatchSchedule(start=8, end=32, ramp_steps=30, multiple_of=8))  # fmt: skip

    def source():
        return LocalAssignments.from_cache_root(StoredRun(plan), root)

    plain = collect(source(), HostSlice(1, 2), stop=48)
    kept, restored = [], False
    with DataIterator(source(), LENGTHS, host_slice=HostSlice(1, 2), stop_step=48, workers=2,
                      copy_batches=False) as it:  # fmt: skip
        for batch in it:
            kept.append((batch.step, {k: v.copy() for k, v in batch.features.items()}))  # copied in its lifetime
            if batch.step == 30 and not restored:
                it.restore(DataState(20, plan.fingerprint_before(20)))
                kept, restored = kept[:20], True
            if not it.workers_serving:
                # Gives the restored iterator's new workers time to start (seconds on a loaded 2-core machine)
                # before the 28 steps after the restore are all read in-process.
                time.sleep(0.25)
        assert it.workers_serving
    assert same(kept, plain)


def test_an_uncopied_batch_stays_intact_until_the_next_one_is_asked_for_and_cannot_be_written(root):
    with DataIterator(local(root), LENGTHS, host_slice=HostSlice(0, 1), stop_step=200, workers=2,
                      copy_batches=False) as it:  # fmt: skip
        while not it.workers_serving:
            next(it)
            time.sleep(0.05)
        for _ in range(4):  # batches from the workers' slots from here on
            next(it)
        held = next(it)
        array = held.features["inputs"]
        assert not array.flags.writeable and not array.flags.owndata
        with pytest.raises(ValueError, match="read-only"):
            array[0, 0] = 7
        with pytest.raises(ValueError, match="cannot set WRITEABLE flag to True"):
            array.flags.writeable = True
        snapshot = {k: v.copy() for k, v in held.features.items()}
        time.sleep(1.0)  # the workers read ahead as far as they are let
        assert all(np.array_equal(held.features[k], snapshot[k]) for k in snapshot)
        # Negative control: once later batches are asked for, the workers write the same memory again (each
        # worker cycles through its 2 * SLOTS_PER_WORKER slot files).
        for _ in range(2 * 2 * SLOTS_PER_WORKER + 4):
            next(it)
        time.sleep(0.5)
        assert not all(np.array_equal(held.features[k], snapshot[k]) for k in snapshot)


def test_copy_batches_must_be_a_bool():
    with pytest.raises(ValueError, match="copy_batches must be True or False but got 0"):
        DataIterator(None, LENGTHS, copy_batches=0)  # type: ignore[arg-type]


def from_slot(array) -> bool:
    """Whether a batch's array views a worker's slot (no copy): its base is not memory of its own."""
    return array.base is not None and not array.base.flags.owndata


def test_held_batches_stay_intact_and_only_those_beyond_the_slots_a_worker_spares_are_copied(root):
    # The caller keeps every batch: each worker hands out SLOTS_PER_WORKER of them as views of its slots and
    # copies the others (its other slots carry the steps in flight); all stay the in-process reader's bytes,
    # writable like arrays of their own, after later steps and after close.
    plain = collect(local(root), HostSlice(0, 1), stop=60)
    held = collect(local(root), HostSlice(0, 1), stop=60, workers=2)
    assert same(held, plain)
    viewed = [step for step, features in held if from_slot(features["inputs"])]
    assert len(viewed) == 2 * SLOTS_PER_WORKER, viewed  # two workers
    assert all(features["inputs"].flags.writeable for _, features in held)


def test_a_batch_is_written_again_only_once_the_caller_has_dropped_it_and_is_never_copied_then(root):
    with DataIterator(local(root), LENGTHS, host_slice=HostSlice(0, 1), stop_step=300, workers=2) as it:
        kept = next(it)
        while not from_slot(kept.features["inputs"]):  # the first steps, read while the workers start
            kept = next(it)
            time.sleep(0.05)
        row = kept.features["inputs"][3]  # a view of the batch keeps it from being written again, as the batch does
        snapshot = {k: v.copy() for k, v in kept.features.items()}
        address = kept.features["inputs"].ctypes.data
        del kept
        addresses = []
        for _ in range(8 * SLOTS_PER_WORKER):  # four times around each worker's slots
            batch = next(it)
            assert from_slot(batch.features["inputs"])  # a caller that keeps nothing costs no copy
            addresses.append(batch.features["inputs"].ctypes.data)
            del batch
        assert np.array_equal(row, snapshot["inputs"][3]) and address not in addresses
        # Negative control: once the row is dropped too, that slot carries later steps again.
        del row
        for _ in range(8 * SLOTS_PER_WORKER):
            batch = next(it)
            addresses.append(batch.features["inputs"].ctypes.data)
            del batch
        assert address in addresses
