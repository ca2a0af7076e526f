"""The column path (``ExampleBatch``): each batch form gives, row by row, what its per-example form gives."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from taskdata.beam.pipeline import _runs_in_columns, encode_cache_record, encode_cache_records
from taskdata.cache.shuffle import shuffle_key, shuffle_keys
from taskdata.cache.stats import FeatureStats
from taskdata.define.registry import Registry
from taskdata.define.task import PreprocessingError
from taskdata.example.encode import encode_example
from taskdata.example.encode_many import encode_int_rows
from taskdata.preprocessors import AppendEos, AppendEosAfterTrim, random_spans_helper
from taskdata.preprocessors.batch import ExampleBatch, Ragged
from tests import cache_tasks


@pytest.fixture
def toy_span():
    registry = Registry()
    cache_tasks.register_tasks(registry)
    return registry.get_task("toy_span")


def _ragged(rng, rows, high=300, dtype=np.int32, max_length=12):
    lengths = rng.integers(0, max_length, rows)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return Ragged(rng.integers(0, high, int(offsets[-1])).astype(dtype), offsets)


def _same_examples(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert list(a) == list(b)
        for key in a:
            if isinstance(a[key], np.ndarray):
                assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), key
            else:
                assert type(a[key]) is type(b[key]) and a[key] == b[key], key


def test_ragged_rows_and_appended_tokens_are_those_of_each_row():
    rng = np.random.default_rng(0)
    for rows in (0, 1, 7, 50):
        column = _ragged(rng, rows)
        assert [r.tolist() for r in column.rows()] == [
            column.values[a:b].tolist() for a, b in zip(column.offsets[:-1], column.offsets[1:], strict=True)]
        for limit in (None, 0, 3, 100):
            appended = column.appended(1, limit)
            want = [np.append(r if limit is None else r[:limit], 1).astype(np.int32) for r in column.rows()]
            assert [r.tolist() for r in appended.rows()] == [w.tolist() for w in want]
            assert appended.values.dtype == np.int32
    matrices = [np.arange(6).reshape(2, 3), np.arange(4).reshape(4, 1)]
    assert [r.tolist() for r in Ragged.from_matrices(matrices).rows()] == [[0, 1, 2], [3, 4, 5], [0], [1], [2], [3]]
    with pytest.raises(ValueError, match="offsets must run from 0 to len"):
        Ragged(np.arange(3), np.array([0, 2]))
    with pytest.raises(ValueError, match="one entry per row"):
        ExampleBatch({"inputs": Ragged(np.arange(3), np.array([0, 3]))}, {"_source_first": np.zeros(2, np.int64)})
    with pytest.raises(ValueError, match="metadata keys start with '_'"):
        ExampleBatch({}, {"source": np.zeros(2, np.int64)})


@pytest.mark.parametrize("inputs_length", [8, 48])  # 8: nearly every row trimmed and counted; 48: none
def test_span_corruption_and_eos_in_columns_are_their_per_example_forms(toy_span, inputs_length):
    targets_length = random_spans_helper(inputs_length, 0.15, 3.0)[1]
    task = dataclasses.replace(toy_span, sequence_length={"inputs": inputs_length, "targets": targets_length})
    assert task.batch_start() == 2 and _runs_in_columns(task)
    windows = 0
    for shard in ("0", "5"):
        by_rows, by_columns = task.shard_context("train", 0, 3), task.shard_context("train", 0, 3)
        want = list(task.process_shard(by_rows, shard))
        batches = list(task.process_shard_batches(by_columns, shard))
        windows = max(windows, len(batches))
        _same_examples([row for batch in batches for row in batch.rows()], want)
        assert by_columns.counters == by_rows.counters
        assert bool(by_rows.counters) == (inputs_length == 8)
    assert windows > 1 or inputs_length == 48  # chunks of 8 tokens: windows of 512 chunks, then the rest
    if inputs_length == 48:  # 3 noise spans a chunk, placed at random: another seed places them elsewhere
        other = [row for batch in task.process_shard_batches(task.shard_context("train", 0, 4), "5")
                 for row in batch.rows()]
        assert any(not np.array_equal(a["inputs"], b["inputs"]) for a, b in zip(other, want, strict=True))


def test_append_eos_after_trim_in_columns_counts_and_cuts_as_per_example(toy_span):
    rng = np.random.default_rng(1)
    batch = ExampleBatch({"inputs": _ragged(rng, 40, max_length=9), "targets": _ragged(rng, 40, max_length=4)},
                         {"_source_first": np.arange(40, dtype=np.int64)})
    ctx = toy_span.shard_context("train", 0, 0, sequence_length={"inputs": 6, "targets": 3})
    ctx_rows = toy_span.shard_context("train", 0, 0, sequence_length={"inputs": 6, "targets": 3})
    (got,) = AppendEosAfterTrim().map_batches(iter([batch]), ctx)
    _same_examples(list(got.rows()), list(AppendEosAfterTrim()(batch.rows(), ctx_rows)))
    assert ctx.counters == ctx_rows.counters and ctx.counters["append_eos_after_trim/inputs_examples_trimmed"] > 0
    assert not hasattr(AppendEos(), "map_batches")  # a task ending in it runs example by example


def test_a_task_without_a_batch_form_at_its_end_runs_example_by_example(toy_span):
    def passthrough(examples, ctx):
        yield from examples

    task = dataclasses.replace(toy_span, preprocessors=(*toy_span.preprocessors, passthrough))
    assert task.batch_start() is None and not _runs_in_columns(task)
    with pytest.raises(ValueError, match="has no batch form.*Use process_shard"):
        next(task.process_shard_batches(task.shard_context("train", 0, 0), "0"))
    registry = Registry()
    cache_tasks.register_tasks(registry)
    assert registry.get_task("toy_det").batch_start() is None


class _GrowThirdExample:
    """Makes the third example's inputs 30 tokens longer, per example and in columns."""

    def __call__(self, examples, ctx):
        for number, example in enumerate(examples):
            yield {**example, "inputs": np.append(example["inputs"], np.ones(30, np.int32))} if number == 2 else example

    def map_batches(self, batches, ctx):
        seen = 0
        for batch in batches:
            rows = batch.tokens["inputs"].rows()
            if seen <= 2 < seen + len(batch):
                rows[2 - seen] = np.append(rows[2 - seen], np.ones(30, np.int32))
            lengths = np.array([len(r) for r in rows], dtype=np.int64)
            inputs = Ragged(np.concatenate(rows), np.concatenate([[0], np.cumsum(lengths)]))
            yield batch.replace_tokens({"inputs": inputs})
            seen += len(batch)


