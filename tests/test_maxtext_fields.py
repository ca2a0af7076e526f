"""MaxText's six fields from packed LM rows: the shift and the loss mask."""

from __future__ import annotations

import numpy as np
import pytest

from trainer_client.maxtext.fields import FIELDS, maxtext_fields


def rows(*values):
    return np.array(values, dtype=np.int32)


def test_golden_fields_of_a_row_with_two_documents_and_padding():
    tokens = rows([5, 6, 1, 7, 8, 9, 1, 0, 0])
    segments = rows([1, 1, 1, 2, 2, 2, 2, 0, 0])
    positions = rows([0, 1, 2, 0, 1, 2, 3, 0, 0])
    fields = maxtext_fields(tokens, segments, positions)
    assert sorted(fields) == sorted(FIELDS)
    assert fields["inputs"].tolist() == tokens.tolist()
    assert fields["inputs_segmentation"].tolist() == segments.tolist()
    assert fields["inputs_position"].tolist() == fields["targets_position"].tolist() == positions.tolist()
    assert fields["targets"].tolist() == [[6, 1, 7, 8, 9, 1, 0, 0, 0]]
    # No loss where the next token is another document's (after each EOS), past the row's end, or on padding.
    assert fields["targets_segmentation"].tolist() == [[1, 1, 0, 2, 2, 2, 0, 0, 0]]
    assert all(a.dtype == np.int32 and a.shape == (1, 9) for a in fields.values())


def test_a_document_going_on_past_the_row_end_has_no_target_at_the_last_token():
    fields = maxtext_fields(rows([3, 4, 5]), rows([1, 1, 1]), rows([0, 1, 2]))
    assert fields["targets"].tolist() == [[4, 5, 0]]
    assert fields["targets_segmentation"].tolist() == [[1, 1, 0]]


def test_a_zero_row_weighs_nothing_and_rows_are_independent():
    tokens = rows([5, 6, 7, 1], [0, 0, 0, 0])
    fields = maxtext_fields(tokens, rows([1, 1, 1, 1], [0, 0, 0, 0]), rows([0, 1, 2, 3], [0, 0, 0, 0]))
    assert fields["targets_segmentation"].tolist() == [[1, 1, 1, 0], [0, 0, 0, 0]]
    assert fields["targets"].tolist() == [[6, 7, 1, 0], [0, 0, 0, 0]]


def test_the_mask_is_the_next_tokens_segment_where_it_equals_this_ones():
    rng = np.random.default_rng(0)
    segments = np.sort(rng.integers(0, 4, size=(16, 32)), axis=1)
    segments = np.where(segments == 0, 0, segments)
    tokens = rng.integers(3, 50, size=segments.shape) * (segments != 0)
    fields = maxtext_fields(tokens, segments, np.zeros_like(segments))
    following = np.zeros_like(segments)
    following[:, :-1] = segments[:, 1:]
    expected = np.where((following == segments) & (segments != 0), following, 0)
    assert np.array_equal(fields["targets_segmentation"], expected)
    assert np.array_equal(fields["targets"][:, :-1], tokens[:, 1:])


def test_shapes_and_types_are_checked():
    with pytest.raises(ValueError, match=r"integer arrays of one shape \[rows, length\]"):
        maxtext_fields(rows([1, 2]), rows([1, 1, 1]), rows([0, 1]))
    with pytest.raises(ValueError, match=r"integer arrays of one shape"):
        maxtext_fields(np.zeros((1, 2), np.float32), rows([1, 1]), rows([0, 1]))
