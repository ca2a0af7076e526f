"""The numpy feature converters on seqio's own documented examples (literal values), and their contracts."""

from __future__ import annotations

import numpy as np
import pytest

from taskdata.example.packing import assemble_row
from trainer_client.features import (
    DecoderFeatures,
    EncDecFeatures,
    FeatureConversionError,
    example_lengths,
    nonpadding,
    shift_left,
    shift_right,
)


def row(values, length):
    return np.array([list(values) + [0] * (length - len(values))], np.int32)


def packed(examples, lengths):
    return {k: v[None, :].astype(np.int32) for k, v in
            assemble_row([{k: np.array(v) for k, v in e.items()} for e in examples], lengths).items()}


def test_shift_right_is_seqio_s_make_autoregressive_inputs():
    # seqio.utils.make_autoregressive_inputs' docstring example.
    targets = np.array([3, 8, 1, 9, 1, 5, 4, 1, 0, 0])
    segments = np.array([1, 1, 1, 2, 2, 3, 3, 3, 0, 0])
    assert shift_right(targets, segment_ids=segments).tolist() == [0, 3, 8, 0, 9, 0, 5, 4, 0, 0]
    assert shift_right(targets).tolist() == [0, 3, 8, 1, 9, 1, 5, 4, 1, 0]
    assert shift_right(targets, bos_id=7, segment_ids=segments).tolist() == [7, 3, 8, 7, 9, 7, 5, 4, 7, 0]


def test_shift_left_fills_each_segment_s_last_position():
    tokens = np.array([[3, 8, 1, 9, 1, 5, 4, 1, 0, 0]])
    segments = np.array([[1, 1, 1, 2, 2, 3, 3, 3, 0, 0]])
    assert shift_left(tokens, segment_ids=segments, fill=-100).tolist() == [
        [8, 1, -100, 1, -100, 4, 1, -100, 0, -100]]
    assert shift_left(tokens, fill=-100).tolist() == [[8, 1, 9, 1, 5, 4, 1, 0, 0, -100]]
    with pytest.raises(FeatureConversionError, match="do not match tokens"):
        shift_left(tokens, segment_ids=segments[:, :5])


def test_lengths_and_padding():
    tokens = np.array([[5, 0, 6, 0, 0], [0, 0, 0, 0, 0], [1, 2, 3, 4, 5]])
    assert example_lengths(tokens).tolist() == [3, 0, 5]
    assert nonpadding(tokens).tolist() == [[1, 0, 1, 0, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]]


def test_enc_dec_packed_is_seqio_s_documented_example():
    # seqio.EncDecFeatureConverter's docstring: two examples packed, task lengths inputs 10, targets 7.
    batch = packed([{"inputs": [7, 8, 5, 1], "targets": [3, 9, 1]}, {"inputs": [8, 4, 9, 3, 1], "targets": [4, 1]}],
                   {"inputs": 10, "targets": 7})
    got = {k: v[0].tolist() for k, v in EncDecFeatures()(batch).items()}
    assert got == {
        "encoder_input_tokens": [7, 8, 5, 1, 8, 4, 9, 3, 1, 0],
        "encoder_segment_ids": [1, 1, 1, 1, 2, 2, 2, 2, 2, 0],
        "encoder_positions": [0, 1, 2, 3, 0, 1, 2, 3, 4, 0],
        "decoder_target_tokens": [3, 9, 1, 4, 1, 0, 0],
        "decoder_input_tokens": [0, 3, 9, 0, 4, 0, 0],
        "decoder_loss_weights": [1, 1, 1, 1, 1, 0, 0],
        "decoder_segment_ids": [1, 1, 1, 2, 2, 0, 0],
        "decoder_positions": [0, 1, 2, 0, 1, 0, 0],
    }
    assert EncDecFeatures().model_lengths({"inputs": 10, "targets": 7}, packed=True) == {
        name: len(values) for name, values in got.items()}


