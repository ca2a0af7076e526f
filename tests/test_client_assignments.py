"""Read instructions: validation, merging of consecutive slices, local source vs index math vs server."""

from __future__ import annotations

import dataclasses

import pytest

from taskdata.cache.format import CacheFormatError
from taskdata.index import assign
from taskdata.runs import RunStore
from tests.client_helpers import serve, shared_root
from trainer_client.assignments import AssignmentError, HostSlice, Read, StepReads, TaskReads, merge_slices
from trainer_client.local_source import LocalAssignments
from trainer_client.server_source import ServerAssignments


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return shared_root(tmp_path_factory)


def local(root, run="mix4"):
    return LocalAssignments.from_cache_root(RunStore(root).get(run), root)


def test_host_slice_rows_and_validation():
    assert HostSlice(1, 4).rows(16) == range(4, 8)
    with pytest.raises(AssignmentError, match=r"index must be in \[0, 4\) but got 4"):
        HostSlice(4, 4)
    with pytest.raises(AssignmentError, match="count must be an integer >= 1 but got 0"):
        HostSlice(0, 0)
    with pytest.raises(AssignmentError, match="12 examples cannot be split into 8 equal host slices"):
        HostSlice(0, 8).rows(12)


def test_step_reads_must_hold_together():
    read = Read(
        shard=0,
        uri="/c/train.tfrecord-00000-of-00001",
        first_record=0,
        count=2,
        byte_offset=0,
        byte_length=40,
    )
    task = TaskReads("a", "v1", (read,))
    StepReads(0, False, 4, range(0, 2), (task,), (0, 0))
    with pytest.raises(AssignmentError, match="task 'a' has reads for 2 records but the order takes 1"):
        StepReads(0, False, 4, range(0, 1), (task,), (0,))
    with pytest.raises(AssignmentError, match="3 examples in the order but the host covers 2 positions"):
        StepReads(0, False, 4, range(0, 2), (task,), (0, 0, 0))
    with pytest.raises(AssignmentError, match="order names task index 1 but the step has 1 tasks"):
        StepReads(0, False, 4, range(0, 2), (task,), (0, 1))
    with pytest.raises(AssignmentError, match="Read count must be an integer >= 1 but got 0"):
        dataclasses.replace(read, count=0)


def test_local_instructions_follow_the_index_math_example_by_example(root):
    source = local(root)
    plan = source.run_info().plan
    for step in (0, 7, 40, 1000):
        for d in range(4):
            (reads,) = source.fetch(step, 1, HostSlice(d, 4))
            examples = assign(plan, step, d).examples
            # Expand the reads back into (task, shard, record) in batch order.
            queues = [
                [(t.task, r.shard, r.first_record + k) for r in t.reads for k in range(r.count)]
                for t in reads.tasks
            ]
            expanded = [queues[i].pop(0) for i in reads.order]
            assert expanded == [(e.task, e.shard, e.record) for e in examples], f"step {step} data shard {d}"
            assert reads.positions == assign(plan, step, d).positions


def test_merging_consecutive_slices_equals_the_instructions_of_their_union(root):
    source = local(root)
    for step in (0, 3, 55):
        quarters = [source.fetch(step, 1, HostSlice(d, 4))[0] for d in range(4)]
        halves = [source.fetch(step, 1, HostSlice(h, 2))[0] for h in range(2)]
        (whole,) = source.fetch(step, 1, HostSlice(0, 1))
        assert merge_slices(quarters[:2]) == halves[0] and merge_slices(quarters[2:]) == halves[1]
        assert merge_slices(quarters) == whole
    with pytest.raises(AssignmentError, match="slices must be consecutive parts of one step"):
        merge_slices([quarters[0], quarters[2]])


def test_server_instructions_equal_the_local_ones_for_every_slicing(root):
    with serve(root) as url:
        server = ServerAssignments(url, "mix4")
        assert server.run_info() == local(root).run_info()
        for host_slice in (HostSlice(3, 4), HostSlice(1, 2), HostSlice(0, 1)):
            assert server.fetch(5, 20, host_slice) == local(root).fetch(5, 20, host_slice), host_slice
        # More than one request's worth of steps (the server answers at most 64 per request).
        assert server.fetch(0, 70, HostSlice(2, 4)) == local(root).fetch(0, 70, HostSlice(2, 4))
        server.close()


def test_server_refuses_more_host_slices_than_data_shards(root):
    with serve(root) as url:
        server = ServerAssignments(url, "mix2")
        with pytest.raises(
            AssignmentError, match="2 data shards, which cannot be grouped into 4 host slices"
        ):
            server.fetch(0, 1, HostSlice(0, 4))
        server.close()


def test_unknown_run_fails_at_once_with_the_servers_message(root):
    with serve(root) as url:
        server = ServerAssignments(url, "no_such_run", retry_seconds=30)
        with pytest.raises(AssignmentError, match=r"HTTP 404: Unknown run 'no_such_run'; known runs: \["):
            server.run_info()
        server.close()


def test_different_seed_gives_different_instructions(root):
    same = local(root, "mix4").fetch(200, 1, HostSlice(0, 4))
    other = local(root, "other_seed").fetch(200, 1, HostSlice(0, 4))
    assert local(root, "mix4").fetch(200, 1, HostSlice(0, 4)) == same
    assert [t.reads for t in other[0].tasks] != [t.reads for t in same[0].tasks]


def test_a_cache_root_without_the_pinned_version_is_an_error_naming_it(root, tmp_path):
    stored = RunStore(root).get("mix4")
    fingerprint = stored.plan.caches["toy_det"].fingerprint
    with pytest.raises(
        CacheFormatError, match=f"No complete version of task 'toy_det' under .* sha256 {fingerprint}"
    ):
        LocalAssignments.from_cache_root(stored, str(tmp_path))
