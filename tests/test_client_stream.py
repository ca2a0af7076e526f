"""A run's stream through the client's read path (``LocalAssignments`` -> ``BatchReader``): exact resume at
any step, host-count independence, far steps equal to an independent sequential read."""

from __future__ import annotations

import numpy as np
import pytest

from taskdata.cache.format import CacheFormatError
from taskdata.cache.reader import CacheReader
from taskdata.example import pad_features
from taskdata.index import BatchSchedule, RunPlan, TaskCache, assign
from tests.cache_helpers import build, sequential_records
from tests.client_helpers import LENGTHS
from trainer_client.assignments import HostSlice
from trainer_client.digest import row_digests
from trainer_client.local_source import LocalAssignments
from trainer_client.reading import BatchReader

pytestmark = pytest.mark.slow  # cache jobs (Beam)


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    root = tmp_path_factory.mktemp("stream")
    return {task: build(root, task=task, num_shards=3).version_dir for task in ("toy_det", "toy_random")}


def make_plan(caches, seed=5, batch=8, data_shards=2):
    readers = {t: CacheReader(v) for t, v in caches.items()}
    return RunPlan(
        name="run",
        mixture="toy_mix",
        caches={t: TaskCache(r.manifest_sha256, r.record_counts("train")) for t, r in readers.items()},
        rates={"toy_det": 1, "toy_random": 3},
        seed=seed,
        schedule=BatchSchedule.constant(batch),
        num_data_shards=data_shards,
    )


class Stream:
    """The host batches of a plan, as a trainer host reads them."""

    def __init__(self, caches, plan, lengths=LENGTHS):
        self.plan = plan
        self.source = LocalAssignments(plan, caches)
        self.reader = BatchReader(self.source.run_info(), lengths)

    def batch(self, step: int, index: int, count: int):
        return self.reader.read(self.source.fetch(step, 1, HostSlice(index, count))[0])

    def digests(self, first: int, stop: int, index: int, count: int) -> list[list[bytes]]:
        steps = self.source.fetch(first, stop - first, HostSlice(index, count))
        return [[d.tobytes() for d in row_digests(self.reader.read(s).features)] for s in steps]


def test_reading_from_any_step_gives_the_tail_of_the_uninterrupted_stream(caches):
    plan = make_plan(caches)
    # ~530 train records, 8 per step: 200 steps cross several epochs of both tasks.
    uninterrupted = Stream(caches, plan).digests(0, 200, 1, 2)
    for k in range(200):
        resumed = Stream(caches, plan).digests(k, min(k + 3, 200), 1, 2)
        assert resumed == uninterrupted[k : k + 3], f"resume at step {k} differs"


def test_random_far_steps_match_an_independent_sequential_read(caches):
    plan = make_plan(caches)
    stream = Stream(caches, plan)
    sequential = {t: sequential_records(v) for t, v in caches.items()}
    decoder = CacheReader(caches["toy_det"])
    rng = np.random.default_rng(7)
    for step in sorted(rng.integers(0, 10**6, 100).tolist()):
        batch = stream.batch(step, 0, 2)
        records = [sequential[e.task][e.shard][e.record] for e in assign(plan, step, 0, 2).examples]
        expected = pad_features(decoder.decode(records, {n: "int32" for n in LENGTHS}), LENGTHS)
        for name in LENGTHS:
            assert np.array_equal(batch.features[name], expected[name]), f"step {step}"


def test_global_batch_does_not_depend_on_the_number_of_hosts(caches):
    plan = make_plan(caches, batch=16, data_shards=1)
    stream = Stream(caches, plan)
    for step in (0, 1, 37, 999, 123456):
        whole = stream.digests(step, step + 1, 0, 1)[0]
        for hosts in (2, 4, 8):
            parts = [row for h in range(hosts) for row in stream.digests(step, step + 1, h, hosts)[0]]
            assert parts == whole, f"step {step} with {hosts} hosts"


def test_features_are_padded_to_the_sequence_lengths_with_pad_zero(caches):
    plan = make_plan(caches)
    batch = Stream(caches, plan, {"inputs": 16, "targets": 256}).batch(3, 0, 2)
    assert batch.features["inputs"].shape == (4, 16) and batch.features["targets"].shape == (4, 256)
    sequential = {t: sequential_records(v) for t, v in caches.items()}
    records = [sequential[e.task][e.shard][e.record] for e in assign(plan, 3, 0, 2).examples]
    decoded = CacheReader(caches["toy_det"]).decode(records, {"targets": "int32"})["targets"]
    for i in range(4):
        row = decoded.values[decoded.row_splits[i] : decoded.row_splits[i + 1]]
        assert np.array_equal(batch.features["targets"][i, : len(row)], row)
        assert not batch.features["targets"][i, len(row) :].any()


def test_different_seed_gives_a_different_later_epoch(caches):
    a, b = Stream(caches, make_plan(caches, seed=5)), Stream(caches, make_plan(caches, seed=6))
    # Epoch 0 is the cache's own order; from epoch 1 on the plan's seed decides.
    late = 150
    assert a.digests(late, late + 1, 0, 2) != b.digests(late, late + 1, 0, 2)
    assert a.digests(0, 1, 0, 2) == b.digests(0, 1, 0, 2)


def test_a_plan_for_another_cache_version_is_refused(caches, tmp_path):
    plan = make_plan(caches)
    other = build(tmp_path, task="toy_det", num_shards=3, seed=99).version_dir
    with pytest.raises(CacheFormatError, match="but the run plan names version"):
        LocalAssignments(plan, {**caches, "toy_det": other})
