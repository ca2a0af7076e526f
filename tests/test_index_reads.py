"""A step's reads: one value, computed one way, written and read back one way.

For random plans (mixtures, ramps, skips, later epochs, steps whose positions pass 2**63), the reads
computed for a host slice equal the ones rebuilt from ``assign``'s examples, the slices cut from a
whole step, the scalar chain's, and the value decoded from its JSON in both encodings. Bad answers
are refused with what disagrees.
"""

from __future__ import annotations

import json
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taskdata.index import (
    MAX_LOOKAHEAD,
    READ_COLUMNS,
    BatchSchedule,
    CacheFiles,
    PlanError,
    ReadsError,
    RunPlan,
    RunTables,
    SkipRange,
    StepJson,
    StepReads,
    StepSlices,
    TaskCache,
    TaskReads,
    assign,
    chain,
    from_json,
    host_slice_for,
    step_json,
    step_slices,
    to_json,
)
from tests.index_references import MemoryTable, step_examples

ENCODINGS = ("ints", "base64", "compact")


def step_reads(tables: RunTables, step: int, index: int, count: int) -> StepReads:
    """Host slice ``index`` of ``count`` at ``step``, computed alone."""
    return step_slices(tables, step, count, only=index)[0]


def make_plan(counts: dict[str, tuple[int, ...]], rates, seed=3, schedule=None, data_shards=4, skip=()):
    return RunPlan(
        name="run",
        mixture="mix",
        caches={t: TaskCache(f"sha-{t}", c) for t, c in counts.items()},
        rates=rates,
        seed=seed,
        schedule=schedule or BatchSchedule.constant(16),
        num_data_shards=data_shards,
        skip=skip,
    )


def tables_of(plan: RunPlan) -> RunTables:
    return RunTables.of(plan, [MemoryTable(t, plan.caches[t].shard_record_counts) for t in plan.task_names])


def reads_from_assign(tables: RunTables, step: int, index: int, count: int) -> StepReads:
    """The reads rebuilt from ``assign``'s examples: per task, its consecutive records joined, byte
    ranges one read at a time, files the distinct shards."""
    plan = tables.plan
    assignment = assign(plan, step, index, count)
    names = list(plan.task_names)
    tasks = []
    for t, name in enumerate(names):
        extents: list[list[int]] = []
        for e in assignment.examples:
            if e.task != name:
                continue
            if extents and extents[-1][0] == e.shard and extents[-1][1] + extents[-1][2] == e.record:
                extents[-1][2] += 1
            else:
                extents.append([e.shard, e.record, 1])
        rows = [[s, f, c, *tables.tables[t].byte_range(s, f, c)] for s, f, c in extents]
        columns = np.array(rows, np.int64).reshape(-1, len(READ_COLUMNS)).T.copy()
        files = np.array(sorted({r[0] for r in extents}), np.int64)
        tasks.append(TaskReads(tables.files[t], files, columns))
    return StepReads(
        step=step,
        skipped=assignment.skipped,
        global_batch_size=plan.schedule.batch_size(step),
        positions=assignment.positions,
        tasks=tuple(tasks),
        order=np.array([names.index(e.task) for e in assignment.examples], np.int64),
    )


def checked(reads: StepReads) -> StepReads:
    """``reads`` built again through every check of the value."""
    tasks = tuple(TaskReads(t.cache, t.files, t.columns) for t in reads.tasks)
    return StepReads(reads.step, reads.skipped, reads.global_batch_size, reads.positions, tasks, reads.order)


