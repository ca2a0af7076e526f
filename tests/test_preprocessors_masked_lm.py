"""MaskedLM: golden output, the 15% / 80-10-10 rule, what is never chosen, determinism."""

from __future__ import annotations

import numpy as np
import pytest

from taskdata.define.features import Feature
from taskdata.define.vocabularies import ByteVocabulary
from taskdata.preprocessors import MaskedLM, Rekey, Tokenize
from taskdata.preprocessors.base import ShardContext
from tests.preprocessor_helpers import ids, run, summary

BYTES = ByteVocabulary()  # <extra_id_0> = 383 is the default mask token
TEXTS = ["The quick brown fox jumps over the lazy dog.", "", "Pack my box with five dozen liquor jugs."]
PIPELINE = (Rekey({"inputs": "text", "targets": None}), Tokenize(), MaskedLM())


def context(seed=42, length=32, vocabulary=BYTES) -> ShardContext:
    features = {"inputs": Feature(vocabulary), "targets": Feature(vocabulary)}
    return ShardContext("golden", "train", 0, seed, {"inputs": length, "targets": length}, features)


# Golden values: produced once by running PIPELINE (seed 42, task 'golden', split 'train', shard 0,
# chunks of 32) and printing the ids; checked by hand: the documents (bytes + 3) each end in EOS (1),
# the empty one is gone, the chunks are the concatenation cut every 32 tokens, targets hold the
# original id where inputs were chosen (383 = mask, 74 and 199 random; none of these happens to be
# kept) and 0 elsewhere, and no EOS is chosen.
GOLDEN_SEED_42 = [
    (
        ids(
            "87 107 104 35 116 120 383 102 110 35 101 117 114 122 113 35 105 114 123 35 109 120 383 115 383 35 114 121"
            " 104 117 35 119"
        ),
        ids("0 0 0 0 0 0 108 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 112 0 118 0 0 0 0 0 0 0"),
        0,
        0,
    ),
    (
        ids(
            "107 104 35 111 383 125 124 35 103 114 106 49 1 83 100 102 110 35 112 383 35 74 114 123 35 122 199 119"
            " 107 35 105 108"
        ),
        ids("0 0 0 0 100 0 0 0 0 0 0 0 0 0 0 0 0 0 0 124 0 101 0 0 0 0 108 0 0 0 0 0"),
        0,
        2,
    ),
    (
        ids("383 104 35 103 114 125 383 113 383 383 108 116 120 114 117 35 109 120 106 118 49 1"),
        ids("121 0 0 0 0 0 104 0 35 111 0 0 0 0 0 0 0 0 0 0 0 0"),
        2,
        2,
    ),
]


def test_golden_output_of_masked_lm_pipeline():
    ctx = context(seed=42)
    assert summary(run(PIPELINE, ctx, [{"text": t} for t in TEXTS])) == GOLDEN_SEED_42
    assert ctx.counters == {"masked_lm/empty_documents_dropped": 1}


def test_same_seed_same_output_different_seed_different_output():
    records = [{"text": t} for t in TEXTS]
    first = summary(run(PIPELINE, context(seed=42), records))
    assert summary(run(PIPELINE, context(seed=42), records)) == first
    assert summary(run(PIPELINE, context(seed=43), records)) != first


def test_rates_and_what_is_never_chosen():
    rng = np.random.default_rng(0)
    documents = [
        {"inputs": rng.integers(3, 259, size=int(n)).astype(np.int32)} for n in rng.integers(1, 600, 2000)
    ]
    examples = run([MaskedLM(concat_batch_size=64)], context(length=128), documents)
    inputs = np.concatenate([e["inputs"] for e in examples])
    targets = np.concatenate([e["targets"] for e in examples])
    original = np.where(targets != 0, targets, inputs)  # unchosen positions are unchanged
    assert original.size == sum(d["inputs"].size + 1 for d in documents)
    assert (original == 1).sum() == len(documents)  # one EOS per document, never chosen
    chosen = targets != 0
    assert not chosen[original == 1].any()
    ordinary = original != 1
    assert abs(chosen.sum() / ordinary.sum() / 0.15 - 1) < 0.02
    masked = chosen & (inputs == 383)
    kept = chosen & (inputs == original)
    replaced = chosen & ~masked & ~kept
    assert abs(masked.sum() / chosen.sum() - 0.8) < 0.01
    assert abs(kept.sum() / chosen.sum() - 0.1 - 0.1 / 256) < 0.01  # a random token may equal the original
    assert abs(replaced.sum() / chosen.sum() - 0.1) < 0.01
    assert inputs[replaced].min() >= 3 and inputs[replaced].max() < BYTES.base_vocab_size


def test_chunks_are_sequence_length_except_the_last_of_each_concatenation():
    documents = [{"inputs": np.full(n, 7, dtype=np.int32)} for n in (10, 20, 30, 40)]
    examples = run([MaskedLM(concat_batch_size=2)], context(length=16), documents)
    # Concatenations: 11 + 21 = 32 tokens -> 16, 16; 31 + 41 = 72 -> 16, 16, 16, 16, 8.
    assert [len(e["inputs"]) for e in examples] == [16, 16, 16, 16, 16, 16, 8]
    assert [(e["_source_first"], e["_source_last"]) for e in examples] == [
        (0, 1),
        (1, 1),
        (2, 2),
        (2, 3),
        (3, 3),
        (3, 3),
        (3, 3),
    ]


def test_mask_token_can_be_chosen_and_defaults_need_extra_ids():
    examples = run(
        [MaskedLM(mask_token=2, random_rate=0.0, keep_rate=0.0)],
        context(),
        [{"inputs": np.full(500, 9, dtype=np.int32)}],
    )
    inputs = np.concatenate([e["inputs"] for e in examples])
    assert set(np.unique(inputs).tolist()) == {1, 2, 9}
    with pytest.raises(
        ValueError, match=r"default mask token is <extra_id_0> but the 'inputs' vocabulary has no extra ids"
    ):
        MaskedLM()(iter([]), context(vocabulary=ByteVocabulary(extra_ids=0)))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mask_rate": 1.0}, r"mask_rate must be in \(0, 1\)"),
        ({"random_rate": 0.6, "keep_rate": 0.6}, r"sum <= 1"),
        ({"mask_token": -1}, r"mask_token must be a non-negative id"),
    ],
)
def test_invalid_parameters_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MaskedLM(**kwargs)
