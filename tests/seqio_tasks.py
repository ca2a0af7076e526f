"""seqio Tasks and a Mixture for the seqio bridge tests, registered in seqio's registries on import, as a
t5x project's task module registers them (with a plain ``import seqio``). Beam workers import it by name
(``--module tests.seqio_tasks``).

The data are five small text files in ``tests/data/seqio`` (one source shard each): every line becomes an
example whose targets are its bytes, with a seeded random drop of tokens before the cache placeholder in
``seqio_toy_lines`` (so the seed matters) and none in ``seqio_toy_lines_b``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import seqio  # as a user's module does: taskdata prepares the import (--seqio-task, Beam workers)
import tensorflow as tf

DATA = Path(__file__).resolve().parent / "data" / "seqio"
SPLITS = {"train": str(DATA / "train-*-of-00003.txt"), "validation": str(DATA / "validation-*-of-00002.txt")}
VOCAB = seqio.ByteVocabulary()
FEATURES = {"inputs": seqio.Feature(VOCAB, add_eos=False), "targets": seqio.Feature(VOCAB, add_eos=False)}


@seqio.map_over_dataset
def to_inputs_targets(line):
    words = tf.strings.split(line)
    return {"inputs": tf.strings.reduce_join(words[:2], separator=" "), "targets": line,
            "line_chars": tf.strings.length(line)}


@seqio.map_over_dataset(num_seeds=1)
def random_drop(example, seed):
    keep = tf.random.stateless_uniform(tf.shape(example["targets"]), seed=seed) > 0.3
    return {**example, "targets": tf.boolean_mask(example["targets"], keep)}


def lower_postprocess(text, example=None, is_target=False):
    del example, is_target
    return text.strip().lower()


def exact_match(targets, predictions):
    return {"exact_match": 100.0 * float(np.mean([t == p for t, p in zip(targets, predictions, strict=True)]))}


def mean_score(targets, scores):
    return {"mean_score": seqio.metrics.Scalar(float(np.mean(scores)))}


PREPROCESSORS = [to_inputs_targets, seqio.preprocessors.tokenize, random_drop, seqio.CacheDatasetPlaceholder()]

seqio.TaskRegistry.add(
    "seqio_toy_lines",
    source=seqio.TextLineDataSource(SPLITS),
    preprocessors=PREPROCESSORS,
    output_features=FEATURES,
    postprocess_fn=lower_postprocess,
    metric_fns=[exact_match, mean_score],
)
seqio.TaskRegistry.add(
    "seqio_toy_lines_b",
    source=seqio.TextLineDataSource(SPLITS),
    preprocessors=[to_inputs_targets, seqio.preprocessors.tokenize, seqio.CacheDatasetPlaceholder()],
    output_features=FEATURES,
)
seqio.MixtureRegistry.add("seqio_toy_mix", [("seqio_toy_lines", 1), ("seqio_toy_lines_b", 3)])