@st.composite
def plans(draw):
    num_tasks = draw(st.integers(1, 3))
    # At least 2 records per task: past 2**63 positions, a 1-record task's epoch would not fit int64,
    # which the epoch permutation's seed derivation needs.
    counts = {
        f"task{t}": tuple(
            draw(st.lists(st.integers(0, 12), min_size=1, max_size=5).filter(lambda c: sum(c) >= 2))
        )
        for t in range(num_tasks)
    }
    rates = {t: draw(st.integers(1, 5)) for t in counts} if num_tasks > 1 else None
    data_shards = draw(st.sampled_from((1, 2, 4)))
    start = 4 * draw(st.integers(1, 6))
    if draw(st.booleans()):
        schedule = BatchSchedule.ramp(
            start, 4 * draw(st.integers(1, 6)), draw(st.integers(1, 20)), multiple_of=4
        )
    else:
        schedule = BatchSchedule.constant(start, multiple_of=4)
    skip = ()
    if draw(st.booleans()):
        first = draw(st.integers(0, 30))
        skip = (SkipRange(first, first + draw(st.integers(1, 5))),)
    plan = make_plan(counts, rates, draw(st.integers(0, 2**63 - 1)), schedule, data_shards, skip)
    # Early steps (epoch 0 and the next few: the toy tasks have a few dozen records), or steps whose
    # positions pass 2**63 (the scalar chain).
    if draw(st.booleans()):
        step = draw(st.integers(0, 60))
    else:
        step = 2**63 // schedule.end + draw(st.integers(-2, 3))
    return plan, step


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans(), st.sampled_from((1, 2, 4)))
def test_the_reads_of_a_host_slice_are_one_value_however_they_are_made(case, count):
    plan, step = case
    tables = tables_of(plan)
    whole = step_slices(tables, step, count)
    assert len(whole) == count
    for index in range(count):
        reads = step_reads(tables, step, index, count)
        assert checked(reads) == reads  # the index math's values pass every check
        assert reads == reads_from_assign(tables, step, index, count)
        assert whole[index] == reads
        alone = step_slices(tables, step, count, only=index)
        assert len(alone) == 1 and alone[0] == reads
        for encoding in ENCODINGS:
            body = to_json(reads, encoding)
            assert json.dumps(json.loads(body), separators=(",", ":")).encode() == body
            assert from_json(body) == reads
            # The server's writer of a step's slices writes the same bytes, from the whole step or the slice.
            assert StepJson(whole, encoding)[index] == body == StepJson(alone, encoding)[0]
    # A coarser slice reads the union of the finer slices it covers, in order.
    if count > 1:
        coarse = step_reads(tables, step, 0, 1)
        assert step_examples(coarse) == [e for index in range(count) for e in step_examples(whole[index])]


@settings(max_examples=60, deadline=None)
@given(plans(), st.sampled_from((1, 2, 4)))
def test_the_scalar_chain_gives_the_arrays_reads(case, count):
    plan, step = case
    tables = tables_of(plan)
    arrays = [step_slices(tables, step, count)[i] for i in range(count)]
    with mock.patch.object(chain, "fits_int64", lambda plan, positions: False):
        scalar = step_slices(tables, step, count)
        assert [scalar[i] for i in range(count)] == arrays
        assert [step_reads(tables, step, i, count) for i in range(count)] == arrays


class WideTable(MemoryTable):
    """Records of shard ``s`` take ``2**(8 * (s % 4) + 6)`` bytes: byte columns of every compact type."""

    def __init__(self, task: str, counts: tuple[int, ...]):
        super().__init__(task, counts)
        self.offsets = [np.arange(n + 1, dtype=np.int64) << (8 * (s % 4) + 6) for s, n in enumerate(counts)]


