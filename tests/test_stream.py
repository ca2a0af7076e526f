"""A run's stream read through the cache: exact resume at any step, host-count independence."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from taskdata.cache.reader import CacheReader
from taskdata.index import BatchSchedule, RunPlan, TaskCache
from taskdata.stream import RunReader
from tests.test_cache_job import build
from tests.test_reader import sequential_records


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    root = tmp_path_factory.mktemp("stream")
    return {task: build(root, task=task, num_shards=3).version_dir for task in ("toy_det", "toy_random")}


def make_plan(caches, seed=5, batch=8, data_shards=2, ramp=None):
    readers = {t: CacheReader(v) for t, v in caches.items()}
    schedule = BatchSchedule(start=batch, end=batch) if ramp is None else BatchSchedule(*ramp)
    plan = RunPlan(
        name="run", mixture="toy_mix",
        caches={t: TaskCache(r.manifest_sha256, r.record_counts("train")) for t, r in readers.items()},
        rates={"toy_det": 1, "toy_random": 3}, seed=seed, schedule=schedule, num_data_shards=data_shards,
    )
    return plan, readers


def digest(batch) -> list[str]:
    return [hashlib.sha256(r).hexdigest()[:16] for r in batch.records]


def test_reading_from_any_step_gives_the_tail_of_the_uninterrupted_stream(caches):
    plan, readers = make_plan(caches)
    reader = RunReader(plan, readers)
    # ~530 train records, 8 per step: 200 steps cross several epochs of both tasks.
    uninterrupted = [digest(b) for b in reader.iterate(0, data_shard=1, stop_step=200)]
    for k in range(200):
        resumed = [digest(b) for b in RunReader(plan, readers).iterate(k, data_shard=1, stop_step=min(k + 3, 200))]
        assert resumed == uninterrupted[k : k + 3], f"resume at step {k} differs"


def test_random_far_steps_match_an_independent_sequential_read(caches):
    plan, readers = make_plan(caches)
    reader = RunReader(plan, readers)
    sequential = {t: sequential_records(v) for t, v in caches.items()}
    rng = np.random.default_rng(7)
    for step in sorted(rng.integers(0, 10**6, 100).tolist()):
        batch = reader.host_batch(step, data_shard=0)
        expected = [sequential[e.task][e.shard][e.record] for e in batch.examples]
        assert list(batch.records) == expected, f"step {step}"


def test_global_batch_does_not_depend_on_the_number_of_hosts(caches):
    plan, readers = make_plan(caches, batch=16, data_shards=1)
    reader = RunReader(plan, readers)
    for step in (0, 1, 37, 999, 123456):
        whole = digest(reader.host_batch(step, 0, num_data_shards=1))
        for hosts in (2, 4, 8):
            parts = [h for d in range(hosts) for h in digest(reader.host_batch(step, d, num_data_shards=hosts))]
            assert parts == whole, f"step {step} with {hosts} hosts"


def test_features_are_padded_to_the_sequence_lengths_with_pad_zero(caches):
    plan, readers = make_plan(caches)
    readers_lengths = {"inputs": 16, "targets": 256}
    batch = RunReader(plan, readers, lengths=readers_lengths).host_batch(3, 0)
    assert batch.features["inputs"].shape == (4, 16) and batch.features["targets"].shape == (4, 256)
    decoded = readers["toy_det"].decode(list(batch.records), {"targets": "int32"})["targets"]
    for i in range(4):
        row = decoded.values[decoded.row_splits[i] : decoded.row_splits[i + 1]]
        assert np.array_equal(batch.features["targets"][i, : len(row)], row)
        assert not batch.features["targets"][i, len(row) :].any()


def test_different_seed_gives_a_different_later_epoch(caches):
    plan_a, readers = make_plan(caches, seed=5)
    plan_b, _ = make_plan(caches, seed=6)
    # Epoch 0 is the cache's own order; from epoch 1 on the plan's seed decides.
    late = 150
    assert digest(RunReader(plan_a, readers).host_batch(late, 0)) != digest(RunReader(plan_b, readers).host_batch(late, 0))
    assert digest(RunReader(plan_a, readers).host_batch(0, 0)) == digest(RunReader(plan_b, readers).host_batch(0, 0))


def test_a_plan_for_another_cache_version_is_refused(caches, tmp_path):
    plan, readers = make_plan(caches)
    other = build(tmp_path, task="toy_det", num_shards=3, seed=99).version_dir
    with pytest.raises(Exception, match="was planned on cache version"):
        RunReader(plan, {**readers, "toy_det": CacheReader(other)})
