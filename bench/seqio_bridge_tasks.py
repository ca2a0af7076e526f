"""The seqio task of ``bench_seqio_bridge.py``: T5-style span corruption written with seqio and TensorFlow ops.

Both jobs import this module by name (their Beam workers too), reading the data folder and the vocabulary
from ``$BENCH_SEQIO_DATA`` and ``$BENCH_SEQIO_VOCAB`` (bench code: the library never reads the environment).
Every line of the text files is one document: tokenized, cut to 568 tokens, and span-corrupted with a noise
density of 0.15 (i.i.d. noise tokens, each run of noise replaced by one sentinel, T5's
``noise_span_to_unique_sentinel``), then EOS appended, all before the ``CacheDatasetPlaceholder``.
"""

from __future__ import annotations

import functools
import os

import seqio  # as a user's module does; taskdata (and the bench, for seqio's job) prepares the import
import tensorflow as tf

TASK = "bench_span_corruption"
TOKENS = 568  # T5: 512 input tokens after corruption


@seqio.map_over_dataset
def to_targets(line):
    return {"targets": line}


@seqio.map_over_dataset
def cut_targets(example):
    return {"targets": example["targets"][:TOKENS]}


def _to_unique_sentinel(tokens, noise, vocab_size):
    previous_noise = tf.pad(noise[:-1], [[1, 0]])
    first = tf.logical_and(noise, tf.logical_not(previous_noise))
    subsequent = tf.logical_and(noise, previous_noise)
    sentinel = vocab_size - tf.cumsum(tf.cast(first, tokens.dtype))
    return tf.boolean_mask(tf.where(first, sentinel, tokens), tf.logical_not(subsequent))


def span_corrupt(dataset, output_features):
    vocab_size = output_features["targets"].vocabulary.vocab_size

    @seqio.map_over_dataset(num_seeds=1)
    def corrupt(example, seed):
        tokens = example["targets"]
        noise = tf.random.stateless_uniform(tf.shape(tokens), seed=seed) < 0.15
        return {"inputs": _to_unique_sentinel(tokens, noise, vocab_size),
                "targets": _to_unique_sentinel(tokens, tf.logical_not(noise), vocab_size)}

    return corrupt(dataset)


if "BENCH_SEQIO_DATA" in os.environ and TASK not in seqio.TaskRegistry.names():
    vocabulary = seqio.SentencePieceVocabulary(os.environ["BENCH_SEQIO_VOCAB"], extra_ids=100)
    seqio.TaskRegistry.add(
        TASK,
        source=seqio.TextLineDataSource({"train": os.path.join(os.environ["BENCH_SEQIO_DATA"], "train-*.txt")}),
        preprocessors=[to_targets, functools.partial(seqio.preprocessors.tokenize, copy_pretokenized=False),
                       cut_targets, span_corrupt, seqio.preprocessors.append_eos, seqio.CacheDatasetPlaceholder()],
        output_features={"inputs": seqio.Feature(vocabulary), "targets": seqio.Feature(vocabulary)},
    )