def test_lm_packed_is_seqio_s_documented_example():
    batch = packed([{"targets": [3, 9, 1]}, {"targets": [4, 1]}], {"targets": 6})
    got = {k: v[0].tolist() for k, v in DecoderFeatures()(batch).items()}
    assert got == {
        "decoder_target_tokens": [3, 9, 1, 4, 1, 0],
        "decoder_input_tokens": [0, 3, 9, 0, 4, 0],
        "decoder_loss_weights": [1, 1, 1, 1, 1, 0],
        "decoder_positions": [0, 1, 2, 0, 1, 0],
        "decoder_segment_ids": [1, 1, 1, 2, 2, 0],
    }


def test_prefix_lm_is_seqio_s_documented_examples():
    # PrefixLMFeatureConverter's docstring, example 1 (packed) and example 2 (unpacked, long inputs length).
    # seqio packs the concatenations into rows of 7 + 8; a packed cache's rows hold each feature apart, so
    # the same two examples come in a row of inputs 9 and targets 6: the same 15 positions.
    batch = packed([{"inputs": [7, 8, 5, 1], "targets": [3, 9, 1]}, {"inputs": [8, 4, 9, 3, 1], "targets": [4, 1]}],
                   {"inputs": 9, "targets": 6})
    got = {k: v[0].tolist() for k, v in DecoderFeatures()(batch).items()}
    assert got == {
        "decoder_target_tokens": [7, 8, 5, 1, 3, 9, 1, 8, 4, 9, 3, 1, 4, 1, 0],
        "decoder_input_tokens": [0, 7, 8, 5, 1, 3, 9, 0, 8, 4, 9, 3, 1, 4, 0],
        "decoder_loss_weights": [0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 0],
        "decoder_positions": [0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6, 0],
        "decoder_segment_ids": [1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 0],
        "decoder_causal_attention": [1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0],
    }
    got = {k: v[0].tolist() for k, v in DecoderFeatures()({"inputs": row([9, 4, 6, 1], 10),
                                                           "targets": row([3, 9, 1], 4)}).items()}
    assert got == {
        "decoder_target_tokens": [9, 4, 6, 1, 3, 9, 1, 0, 0, 0, 0, 0, 0, 0],
        "decoder_input_tokens": [0, 9, 4, 6, 1, 3, 9, 1, 0, 0, 0, 0, 0, 0],
        "decoder_loss_weights": [0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0],
        "decoder_causal_attention": [1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    }
    weights = DecoderFeatures(loss_on_targets_only=False)({"inputs": row([9, 4, 6, 1], 10),
                                                           "targets": row([3, 9, 1], 4)})["decoder_loss_weights"]
    assert weights[0].tolist() == [1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0]


def test_an_unpacked_prefix_lm_example_without_targets_gets_one_padding_target():
    got = DecoderFeatures()({"inputs": row([9, 4], 3), "targets": row([], 2)})
    assert got["decoder_target_tokens"][0].tolist() == [9, 4, 0, 0, 0]
    assert got["decoder_causal_attention"][0].tolist() == [1, 1, 1, 0, 0]  # the padding target's position too
    assert got["decoder_loss_weights"][0].tolist() == [0, 0, 0, 0, 0]


def test_bad_batches_and_settings_are_refused_by_name():
    with pytest.raises(FeatureConversionError, match="needs the task feature 'inputs'"):
        EncDecFeatures()({"targets": row([1], 3)})
    with pytest.raises(FeatureConversionError, match="segment ids or positions for \\['inputs'\\] but not"):
        EncDecFeatures()({"inputs": row([1], 3), "targets": row([1], 3), "inputs_segment_ids": row([1], 3),
                          "inputs_positions": row([0], 3)})
    with pytest.raises(FeatureConversionError, match="takes task features \\['inputs', 'targets'\\]"):
        EncDecFeatures().model_lengths({"targets": 4}, packed=False)
    with pytest.raises(FeatureConversionError, match="bos_id must be an integer >= 0"):
        DecoderFeatures(bos_id=-1)
    with pytest.raises(FeatureConversionError, match="loss_on_targets_only must be True or False"):
        DecoderFeatures(loss_on_targets_only=1)  # type: ignore[arg-type]
