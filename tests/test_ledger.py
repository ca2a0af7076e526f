"""The ledger both ways, the summary and the plot, over small real caches and a run with stages and skips.

References are brute force: the examples of every step by the index math (``global_batch``), record bytes
read and decoded whole with the cache's own reader, counts by walking the steps.
"""

from __future__ import annotations

import dataclasses
import struct
import zlib
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskdata.cache.shuffle import shard_of_key, shuffle_key
from taskdata.example import decode_example
from taskdata.index import BatchSchedule, SkipRange, Stage, global_batch
from taskdata.runs import LedgerError, example_ledger, format_summary, open_views, step_ledger, summarize
from taskdata.runs.plot import plot_run
from taskdata.seeding import format_example_id, parse_example_id
from tests.run_helpers import mix_run, shared_caches

pytestmark = pytest.mark.slow  # cache jobs (Beam)

STAGES = (
    Stage(5, {"toy_det": 1, "toy_random": 0, "toy_text": 3}),
    Stage(9, schedule=BatchSchedule.ramp(8, 32, 6, multiple_of=4)),
    Stage(20, {"toy_det": 0, "toy_random": 1, "toy_text": 0}),
)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return shared_caches(tmp_path_factory)


@pytest.fixture(scope="module")
def plan(root):
    return mix_run(root, name="staged", stages=STAGES, skip=(SkipRange(7, 8),)).plan


@pytest.fixture(scope="module")
def views(plan, root):
    views = open_views(plan, str(root))
    yield views
    for view in views.values():
        view.close()


@pytest.fixture(scope="module")
def readers(plan, views):
    return {task: view.reader for task, view in views.items()}


def whole_record(readers, plan, task: str, shard: int, record: int) -> dict:
    return decode_example(readers[task].read(plan.split, shard, record, 1)[0])


# --- by step ------------------------------------------------------------------------------------


@pytest.mark.parametrize("step", [0, 4, 5, 7, 9, 12, 19, 20, 33, 10**6, 10**9])
def test_a_step_ledger_lists_the_global_batch_with_each_records_own_provenance(plan, views, readers, step):
    ledger = step_ledger(plan, views, step)
    batch = [e for e in global_batch(plan, step)] if not plan.is_skipped(step) else None
    positions = plan.positions(step)
    assert ledger.positions == positions and ledger.skipped == plan.is_skipped(step) == (step == 7)
    assert ledger.stage == plan.stage_at(step) and ledger.global_batch_size == len(positions)
    if batch is not None:
        assert [(e.position, e.task, e.epoch, e.shard, e.record) for e in ledger.entries] == [
            (e.position, e.task, e.epoch, e.shard, e.record) for e in batch
        ]
    per_shard = len(positions) // plan.num_data_shards
    for entry in ledger.entries:
        assert entry.data_shard == (entry.position - positions.start) // per_shard
        example = whole_record(readers, plan, entry.task, entry.shard, entry.record)
        source_shard, ordinal, first, more = example["provenance/origin"].tolist()
        assert entry.id == format_example_id(entry.task, plan.split, source_shard, ordinal)
        assert entry.source_file == readers[entry.task].manifest.split(plan.split).source_files[source_shard]
        assert entry.documents == (first, first + more)
    assert ledger.fingerprint == plan.fingerprint_before(step + 1)
    # The JSON body is made from the columns directly: the entries' own dicts, in order.
    assert ledger.to_dict()["examples"] == [entry.to_dict() for entry in ledger.entries]
    assert [list(example) for example in ledger.to_dict()["examples"][:1]] == [list(e.to_dict()) for e in ledger.entries[:1]]
    # A host's slice is its data shard's part of the global batch.
    host = step_ledger(plan, views, step, host=5, num_hosts=8)  # hosts 4 and 5 share data shard 2
    assert host.data_shard == 2 and host.entries == tuple(e for e in ledger.entries if e.data_shard == 2)


def test_a_step_ledger_refuses_half_a_host_and_a_host_count_that_does_not_fit(plan, views):
    with pytest.raises(LedgerError, match="Give both host and num_hosts"):
        step_ledger(plan, views, 3, host=1)
    with pytest.raises(LedgerError, match=r"Number of hosts \(6\) must be a multiple or a divisor of the number of data shards"):
        step_ledger(plan, views, 3, host=1, num_hosts=6)