class _BreakOnSecondBatch:
    def __call__(self, examples, ctx):
        raise AssertionError("the per-example form is not used here")

    def map_batches(self, batches, ctx):
        for number, batch in enumerate(batches):
            if number == 1:
                raise RuntimeError("boom")
            yield batch


def test_errors_in_columns_say_where_as_per_example(toy_span):
    task = dataclasses.replace(toy_span, sequence_length={"inputs": 8, "targets": 2},
                               preprocessors=(*toy_span.preprocessors, _GrowThirdExample()))
    assert task.batch_start() == 2
    with pytest.raises(PreprocessingError) as per_example:
        list(task.process_shard(task.shard_context("train", 0, 0), "3"))
    with pytest.raises(PreprocessingError) as in_columns:
        list(task.process_shard_batches(task.shard_context("train", 0, 0), "3"))
    # The same message: example 2 is too long for sequence_length, found by the checks of the columns.
    assert str(in_columns.value) == str(per_example.value)
    assert "checking the output features failed at example 2 of the shard" in str(in_columns.value)
    assert "output feature 'inputs' has length 38 but sequence_length['inputs'] is 8" in str(in_columns.value)
    broken = dataclasses.replace(task, preprocessors=(*toy_span.preprocessors, _BreakOnSecondBatch()))
    with pytest.raises(PreprocessingError, match=r"preprocessor 5 of 5 .*BreakOnSecondBatch.* failed at its input "
                                                 r"batch 1 .*RuntimeError: boom"):
        list(broken.process_shard_batches(broken.shard_context("train", 0, 0), "3"))


