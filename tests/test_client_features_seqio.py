"""The numpy feature converters against real seqio 0.0.20 on the same examples: unpacked, packed (rows as a
packed cache holds them) and prefix LM, element for element."""

from __future__ import annotations

import numpy as np
import pytest

from taskdata.example.packing import assemble_row, plan_rows
from taskdata.seqio_bridge import import_seqio
from trainer_client.features import DecoderFeatures, EncDecFeatures

pytestmark = pytest.mark.slow

seqio = import_seqio()
import tensorflow as tf  # noqa: E402  (after seqio, which import_seqio prepares)

LENGTHS = {"inputs": 12, "targets": 9}
ROW_LENGTHS = {"inputs": 24, "targets": 18}


def examples(count, seed, *, empty_targets=False):
    rng = np.random.default_rng(seed)
    return [{"inputs": rng.integers(1, 300, int(rng.integers(1, LENGTHS["inputs"] + 1))).astype(np.int32),
             "targets": rng.integers(1, 300, int(rng.integers(0 if empty_targets else 1, LENGTHS["targets"] + 1)))
             .astype(np.int32)} for _ in range(count)]


def dataset(items, keys=("inputs", "targets")):
    return tf.data.Dataset.from_generator(lambda: ({k: e[k] for k in keys} for e in items),
                                          output_signature={k: tf.TensorSpec([None], tf.int32) for k in keys})


def padded(items, lengths):
    """A host batch as DataIterator gives it: each feature zero-padded to its length."""
    return {k: np.stack([np.pad(e[k], (0, n - len(e[k]))) for e in items]).astype(np.int32) for k, n in lengths.items()}


def rows_of(items, lengths, open_rows=16):
    """The examples grouped into rows as the cache job packs them (``Packing(open_rows=...)``), and those
    rows as a host batch."""
    sizes = np.array([[len(e[k]) for k in lengths] for e in items])
    groups = [[items[i] for i in members] for members in plan_rows(sizes, list(lengths.values()), open_rows)]
    rows = [assemble_row(group, lengths) for group in groups]
    return groups, {k: np.stack([r[k] for r in rows]).astype(np.int32) for k in rows[0]}


def theirs(converter, items, lengths, keys=("inputs", "targets")):
    return list(converter(dataset(items, keys), lengths).as_numpy_iterator())


def assert_equal(ours, seqio_rows):
    assert sorted(ours) == sorted(seqio_rows[0])
    for name, array in ours.items():
        np.testing.assert_array_equal(array, np.stack([r[name] for r in seqio_rows]), err_msg=name)


def test_unpacked_examples_give_seqio_s_features():
    items = examples(32, seed=1)
    assert_equal(EncDecFeatures()(padded(items, LENGTHS)),
                 theirs(seqio.EncDecFeatureConverter(pack=False), items, LENGTHS))
    assert_equal(DecoderFeatures()(padded(items, {"targets": 9})),
                 theirs(seqio.LMFeatureConverter(pack=False), items, {"targets": 9}, keys=("targets",)))
    assert_equal(EncDecFeatures(bos_id=5)(padded(items, LENGTHS)),
                 theirs(seqio.EncDecFeatureConverter(pack=False, bos_id=5), items, LENGTHS))


@pytest.mark.parametrize("loss_on_targets_only", [True, False])
def test_unpacked_prefix_lm_gives_seqio_s_features_also_without_targets(loss_on_targets_only):
    items = examples(32, seed=2, empty_targets=True)
    assert any(len(e["targets"]) == 0 for e in items)
    ours = DecoderFeatures(loss_on_targets_only=loss_on_targets_only)(padded(items, LENGTHS))
    assert_equal(ours, theirs(seqio.PrefixLMFeatureConverter(pack=False, loss_on_targets_only=loss_on_targets_only),
                              items, LENGTHS))
    assert_equal(ours, theirs(seqio.DecoderFeatureConverter(pack=False, loss_on_targets_only=loss_on_targets_only),
                              items, LENGTHS))


def test_packed_rows_give_what_seqio_packs_from_the_same_examples():
    # With one open row the cache's rows are seqio's greedy packing of the same stream (within seqio's
    # window of max(lengths) examples), so seqio converts the examples and we convert the rows.
    items = examples(24, seed=3)
    groups, batch = rows_of(items, ROW_LENGTHS, open_rows=1)
    assert len(groups) < 12  # several examples per row
    ours = EncDecFeatures()(batch)
    assert_equal(ours, theirs(seqio.EncDecFeatureConverter(pack=True), items, ROW_LENGTHS))
    prepacked = seqio.PrePackedEncDecFeatureConverter(pack=False)(
        tf.data.Dataset.from_tensor_slices(batch), {k: ROW_LENGTHS[k.split("_")[0]] for k in batch})
    assert_equal(ours, list(prepacked.as_numpy_iterator()))

    targets = [{"targets": e["targets"]} for e in examples(32, seed=4)]
    _, lm_batch = rows_of(targets, {"targets": 32}, open_rows=1)
    assert_equal(DecoderFeatures()(lm_batch),
                 theirs(seqio.LMFeatureConverter(pack=True), targets, {"targets": 32}, keys=("targets",)))


@pytest.mark.parametrize("loss_on_targets_only", [True, False])
def test_packed_prefix_lm_rows_give_seqio_s_features(loss_on_targets_only):
    # seqio packs each example's concatenation into rows of inputs + targets, the cache packs each feature
    # in its own length: each cached row's examples alone, seqio packs into that one row.
    groups, batch = rows_of(examples(12, seed=5), ROW_LENGTHS)
    assert len(groups) < 6
    converter = seqio.PrefixLMFeatureConverter(pack=True, loss_on_targets_only=loss_on_targets_only)
    assert_equal(DecoderFeatures(loss_on_targets_only=loss_on_targets_only)(batch),
                 [theirs(converter, g, ROW_LENGTHS)[0] for g in groups])


def test_packed_prefix_lm_without_targets_keeps_seqio_s_tokens_and_aligned_masks():
    # seqio's packing drops the padding target it adds to such an example, but keeps that position's mask
    # values: every mask after it in the row is one position off (here, a loss weight of 1 on padding).
    group = [{"inputs": np.array([41, 5, 19], np.int32), "targets": np.array([39, 6], np.int32)},
             {"inputs": np.array([21], np.int32), "targets": np.array([], np.int32)},
             {"inputs": np.array([48, 5], np.int32), "targets": np.array([36, 12, 21], np.int32)}]
    _, batch = rows_of(group, {"inputs": 8, "targets": 6})
    ours = DecoderFeatures()(batch)
    (seqio_row,) = theirs(seqio.PrefixLMFeatureConverter(pack=True), group, {"inputs": 8, "targets": 6})
    for name in ("decoder_target_tokens", "decoder_input_tokens", "decoder_segment_ids", "decoder_positions"):
        np.testing.assert_array_equal(ours[name][0], seqio_row[name], err_msg=name)
    assert ours["decoder_loss_weights"][0].tolist() == [0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0]
    assert seqio_row["decoder_loss_weights"].tolist() == [0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1, 1, 0, 0]
    assert ours["decoder_causal_attention"][0].tolist() == [1, 1, 1, 1, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0]
    assert seqio_row["decoder_causal_attention"].tolist() == [1, 1, 1, 1, 0, 1, 1, 1, 1, 0, 0, 1, 0, 0]