# --- by example ----------------------------------------------------------------------------------


def test_every_record_is_found_by_its_stable_id(plan, views):
    for task, view in views.items():
        for shard, count in enumerate(view.record_counts):
            ids = view.ids(np.full(count, shard), np.arange(count))
            for record, example_id in enumerate(ids):
                assert view.find(example_id) == (shard, record)
                _, split, source_shard, ordinal = parse_example_id(example_id)
                key = shuffle_key(view.seed, task, split, source_shard, ordinal)
                assert shard_of_key(key, len(view.record_counts)) == shard


def test_an_id_the_cache_does_not_hold_is_an_error_naming_the_shard(views):
    view = views["toy_det"]
    with pytest.raises(LedgerError, match=r"holds no example 'toy_det/train/0/100000': its shuffle key would put it in shard \d"):
        view.find("toy_det/train/0/100000")
    with pytest.raises(LedgerError, match="this cache is task 'toy_det', split 'train'"):
        view.find("toy_det/validation/0/1")
    with pytest.raises(LedgerError, match="expected 'task/split/shard/ordinal'"):
        view.find("toy_det/train/zero/1")


def brute_reads(plan, task, shard, record, from_step, until_step):
    """(epoch, step, position, data shard, skipped) of every read, by walking every step."""
    out = []
    for step in range(from_step, until_step):
        positions = plan.positions(step)
        per_shard = len(positions) // plan.num_data_shards
        for e in global_batch(dataclasses.replace(plan, skip=()), step):  # skipped steps too
            if (e.task, e.shard, e.record) == (task, shard, record):
                out.append((e.epoch, step, e.position, (e.position - positions.start) // per_shard, plan.is_skipped(step)))
    return out


@pytest.mark.parametrize("task", ["toy_det", "toy_random", "toy_text"])
def test_an_example_ledger_lists_exactly_the_steps_that_read_it(plan, views, task):
    view = views[task]
    for shard, record in [(0, 0), (1, view.record_counts[1] - 1)]:
        example_id = view.ids(np.array([shard]), np.array([record]))[0]
        expected = brute_reads(plan, task, shard, record, 3, 90)
        ledger = example_ledger(plan, views, example_id, from_step=3, until_step=90, limit=1000)
        got = [(r.epoch, r.step, r.position, r.data_shard, r.skipped) for r in ledger.reads]
        assert got == expected and ledger.total == len(expected) and not ledger.truncated
        assert ledger.skipped == sum(1 for read in expected if read[4])
        assert (ledger.shard, ledger.record, ledger.task) == (shard, record, task)
        short = example_ledger(plan, views, example_id, from_step=3, until_step=90, limit=1)
        assert short.reads == ledger.reads[:1] and short.truncated == (len(expected) > 1)


def test_a_task_left_out_of_the_last_stage_is_read_no_more(plan, views):
    view = views["toy_det"]  # rate 0 from step 20 on
    example_id = view.ids(np.array([0]), np.array([0]))[0]
    ledger = example_ledger(plan, views, example_id, limit=1000)
    assert ledger.reads and ledger.reads[-1].step < 20 and not ledger.truncated and ledger.total is None
    everything = example_ledger(plan, views, example_id, until_step=10**15, limit=1000)
    assert everything.total == len(ledger.reads) == len(everything.reads)


@given(step=st.one_of(st.integers(0, 60), st.integers(0, 10**9)), data=st.data())
@settings(max_examples=40, deadline=None)
def test_step_to_example_to_step_round_trips(plan, views, step, data):
    ledger = step_ledger(plan, views, step)
    entry = data.draw(st.sampled_from(ledger.entries))
    # A small task's example can be read more than once in one step (one read per epoch the step spans):
    # the entry is the read at its own position among the step's reads of that example.
    found = example_ledger(plan, views, entry.id, from_step=step, until_step=step + 1, limit=len(ledger.entries))
    assert (found.shard, found.record, found.index) == (entry.shard, entry.record, entry.index)
    at_step = [read for read in found.reads if read.step == step]
    assert len(at_step) == len(found.reads) and not found.truncated
    (read,) = [read for read in at_step if read.position == entry.position]
    assert (read.epoch, read.data_shard) == (entry.epoch, entry.data_shard)
    assert read.skipped == ledger.skipped
    # The reads before this one are exactly the entry's epoch (one read per epoch).
    before = example_ledger(plan, views, entry.id, until_step=step, limit=0).total
    assert before is not None
    assert before + sum(other.position < entry.position for other in at_step) == entry.epoch


# --- summary --------------------------------------------------------------------------------------


@pytest.mark.parametrize("step", [0, 7, 8, 21, 60])
def test_the_summary_counts_what_the_steps_before_read(plan, views, root, step):
    summary = summarize(plan, views, step)
    no_skips = dataclasses.replace(plan, skip=())
    taken = {t: 0 for t in plan.task_names}
    skipped = dict(taken)
    for s in range(step):
        for e in global_batch(no_skips, s):
            taken[e.task] += 1
            skipped[e.task] += plan.is_skipped(s)
    total = sum(taken.values())
    assert summary["positions"] == total == plan.first_position(step)
    for t in summary["tasks"]:
        name = t["task"]
        records = plan.layouts[plan.task_index(name)].num_records
        assert (t["taken"], t["skipped"], t["delivered"]) == (taken[name], skipped[name], taken[name] - skipped[name])
        assert t["epoch"] == taken[name] // records and t["repeated"] == max(0, taken[name] - records)
        if total:
            assert t["share"] == pytest.approx(taken[name] / total)
            # The rates of each stage over the positions it covered, exactly; realised within each stage's
            # bound (below one example for three tasks) per stage so far.
            assert abs(t["share"] - t["target_share"]) * total <= 1 + plan.mixing.segment_of(total)
        assert Fraction(t["exact_stage_rate"]) == plan.rates_at(step)[name]
        stats = views[name].stats()
        for feature, count in t["tokens"].items():
            mean = stats[f"{feature}_tokens"] / stats["examples"]
            assert count["value"] == pytest.approx(t["delivered"] * mean, abs=1)
    assert summary["stage"]["index"] == plan.stage_at(step) and summary["stage"]["batch_size"] == plan.batch_size(step)
    # Bytes per data shard: the framed records each one reads, from the shard files themselves.
    hosts = summary["hosts"]
    if plan.is_skipped(step):
        assert hosts["skipped"] and hosts["bytes"] == [0] * plan.num_data_shards
    else:
        per_shard = [0] * plan.num_data_shards
        ledger = step_ledger(plan, views, step)
        for e in ledger.entries:
            offsets = views[e.task].reader.shard_offsets(plan.split, e.shard)
            per_shard[e.data_shard] += int(offsets[e.record + 1] - offsets[e.record])
        assert hosts["bytes"] == per_shard and sum(hosts["examples"]) == plan.batch_size(step)
    assert f"before step {step:,}" in format_summary(summary)


def test_tokens_of_whole_epochs_are_exact_and_others_are_marked_estimates(root):
    plan = mix_run(
        root, name="solo_det", mixture="toy_det", schedule=BatchSchedule.constant(115), num_data_shards=1
    ).plan
    views = open_views(plan, str(root))
    try:
        assert plan.layouts[0].num_records == 345  # three steps make one epoch
        stats = views["toy_det"].stats()
        tokens = summarize(plan, views, 6)["tasks"][0]["tokens"]
        assert tokens == {f: {"value": 2 * stats[f"{f}_tokens"], "exact": True} for f in ("inputs", "targets")}
        summary = summarize(plan, views, 4)
        assert not any(count["exact"] for count in summary["tasks"][0]["tokens"].values())
        assert "~" in format_summary(summary) and "~ estimated" in format_summary(summary)
    finally:
        for view in views.values():
            view.close()


# --- plot -----------------------------------------------------------------------------------------


def test_the_plot_is_a_png_of_the_run(plan, views, tmp_path):
    out = tmp_path / "run.png"
    drawn = plot_run(plan, views, str(out), until_step=40)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 1000 and height >= 900
    assert zlib.crc32(data[12:29]) == struct.unpack(">I", data[29:33])[0]  # the IHDR chunk is whole
    assert drawn == {"until_step": 40, "points": 41, "stages": 3, "histograms": list(plan.task_names)}
