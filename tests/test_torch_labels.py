"""Next-token labels for PyTorch LM trainers: the next token within the same example, IGNORE_INDEX elsewhere."""

from __future__ import annotations

import numpy as np
import pytest

from trainer_client.pytorch.labels import IGNORE_INDEX, next_token_labels

X = IGNORE_INDEX


def test_an_unpacked_row_is_labelled_with_its_next_tokens_and_ignored_at_its_end_and_on_padding():
    tokens = np.array([[5, 6, 7, 1, 0, 0], [9, 8, 1, 0, 0, 0]], np.int32)
    assert next_token_labels(tokens).tolist() == [[6, 7, 1, X, X, X], [8, 1, X, X, X, X]]


def test_a_full_row_ignores_only_its_last_position():
    assert next_token_labels(np.array([3, 4, 5, 6])).tolist() == [4, 5, 6, X]


def test_a_packed_rows_labels_never_cross_into_the_next_example():
    tokens = np.array([[11, 12, 1, 21, 22, 23, 1, 31, 0, 0]])
    segments = np.array([[1, 1, 1, 2, 2, 2, 2, 3, 0, 0]])
    assert next_token_labels(tokens, segment_ids=segments).tolist() == [[12, 1, X, 22, 23, 1, X, X, X, X]]


def test_without_segment_ids_a_packed_row_would_cross_examples():
    """The negative control: the segment ids are what stop a label at an example's end."""
    tokens = np.array([[11, 12, 1, 21, 22, 23, 1, 31, 0, 0]])
    segments = np.array([[1, 1, 1, 2, 2, 2, 2, 3, 0, 0]])
    assert next_token_labels(tokens).tolist() != next_token_labels(tokens, segment_ids=segments).tolist()


def test_another_ignore_index_and_the_dtype():
    labels = next_token_labels(np.array([[2, 3, 0]], np.int32), ignore_index=0)
    assert labels.dtype == np.int64 and labels.tolist() == [[3, 0, 0]]


def test_mismatched_segment_ids_and_float_tokens_are_refused_by_name():
    with pytest.raises(ValueError, match=r"Segment ids of shape \(1, 3\) do not match tokens of shape \(1, 4\)"):
        next_token_labels(np.ones((1, 4), np.int32), segment_ids=np.ones((1, 3), np.int32))
    with pytest.raises(ValueError, match="must be an integer array"):
        next_token_labels(np.ones((1, 4), np.float32))
