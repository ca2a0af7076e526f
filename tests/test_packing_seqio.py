"""Packed caches against real seqio 0.0.20: its trim_and_pack_dataset makes the same rows, and its cached-task
reader and t5x's feature converters read a packed cache as already-packed data."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from taskdata.example import decode_example
from taskdata.example.packing import assemble_row, plan_rows, unpack_row
from taskdata.seqio_bridge import add_cached_task, import_seqio
from tests.cache_helpers import build, origins, records_of
from tests.cache_tasks import PACKED_LENGTHS

seqio = import_seqio()
import tensorflow as tf  # noqa: E402  (after seqio, which import_seqio prepares)

pytestmark = pytest.mark.slow  # cache jobs (Beam)

BYTES = {"inputs": seqio.Feature(seqio.ByteVocabulary(extra_ids=125)),
         "targets": seqio.Feature(seqio.ByteVocabulary(extra_ids=125))}
LAYOUT = [f"{k}{suffix}" for k in PACKED_LENGTHS for suffix in ("", "_segment_ids", "_positions")]


@pytest.fixture(autouse=True)
def _worker_import_path(monkeypatch):
    root = str(Path(__file__).resolve().parent.parent)
    monkeypatch.setenv("PYTHONPATH", root + os.pathsep + os.environ.get("PYTHONPATH", ""))


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return build(tmp_path_factory.mktemp("seqio_packed") / "caches", task="toy_packed", num_shards=2).version_dir


def rows_and_examples(version_dir):
    """Every row of the cache, and the examples it holds (segment order)."""
    out = []
    for record in records_of(version_dir):
        row = decode_example(record)
        out.append((row, unpack_row(row, list(PACKED_LENGTHS), len(origins(row)))))
    return out


def seqio_pack(examples):
    """seqio's own trim_and_pack_dataset over ``examples`` at the cache's row lengths."""
    dataset = tf.data.Dataset.from_generator(
        lambda: ({k: np.asarray(e[k], np.int32) for k in PACKED_LENGTHS} for e in examples),
        output_signature={k: tf.TensorSpec([None], tf.int32) for k in PACKED_LENGTHS})
    return list(seqio.utils.trim_and_pack_dataset(dataset, PACKED_LENGTHS).as_numpy_iterator())


def test_every_cached_row_is_the_row_seqio_packs_from_its_examples(packed):
    for row, examples in rows_and_examples(packed)[:12]:
        (theirs,) = seqio_pack(examples)
        assert sorted(theirs) == sorted(LAYOUT)
        for name in LAYOUT:
            np.testing.assert_array_equal(row[name], theirs[name], err_msg=name)


def test_with_one_open_row_the_rows_are_seqio_s_greedy_packing_of_the_same_stream(packed):
    # seqio packs greedily within windows of max(lengths) = 128 examples: one window's worth, in cache order.
    examples = [e for _, segment in rows_and_examples(packed) for e in segment][:128]
    sizes = np.array([[len(e[k]) for k in PACKED_LENGTHS] for e in examples])
    ours = [assemble_row([examples[i] for i in members], PACKED_LENGTHS)
            for members in plan_rows(sizes, list(PACKED_LENGTHS.values()), open_rows=1)]
    theirs = seqio_pack(examples)
    assert len(ours) == len(theirs) > 10
    for mine, seqio_row in zip(ours, theirs, strict=True):
        for name in LAYOUT:
            np.testing.assert_array_equal(mine[name], seqio_row[name], err_msg=name)
    first_fit = plan_rows(sizes, list(PACKED_LENGTHS.values()), open_rows=16)
    assert len(first_fit) <= len(theirs)


def test_seqio_reads_a_packed_cache_as_already_packed_data(packed):
    task = seqio.get_mixture_or_task(add_cached_task(packed, BYTES))
    rows = rows_and_examples(packed)
    kwargs = dict(task_feature_lengths=PACKED_LENGTHS, dataset_split="train", shuffle=False, use_cached=True,
                  num_epochs=1, batch_size=4)
    batch = next(seqio.get_dataset(task.name, feature_converter=seqio.EncDecFeatureConverter(pack=False),
                                   **kwargs).as_numpy_iterator())
    assert batch["encoder_input_tokens"].shape == (4, 64) and batch["decoder_target_tokens"].shape == (4, 128)
    segments = 0
    for i, (row, _) in enumerate(rows[:4]):
        np.testing.assert_array_equal(batch["encoder_input_tokens"][i], row["inputs"])
        np.testing.assert_array_equal(batch["decoder_target_tokens"][i], row["targets"])
        # The converter sees targets_segment_ids: every example's decoder input starts afresh with BOS (0).
        ids = row["targets_segment_ids"]
        starts = np.flatnonzero((ids > 0) & (row["targets_positions"] == 0))
        assert (batch["decoder_input_tokens"][i][starts] == 0).all()
        segments += len(starts)
        inside = np.flatnonzero((ids > 0) & (row["targets_positions"] > 0))
        np.testing.assert_array_equal(batch["decoder_input_tokens"][i][inside], row["targets"][inside - 1])
        assert batch["decoder_loss_weights"][i].sum() == (ids > 0).sum()
    assert segments > 4  # the rows hold several examples
    # seqio parses each row's provenance as [examples, 4] (info: shape [None, 4]), one entry per segment.
    stored = list(task.get_dataset(split="train", use_cached=True, shuffle=False).as_numpy_iterator())
    assert all(r["provenance/origin"].shape == (r["targets_segment_ids"].max(), 4) for r in stored)
    assert sorted(r["provenance/origin"].tolist() for r in stored) == sorted(origins(row).tolist() for row, _ in rows)
    kwargs["task_feature_lengths"] = {name: PACKED_LENGTHS[name.split("_")[0]] for name in LAYOUT}
    prepacked = next(seqio.get_dataset(task.name, feature_converter=seqio.PrePackedEncDecFeatureConverter(pack=False),
                                       **kwargs).as_numpy_iterator())
    for i, (row, _) in enumerate(rows[:4]):
        for ours, theirs in (("inputs_segment_ids", "encoder_segment_ids"), ("inputs_positions", "encoder_positions"),
                             ("targets_segment_ids", "decoder_segment_ids"), ("targets_positions", "decoder_positions")):
            np.testing.assert_array_equal(prepacked[theirs][i], row[ours], err_msg=ours)