@pytest.mark.parametrize("count", [1, 2, 4])
def test_step_json_writes_every_compact_type_as_to_json(count):
    plan = make_plan({"a": (40, 3, 7, 9, 2), "b": (5, 300)}, {"a": 3, "b": 1}, schedule=BatchSchedule.constant(64))
    tables = RunTables.of(plan, [WideTable(t, plan.caches[t].shard_record_counts) for t in plan.task_names])
    types = set()
    for step in (0, 1, 5, 60, 2**63 // 64 + 1):
        whole = step_slices(tables, step, count)
        for index in range(count):
            body = to_json(whole[index], "compact")
            assert StepJson(whole, "compact")[index] == body
            tasks = json.loads(body)["tasks"]
            types |= {column.partition(":")[0] for task in tasks for column in task["reads"].values()}
    assert types == {"u1", "u2", "u4", "i8"}
    with pytest.raises(IndexError, match="there is no slice 4"):
        StepJson(step_slices(tables, 0, 4), "compact")[4]


@pytest.mark.parametrize("count", [1, 2, 4])
def test_step_json_writes_base64_from_the_step_without_cutting_its_slices(count):
    """encoding=base64 is written from the step's columns, as compact is: no ``StepReads`` is cut and
    ``to_json`` is not called (~15 us per 256-example answer in the server), with the same bytes, for
    every slice, an empty one and a skipped step included."""
    plan = make_plan(
        {"a": (40, 3, 7, 9, 2), "b": (5, 300), "c": (1,)},
        {"a": 3, "b": 1, "c": 1},
        schedule=BatchSchedule.constant(64),
        skip=(SkipRange(5, 6),),
    )
    tables = tables_of(plan)
    for step in (0, 1, 5, 60, 2**63 // 64 + 1):
        expected = [to_json(step_slices(tables, step, count)[index], "base64") for index in range(count)]
        whole = step_slices(tables, step, count)
        with mock.patch.object(StepSlices, "__getitem__", side_effect=AssertionError("a slice was cut")), \
                mock.patch.object(step_json, "to_json", side_effect=AssertionError("to_json was called")):  # fmt: skip
            assert [StepJson(whole, "base64")[index] for index in range(count)] == expected


def test_files_json_view_is_files_json():
    files = CacheFiles.of("a", "v1", ("/x/0", "/x/1", "/x/22"))
    for shards in ([], [1], [0, 2], [0, 1, 2]):
        view = files.files_json_view(np.array(shards, np.int64))
        assert isinstance(view, memoryview) and view.tobytes() == files.files_json(np.array(shards, np.int64))
    assert files.files_json_view(np.array([0, 2])).tobytes() == b'{"shard":0,"uri":"/x/0"},{"shard":2,"uri":"/x/22"}'


def test_positions_past_int64_take_the_scalar_chain():
    plan = make_plan({"a": (5, 7), "b": (3,)}, {"a": 2, "b": 1})
    tables = tables_of(plan)
    step = 2**63 // 16 + 1
    reads = step_reads(tables, step, 1, 4)
    assert reads.positions.start >= 2**63
    assert reads == reads_from_assign(tables, step, 1, 4)
    assert from_json(to_json(reads, "base64")) == reads


def test_skipped_steps_read_nothing_but_keep_their_positions():
    plan = make_plan({"a": (5, 7)}, None, skip=(SkipRange(2, 4),))
    reads = step_reads(tables_of(plan), 3, 1, 4)
    assert reads.skipped and reads.positions == range(52, 56) and len(reads.order) == 0
    assert [len(t) for t in reads.tasks] == [0] and reads.tasks[0].files.tolist() == []
    assert from_json(to_json(reads)) == reads


def test_another_seed_gives_other_reads_in_a_later_epoch():
    counts, rates = {"a": (5, 7), "b": (3, 4)}, {"a": 1, "b": 1}
    late = [step_reads(tables_of(make_plan(counts, rates, seed=s)), 40, 0, 1) for s in (3, 4)]
    assert late[0] != late[1]
    first = [step_reads(tables_of(make_plan(counts, rates, seed=s)), 0, 0, 1) for s in (3, 4)]
    assert first[0].tasks == first[1].tasks  # epoch 0 is the caches' own order


def test_a_task_reads_its_consecutive_records_as_one_read_across_other_tasks_examples():
    plan = make_plan({"a": (40,), "b": (40,)}, {"a": 1, "b": 1})
    reads = step_reads(tables_of(plan), 0, 0, 1)
    assert len(set(reads.order.tolist())) == 2
    assert [(t.shard.tolist(), t.first_record.tolist(), t.count.tolist()) for t in reads.tasks] == [
        ([0], [0], [8]),
        ([0], [0], [8]),
    ]


def test_json_answers_are_the_documented_shape():
    plan = make_plan({"a": (5, 7)}, None)
    reads = step_reads(tables_of(plan), 0, 1, 4)
    assert json.loads(to_json(reads)) == {
        "step": 0,
        "skipped": False,
        "global_batch_size": 16,
        "positions": {"start": 4, "stop": 8},
        "tasks": [
            {
                "task": "a",
                "version": "v1",
                "files": [
                    {"shard": 0, "uri": "mem://a/v1/train-00000-of-00002"},
                    {"shard": 1, "uri": "mem://a/v1/train-00001-of-00002"},
                ],
                # Record r of shard s takes 16 + (7s + 3r) % 41 bytes: shard 0's record 4 starts after
                # 16 + 19 + 22 + 25 = 82 bytes and takes 28; shard 1's records 0-2 take 23 + 26 + 29.
                "reads": {
                    "shard": [0, 1],
                    "first_record": [4, 0],
                    "count": [1, 3],
                    "byte_offset": [82, 0],
                    "byte_length": [28, 78],
                },
            },
        ],
        "order": [0, 0, 0, 0],
    }
    assert json.loads(to_json(reads, "base64"))["order"] == "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
    assert MAX_LOOKAHEAD == 64
    assert json.loads(to_json(reads, "compact"))["tasks"] == [
        {
            "task": "a",
            "version": "v1",
            "names": {"prefix": "mem://a/v1/train-", "digits": 5, "suffix": "-of-00002"},
            "reads": {  # the values above, each column in the narrowest type that holds it
                "shard": "u1:AAE=",
                "first_record": "u1:BAA=",
                "count": "u1:AQM=",
                "byte_offset": "u1:UgA=",
                "byte_length": "u1:HE4=",
            },
        }
    ]
    assert json.loads(to_json(reads, "compact"))["order"] == "u1:AAAAAA=="
    with pytest.raises(ValueError, match="encoding must be 'ints', 'base64' or 'compact' but got 'hex'"):
        to_json(reads, "hex")  # type: ignore[arg-type]


def good_answer() -> dict:
    plan = make_plan({"a": (5, 7), "b": (9,)}, {"a": 1, "b": 1})
    return json.loads(to_json(step_reads(tables_of(plan), 0, 0, 1)))


def _edit(answer: dict, change) -> dict:
    change(answer)
    return answer


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda a: a["tasks"][0]["reads"]["count"].pop(),
            r"read columns of task 'a' must have one length, but have",
        ),
        (lambda a: a["order"].__setitem__(0, 5), "order names task index 5 but the step has 2 tasks"),
        (lambda a: a["order"].__setitem__(0, -1), "order names task index -1 but the step has 2 tasks"),
        (
            lambda a: a["order"].__setitem__(a["order"].index(1), 0),
            r"task 'a' has reads for \d+ records but the order takes \d+ examples from it",
        ),
        (
            lambda a: a["tasks"][0]["reads"]["count"].__setitem__(0, 0),
            "read column count holds 0, below its minimum 1",
        ),
        (
            lambda a: a["tasks"][0]["files"].clear(),
            r"files name shards \[\] but the reads are of shards \[0, 1\]",
        ),
        (lambda a: a["tasks"][1].__setitem__("task", "a"), r"tasks \['a', 'a'\] name a task twice"),
        (lambda a: a["order"].append(0), r"\d+ examples in the order but the host covers 16 positions"),
        (lambda a: a.__setitem__("skipped", True), "of a skipped step \\(which reads none\\)"),
        (lambda a: a.pop("order"), "does not have the expected shape: KeyError: 'order'"),
        (lambda a: a.__setitem__("order", "AAAA"), "whole int64 values"),
        (lambda a: a.__setitem__("order", [0.5]), "int64 integers only, not 0.5"),
        (lambda a: a["positions"].__setitem__("start", "0"), "'start' must be an integer but is '0'"),
        (lambda a: a["tasks"][0]["reads"].pop("byte_length"), r"must be columns \('shard'"),
        (
            lambda a: a["tasks"][0]["files"][0].__setitem__("uri", ""),
            "URI of shard 0 of task 'a' must be a non-empty",
        ),
        (
            lambda a: a.__setitem__("global_batch_size", 0),
            "global batch size must be an integer >= 1 but got 0",
        ),
    ],
)
def test_bad_answers_are_refused_naming_what_disagrees(change, message):
    answer = good_answer()
    from_json(answer)
    with pytest.raises(ReadsError, match=message):
        from_json(_edit(answer, change))