def test_encode_int_rows_is_encode_example_row_by_row():
    rng = np.random.default_rng(2)
    for trial in range(200):
        rows = int(rng.integers(0, 15))
        columns = {}
        for key, dtype, low, high in [("inputs", np.int32, 0, 32100), ("targets", np.int32, 0, 70_000),
                                      ("small", np.int32, 1, 2**14), ("two_bytes", np.int16, 1, 2**15 - 1),
                                      ("provenance/origin", np.int64, 0, 2**40), ("z", np.int64, -(2**63), 2**63 - 1),
                                      ("b", np.uint16, 0, 2**16 - 1)]:
            lengths = rng.integers(0, 9, rows)
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            columns[key] = (rng.integers(low, high, int(offsets[-1]), dtype=np.int64).astype(dtype), offsets)
        want = [encode_example({k: v[o[i]:o[i + 1]] for k, (v, o) in columns.items()}) for i in range(rows)]
        assert encode_int_rows(columns) == want, trial
    with pytest.raises(TypeError, match="column 'x' must be a 1-D integer array"):
        encode_int_rows({"x": (np.zeros(2, np.float32), np.array([0, 2]))})
    with pytest.raises(ValueError, match="column 'y' has 2 rows but the others 1"):
        encode_int_rows({"x": (np.zeros(2, np.int32), np.array([0, 2])), "y": (np.zeros(2, np.int32), np.array([0, 1, 2]))})


def test_cache_records_of_a_batch_are_those_of_its_rows():
    rng = np.random.default_rng(3)
    first = rng.integers(0, 10**6, 30)
    batch = ExampleBatch({"inputs": _ragged(rng, 30), "targets": _ragged(rng, 30, high=2**20)},
                         {"_source_first": first, "_source_last": first + rng.integers(0, 4, 30)})
    want = [encode_cache_record(row, 7, 100 + i) for i, row in enumerate(batch.rows())]
    assert encode_cache_records(batch, 7, 100) == want
    floats = ExampleBatch({"x": Ragged(rng.random(6).astype(np.float32), np.array([0, 2, 6]))},
                          {"_source_index": np.array([4, 9])})
    assert encode_cache_records(floats, 1, 0) == [encode_cache_record(r, 1, i) for i, r in enumerate(floats.rows())]
    backwards = ExampleBatch({"x": Ragged(np.arange(2), np.array([0, 1, 2]))},
                             {"_source_first": np.array([3, 5]), "_source_last": np.array([3, 4])})
    with pytest.raises(ValueError, match="Example 1/1 names source documents 5..4"):
        encode_cache_records(backwards, 1, 0)


def test_shuffle_keys_and_statistics_of_a_batch_are_those_of_its_rows():
    assert shuffle_keys(5, "t", "train", 3, 10, 4) == [shuffle_key(5, "t", "train", 3, i) for i in range(10, 14)]
    assert shuffle_keys(6, "t", "train", 3, 10, 4) != shuffle_keys(5, "t", "train", 3, 10, 4)
    rng = np.random.default_rng(4)
    batches = [ExampleBatch({"inputs": _ragged(rng, n), "targets": _ragged(rng, n)}, {}) for n in (5, 0, 9)]
    by_rows, in_columns = FeatureStats(), FeatureStats()
    for batch in batches:
        for row in batch.rows():
            by_rows.add(row, ["inputs", "targets", "absent"])
        in_columns.add_lengths(len(batch), {k: c.lengths for k, c in batch.tokens.items()})
    assert in_columns.to_json() == by_rows.to_json() and in_columns.examples == 14
