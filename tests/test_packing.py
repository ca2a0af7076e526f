"""Packing as pure functions: which examples share a row, the t5x layout of a row, and back."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskdata.define.features import Feature
from taskdata.define.packing import Packing
from taskdata.define.task import Task
from taskdata.example.packing import assemble_row, plan_rows, trim_to_length, unpack_row
from taskdata.sources import FunctionSource
from tests.cache_tasks import FEATURES, SPLITS, EncodeText, synthetic_documents


def test_first_fit_fills_an_older_open_row_before_opening_a_new_one():
    sizes = np.array([[6], [6], [3], [4], [1]])
    assert plan_rows(sizes, [10], open_rows=2) == [[0, 2, 4], [1, 3]]
    # One open row is next fit: a row closes as soon as an example does not fit it.
    assert plan_rows(sizes, [10], open_rows=1) == [[0], [1, 2], [3, 4]]


def test_a_full_window_closes_its_oldest_row_and_rows_come_out_in_closing_order():
    sizes = np.array([[9], [9], [9], [1]])
    assert plan_rows(sizes, [10], open_rows=2) == [[0], [1, 3], [2]]


def test_every_feature_must_fit_for_an_example_to_join_a_row():
    # Example 1 fits row 0's inputs but not its targets; example 2 fits both.
    sizes = np.array([[2, 9], [2, 2], [5, 1]])
    assert plan_rows(sizes, [8, 10], open_rows=4) == [[0, 2], [1]]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 12), st.integers(1, 12)), max_size=60), st.integers(1, 6))
def test_every_example_is_in_exactly_one_row_and_no_row_overflows(sizes, open_rows):
    array = np.array(sizes, dtype=np.int64).reshape(len(sizes), 2)
    rows = plan_rows(array, [12, 16], open_rows)
    assert sorted(i for row in rows for i in row) == list(range(len(sizes)))
    for row in rows:
        assert row == sorted(row) and row
        assert (array[row].sum(axis=0) <= [12, 16]).all()


def test_an_example_longer_than_a_row_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"Example 1 has \[11\] tokens, more than a row holds \(\[10\]\); trim"):
        plan_rows(np.array([[3], [11]]), [10], 2)


def test_a_row_has_t5x_segment_ids_and_positions_and_unpacks_to_its_examples():
    examples = [{"inputs": np.array([8, 7, 1]), "targets": np.array([4, 1])},
                {"inputs": np.array([2, 3, 4, 1]), "targets": np.array([5, 6, 1])}]
    row = assemble_row(examples, {"inputs": 10, "targets": 10})
    # seqio's trim_and_pack_dataset docstring example, value for value.
    assert row["inputs"].tolist() == [8, 7, 1, 2, 3, 4, 1, 0, 0, 0]
    assert row["inputs_segment_ids"].tolist() == [1, 1, 1, 2, 2, 2, 2, 0, 0, 0]
    assert row["inputs_positions"].tolist() == [0, 1, 2, 0, 1, 2, 3, 0, 0, 0]
    assert row["targets"].tolist() == [4, 1, 5, 6, 1, 0, 0, 0, 0, 0]
    assert row["targets_segment_ids"].tolist() == [1, 1, 2, 2, 2, 0, 0, 0, 0, 0]
    assert row["targets_positions"].tolist() == [0, 1, 0, 1, 2, 0, 0, 0, 0, 0]
    back = unpack_row(row, ["inputs", "targets"], 2)
    for got, want in zip(back, examples, strict=True):
        assert {k: v.tolist() for k, v in got.items()} == {k: v.tolist() for k, v in want.items()}


def test_an_example_with_no_tokens_in_a_feature_keeps_its_segment_id_in_the_others():
    examples = [{"inputs": np.array([5, 1]), "targets": np.array([4, 1])},
                {"inputs": np.zeros(0, np.int64), "targets": np.array([6, 1])},
                {"inputs": np.array([7, 1]), "targets": np.array([9, 1])}]
    row = assemble_row(examples, {"inputs": 6, "targets": 6})
    assert row["inputs_segment_ids"].tolist() == [1, 1, 3, 3, 0, 0]
    assert row["targets_segment_ids"].tolist() == [1, 1, 2, 2, 3, 3]
    assert unpack_row(row, ["inputs"], 3)[1]["inputs"].tolist() == []


def test_trimming_keeps_eos_for_add_eos_features_and_cuts_plainly_otherwise():
    value = np.array([5, 6, 7, 8, 1])
    assert trim_to_length(value, 3, eos_id=1).tolist() == [5, 6, 1]
    assert trim_to_length(value, 3, eos_id=None).tolist() == [5, 6, 7]
    assert trim_to_length(value, 5, eos_id=1) is value


def _task(**kwargs):
    return Task("t", FunctionSource(synthetic_documents, SPLITS), [EncodeText()], FEATURES, **kwargs)


def test_a_packed_task_needs_lengths_for_every_output_feature():
    with pytest.raises(ValueError, match="asks for packing but has no sequence_length"):
        _task(packing=Packing())
    with pytest.raises(ValueError, match=r"output features \['inputs'\] have no packing length"):
        _task(packing=Packing({"targets": 64}))
    with pytest.raises(ValueError, match=r"packing lengths name \['labels'\], which are not output features"):
        _task(packing=Packing({"inputs": 8, "targets": 8, "labels": 4}))
    with pytest.raises(ValueError, match="Packing open_rows must be a positive integer but got 0"):
        Packing(open_rows=0)
    text = {"inputs": FEATURES["inputs"], "targets": Feature(FEATURES["targets"].vocabulary, dtype="string")}
    with pytest.raises(ValueError, match="'targets' \\(string, rank 1\\) cannot be packed"):
        Task("t", FunctionSource(synthetic_documents, SPLITS), [], text, sequence_length={"inputs": 4, "targets": 4},
             packing=Packing())


def test_packing_changes_the_fingerprint_and_an_unpacked_task_keeps_its_own():
    plain = _task(sequence_length={"inputs": 64, "targets": 256})
    packed = plain.with_packing()
    assert "packing" not in plain.fingerprint_description() and "packing" not in plain.component_fingerprints()
    assert packed.fingerprint() != plain.fingerprint()
    assert packed.packing_lengths == {"inputs": 64, "targets": 256}
    # The lengths are described as resolved: naming the sequence lengths explicitly is the same task.
    assert plain.with_packing(Packing({"inputs": 64, "targets": 256})).fingerprint() == packed.fingerprint()
    assert plain.with_packing(Packing(open_rows=1)).fingerprint() != packed.fingerprint()