def compact_answer() -> dict:
    plan = make_plan({"a": (5, 7), "b": (9,)}, {"a": 1, "b": 1})
    return json.loads(to_json(step_reads(tables_of(plan), 0, 0, 1), "compact"))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a: a.__setitem__("order", "u3:AAAA"), r"one of \['i8', 'u1', 'u2', 'u4'\], and a colon, not 'u3'"),
        (lambda a: a.__setitem__("order", "u2:AAAA"), "a u2 column must hold whole 2-byte values, not 3 bytes"),
        (lambda a: a["tasks"][0]["reads"].__setitem__("count", "u1:AQ=="), "must have one length"),
        (lambda a: a["tasks"][0]["names"].pop("digits"), "file names are prefix, digits and suffix"),
        (lambda a: a["tasks"][0]["names"].__setitem__("digits", 0), "Digits of task 'a'.s file names must be"),
        (lambda a: a["tasks"][0]["names"].__setitem__("prefix", 7), "a file name prefix and suffix are strings"),
        (lambda a: a["tasks"][0].__setitem__("files", []), r"is this client older than the server"),
        (lambda a: a["tasks"][0].pop("names"), r"not \['reads', 'task', 'version'\]"),
    ],
)
def test_bad_compact_answers_are_refused_naming_what_disagrees(change, message):
    answer = compact_answer()
    from_json(answer)
    with pytest.raises(ReadsError, match=message):
        from_json(_edit(answer, change))


