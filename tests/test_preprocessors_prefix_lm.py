"""PrefixLM: golden output, T5's chunking and split rule, determinism with a negative control."""

from __future__ import annotations

import numpy as np
import pytest

from taskdata.define.features import Feature
from taskdata.define.vocabularies import ByteVocabulary
from taskdata.preprocessors import AppendEosAfterTrim, PrefixLM, Rekey, Tokenize, prefix_lm
from taskdata.preprocessors.base import ShardContext
from tests.preprocessor_helpers import ids, run, summary

BYTES = ByteVocabulary()
TEXTS = ["The quick brown fox jumps over the lazy dog.", "", "Pack my box with five dozen liquor jugs."]
PIPELINE = (Rekey({"inputs": None, "targets": "text"}), Tokenize(), PrefixLM(), AppendEosAfterTrim())


def context(seed=42, inputs_length=32, add_eos=True) -> ShardContext:
    features = {"inputs": Feature(BYTES, add_eos=add_eos), "targets": Feature(BYTES, add_eos=add_eos)}
    return ShardContext("golden", "train", 0, seed, {"inputs": inputs_length, "targets": 32}, features)


# Golden values: produced once by running PIPELINE (seed 42, task 'golden', split 'train', shard 0,
# inputs 32 with EOS -> chunks of 31 tokens) and printing the ids; checked by hand: each document is
# split into chunks of 31 tokens and each chunk's inputs + targets (without EOS) give it back.
GOLDEN_SEED_42 = [
    (
        ids("87 107 1"),
        ids(
            "104 35 116 120 108 102 110 35 101 117 114 122 113 35 105 114 123 35 109 120 112 115 118 35"
            " 114 121 104 117 35 1"
        ),
        0,
        0,
    ),
    (ids("119 107 104 35 111 100 125 1"), ids("124 35 103 114 106 49 1"), 0, 0),
    (
        ids(
            "83 100 102 110 35 112 124 35 101 114 123 35 122 108 119 107 35 105 108 121 104 35 103 114 125 104 113 35"
            " 111 108 1"
        ),
        ids("116 1"),
        2,
        2,
    ),
    (ids("120 1"), ids("114 117 35 109 120 106 118 49 1"), 2, 2),
]


def test_golden_output_of_prefix_lm_pipeline():
    ctx = context(seed=42)
    assert summary(run(PIPELINE, ctx, [{"text": t} for t in TEXTS])) == GOLDEN_SEED_42
    assert ctx.counters == {"prefix_lm/empty_documents_dropped": 1}


def test_same_seed_same_output_different_seed_different_output():
    records = [{"text": t} for t in TEXTS]
    first = summary(run(PIPELINE, context(seed=42), records))
    assert summary(run(PIPELINE, context(seed=42), records)) == first
    assert summary(run(PIPELINE, context(seed=7), records)) != first


def test_documents_are_split_without_concatenation_and_every_split_point_is_inside():
    lengths = [1, 2, 31, 32, 100]
    documents = [{"targets": np.arange(3, 3 + n, dtype=np.int32)} for n in lengths]
    examples = run([PrefixLM()], context(), documents)
    chunks = [np.concatenate([e["inputs"], e["targets"]]).tolist() for e in examples]
    expected = []
    for n in lengths:
        tokens = list(range(3, 3 + n))
        expected += [tokens[i : i + 31] for i in range(0, n, 31)]
    assert chunks == expected
    for example in examples:
        n = len(example["inputs"]) + len(example["targets"])
        # T5's random_prefix_noise_mask: prefix length uniform in [min(n - 1, 1), n - 1].
        assert min(n - 1, 1) <= len(example["inputs"]) <= n - 1
        assert example["_source_first"] == example["_source_last"]


def test_chunks_fill_the_inputs_length_when_inputs_get_no_eos():
    examples = run(
        [PrefixLM()],
        context(inputs_length=16, add_eos=False),
        [{"targets": np.arange(3, 40, dtype=np.int32)}],
    )
    assert [len(e["inputs"]) + len(e["targets"]) for e in examples] == [16, 16, 5]


def test_split_points_are_uniform():
    document = {"targets": np.arange(3, 3 + 11 * 2000, dtype=np.int32) % 200 + 3}
    examples = run([PrefixLM()], context(inputs_length=12), [document])  # 2000 chunks of 11 tokens
    counts = np.bincount([len(e["inputs"]) for e in examples], minlength=11)[1:]
    assert counts.size == 10 and np.abs(counts - 200).max() < 5 * np.sqrt(200)


def test_missing_inputs_length_is_an_error_naming_the_task():
    ctx = ShardContext("golden", "train", 0, 1, {"targets": 32}, {"targets": Feature(BYTES)})
    with pytest.raises(KeyError, match=r"PrefixLM in task 'golden' needs sequence_length\['inputs'\]"):
        PrefixLM()(iter([]), ctx)


@pytest.mark.parametrize("window", [1, 3, 10_000])
def test_output_does_not_depend_on_how_documents_are_batched(monkeypatch, window):
    rng = np.random.default_rng(5)
    documents = [
        {"targets": rng.integers(3, 250, size=int(n)).astype(np.int32)} for n in rng.integers(0, 90, 40)
    ]
    reference = summary(run([PrefixLM()], context(), documents))
    monkeypatch.setattr(prefix_lm, "_WINDOW", window)
    assert summary(run([PrefixLM()], context(), documents)) == reference