def test_compact_answers_name_files_by_their_pattern_and_are_smaller():
    plan = make_plan({"a": tuple(range(2, 30)), "b": (9, 40)}, {"a": 3, "b": 1})
    reads = step_reads(tables_of(plan), 7, 0, 1)
    compact, base64 = to_json(reads, "compact"), to_json(reads, "base64")
    assert from_json(compact) == from_json(base64) == reads
    assert [t.cache.uris for t in from_json(compact).tasks] == [
        tuple(t.cache.uri(s) for s in t.files.tolist()) for t in reads.tasks
    ]
    assert len(compact) < len(base64)
    # Files that no pattern names cannot be sent compactly: the error says which encoding to ask for.
    odd = CacheFiles.of("a", "v1", ("/x/first", "/x/second"))
    with pytest.raises(ReadsError, match="not named prefix \\+ zero-padded shard number \\+ suffix .* encoding=base64"):
        odd.names_json  # noqa: B018


def test_files_are_named_by_shard_in_full_tables_and_in_decoded_answers():
    files = CacheFiles.of("a", "v1", ("/x/0", "/x/1", "/x/2"))
    assert files.uri(2) == "/x/2" and files.files_json(np.array([0, 2])) == (
        b'{"shard":0,"uri":"/x/0"},{"shard":2,"uri":"/x/2"}'
    )
    listed = CacheFiles("a", "v1", np.array([1, 5], np.int64), ("/x/1", "/x/5"))
    assert listed.uri(5) == "/x/5" and listed.rows(np.array([5, 1])).tolist() == [1, 0]
    with pytest.raises(ReadsError, match=r"no file is given for shards \[2\]"):
        listed.uri(2)
    with pytest.raises(ReadsError, match=r"file shards must ascend from 0 up, each once, but are \[5, 1\]"):
        CacheFiles("a", "v1", np.array([5, 1], np.int64), ("/x/5", "/x/1"))


def test_run_tables_must_match_the_plan():
    plan = make_plan({"a": (5, 7), "b": (3,)}, {"a": 1, "b": 1})
    with pytest.raises(PlanError, match=r"reads tasks \['a', 'b'\] but its shard tables are of \['b', 'a'\]"):
        RunTables.of(plan, [MemoryTable("b", (3,)), MemoryTable("a", (5, 7))])
    with pytest.raises(PlanError, match="plans 2 shards of task 'a' but its cache version 'v1' has 3"):
        RunTables.of(plan, [MemoryTable("a", (5, 7, 1)), MemoryTable("b", (3,))])


def test_host_slices_follow_the_number_of_hosts():
    assert [host_slice_for(h, 8, 4) for h in range(8)] == [(h // 2, 4) for h in range(8)]
    assert [host_slice_for(h, 4, 4) for h in range(4)] == [(h, 4) for h in range(4)]
    assert [host_slice_for(h, 2, 4) for h in range(2)] == [(0, 2), (1, 2)]
    assert host_slice_for(0, 1, 4) == (0, 1)
    with pytest.raises(
        PlanError, match=r"Number of hosts \(3\) must be a multiple or a divisor of the number of data"
    ):
        host_slice_for(0, 3, 4)
    with pytest.raises(PlanError, match=r"Host must be an integer in \[0, 2\) but got 2"):
        host_slice_for(2, 2, 4)
    with pytest.raises(PlanError, match="positions cannot be cut into 3 equal host slices"):
        step_slices(tables_of(make_plan({"a": (5, 7)}, None)), 0, 3)
