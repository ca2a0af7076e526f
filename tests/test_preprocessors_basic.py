"""Rekey, Tokenize, AppendEos, AppendEosAfterTrim, Trim, Filter, FilterEmpty."""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest

from taskdata.define.features import Feature
from taskdata.define.vocabularies import ByteVocabulary, SentencePieceVocabulary
from taskdata.fingerprint import fingerprint
from taskdata.preprocessors import (
    AppendEos,
    AppendEosAfterTrim,
    Filter,
    FilterEmpty,
    Rekey,
    Tokenize,
    Trim,
)
from taskdata.preprocessors.base import ShardContext

BYTES = ByteVocabulary()


def context(lengths=None, features=None) -> ShardContext:
    features = features or {"inputs": Feature(BYTES), "targets": Feature(BYTES)}
    return ShardContext("toy", "train", 0, 1, lengths or {}, features)


def run(preprocessor, ctx, examples):
    return list(preprocessor(iter(examples), ctx))


def arr(*values):
    return np.array(values, dtype=np.int32)


def test_rekey_renames_keeps_metadata_and_fills_none_with_empty_text():
    out = run(
        Rekey({"inputs": None, "targets": "text"}),
        context(),
        [{"text": "hi", "url": "u", "_source_index": 4}],
    )
    assert out == [{"inputs": "", "targets": "hi", "_source_index": 4}]


def test_rekey_missing_field_names_it_and_the_record():
    with pytest.raises(KeyError, match=r"source record 0 has no 'body' field to rename to 'targets'"):
        run(Rekey({"targets": "body"}), context(), [{"text": "x", "_source_index": 0}])


def test_rekey_copies_its_mapping_and_fingerprints_it():
    mapping = {"targets": "text"}
    rekey = Rekey(mapping)
    mapping["targets"] = "other"
    assert dict(rekey.mapping) == {"targets": "text"}
    assert (
        fingerprint(rekey)
        == fingerprint(Rekey({"targets": "text"}))
        != fingerprint(Rekey({"targets": "body"}))
    )


def test_tokenize_encodes_text_features_and_keeps_text_on_request():
    examples = [{"inputs": "ab", "targets": "", "other": "left alone", "_source_index": 0}]
    out = run(Tokenize(keep_text=True), context(), examples)
    assert out[0]["inputs"].tolist() == [100, 101] and out[0]["inputs"].dtype == np.int32
    assert out[0]["targets"].tolist() == []
    assert out[0]["inputs_pretokenized"] == "ab" and out[0]["other"] == "left alone"
    assert examples[0]["inputs"] == "ab"  # the input example is not modified
    assert "inputs_pretokenized" not in run(Tokenize(), context(), examples)[0]


def test_tokenize_in_batches_equals_one_by_one_with_sentencepiece(tiny_sp_model):
    vocabulary = SentencePieceVocabulary(tiny_sp_model)
    ctx = context(features={"targets": Feature(vocabulary)})
    texts = [
        f"Document {i}: the quick brown fox {'jumps ' * (i % 7)}over the lazy dog." for i in range(50)
    ] + [""]
    batched = run(Tokenize(batch_size=16), ctx, [{"targets": t} for t in texts])
    assert [e["targets"].tolist() for e in batched] == [vocabulary.encode(t).tolist() for t in texts]
    assert fingerprint(Tokenize(batch_size=16)) == fingerprint(Tokenize())  # speed only, same output


def test_tokenize_encodes_empty_texts_like_any_other_text(tiny_sp_model):
    # Empty texts are encoded once per batch (T5's objectives Rekey "inputs" to ""); the output is the same.
    vocabulary = SentencePieceVocabulary(tiny_sp_model)
    ctx = context(features={"inputs": Feature(vocabulary), "targets": Feature(vocabulary)})
    texts = ["", "the quick brown fox", "", "", "over the lazy dog", "", "a", ""]
    examples = [{"inputs": "", "targets": t, "_source_index": i} for i, t in enumerate(texts)]
    out = run(Tokenize(batch_size=3), ctx, examples)
    assert [e["targets"].tolist() for e in out] == [vocabulary.encode(t).tolist() for t in texts]
    assert all(e["inputs"].tolist() == [] and e["inputs"].dtype == np.int32 for e in out)
    assert [e["_source_index"] for e in out] == list(range(len(texts)))
    out[0]["inputs"].resize(3, refcheck=False)  # every example owns its array
    assert out[2]["inputs"].tolist() == []


class _CountingVocabulary(ByteVocabulary):
    """Bytes, counting the batches encoded; fails on the text "boom"."""

    def __init__(self) -> None:
        super().__init__()
        self.batches = 0
        self.second_batch = threading.Event()

    def encode_batch(self, texts):
        self.batches += 1
        if self.batches == 2:
            self.second_batch.set()
        if "boom" in texts:
            raise ValueError("cannot encode 'boom'")
        return super().encode_batch(texts)


def test_tokenize_encodes_the_next_batch_ahead_and_stops_with_its_consumer():
    vocabulary = _CountingVocabulary()
    ctx = context(features={"targets": Feature(vocabulary)})
    stream = Tokenize(batch_size=2, batches_ahead=1)(iter([{"targets": str(i)} for i in range(10)]), ctx)
    assert next(stream)["targets"].tolist() == [ord("0") + 3]
    # Batch 2 was handed to the helper thread before batch 1 was yielded: it is encoded without a further read.
    assert vocabulary.second_batch.wait(timeout=30)
    stream.close()  # an abandoned stream waits for its helper thread and encodes nothing more
    assert vocabulary.batches == 2


def test_tokenize_hands_batches_ahead_before_the_first_example_and_cancels_them_when_abandoned():
    reads = []
    texts = iter([{"targets": str(i)} for i in range(20)])
    source = (reads.append(example) or example for example in texts)
    vocabulary = _CountingVocabulary()
    stream = Tokenize(batch_size=2, batches_ahead=3)(source, context(features={"targets": Feature(vocabulary)}))
    assert next(stream)["targets"].tolist() == [ord("0") + 3]
    assert len(reads) == 7  # batches 1..4 (of 1, 2, 2, 2) read, 3 ahead of the one being yielded; nothing after
    stream.close()
    assert vocabulary.batches <= 4  # the helper stopped with its consumer; nothing more was read
    assert len(reads) == 7
    outputs = run(Tokenize(batch_size=3, batches_ahead=5), context(features={"targets": Feature(BYTES)}),
                  [{"targets": str(i)} for i in range(17)])
    assert [e["targets"].tolist() for e in outputs] == [[ord(c) + 3 for c in str(i)] for i in range(17)]


class _SizesVocabulary(ByteVocabulary):
    """Bytes, recording how many texts each call encodes."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def encode_batch(self, texts):
        self.sizes.append(len(texts))
        return super().encode_batch(texts)


def test_tokenize_starts_with_small_batches_so_the_helper_starts_early_and_the_output_is_the_same():
    vocabulary = _SizesVocabulary()
    texts = [f"text {i}" for i in range(700)]
    out = run(Tokenize(batch_size=64), context(features={"targets": Feature(vocabulary)}),
              [{"targets": t} for t in texts])
    # An eighth of the batch size first, doubling up to it.
    assert vocabulary.sizes == [8, 16, 32, *[64] * 10, 700 - 56 - 640]
    assert [e["targets"].tolist() for e in out] == [[ord(c) + 3 for c in t] for t in texts]
    tiny = _SizesVocabulary()
    run(Tokenize(batch_size=3), context(features={"targets": Feature(tiny)}), [{"targets": "x"}] * 8)
    assert tiny.sizes == [1, 2, 3, 2]


@pytest.mark.parametrize("value", [0, -1, True, 1.5])
def test_tokenize_refuses_a_batches_ahead_that_is_not_a_positive_integer(value):
    with pytest.raises(ValueError, match=f"Tokenize: batches_ahead must be a positive integer but got {value!r}"):
        Tokenize(batches_ahead=value)


def test_an_encoding_error_in_the_helper_thread_reaches_the_stream_reader():
    ctx = context(features={"targets": Feature(_CountingVocabulary())})
    stream = Tokenize(batch_size=2)(iter([{"targets": t} for t in ["a", "b", "c", "boom", "d"]]), ctx)
    # Batches [a], [b, c], [boom, d]: the examples before the failing batch arrive, then its error.
    assert [e["targets"].tolist() for e in itertools.islice(stream, 3)] == [[100], [101], [102]]
    with pytest.raises(ValueError, match="cannot encode 'boom'"):
        next(stream)


def test_append_eos_only_to_features_with_add_eos():
    features = {"inputs": Feature(BYTES, add_eos=False), "targets": Feature(BYTES, add_eos=True)}
    out = run(AppendEos(), context(features=features), [{"inputs": arr(5, 6), "targets": arr(7)}])
    assert out[0]["inputs"].tolist() == [5, 6] and out[0]["targets"].tolist() == [7, 1]


def test_append_eos_after_trim_keeps_eos_within_the_length_and_counts():
    ctx = context(lengths={"inputs": 3, "targets": 5})
    out = run(AppendEosAfterTrim(), ctx, [{"inputs": arr(5, 6, 7, 8), "targets": arr(9, 10)}])
    assert out[0]["inputs"].tolist() == [5, 6, 1] and out[0]["targets"].tolist() == [9, 10, 1]
    assert ctx.counters == {
        "append_eos_after_trim/inputs_examples_trimmed": 1,
        "append_eos_after_trim/inputs_tokens_trimmed": 2,
    }


def test_append_eos_after_trim_on_text_names_the_missing_step():
    with pytest.raises(
        TypeError, match=r"feature 'targets' must be a token array but got str\. Put Tokenize\(\)"
    ):
        run(AppendEosAfterTrim(), context(), [{"targets": "text"}])


def test_trim_cuts_to_sequence_length_and_counts():
    ctx = context(lengths={"inputs": 2})
    out = run(Trim(), ctx, [{"inputs": arr(1, 2, 3), "targets": arr(4, 5, 6)}, {"inputs": arr(1)}])
    assert [e["inputs"].tolist() for e in out] == [[1, 2], [1]] and out[0]["targets"].tolist() == [4, 5, 6]
    assert ctx.counters == {"trim/inputs_examples_trimmed": 1, "trim/inputs_tokens_trimmed": 1}


def is_short(example) -> bool:
    return len(example["targets"]) < 3


def test_filter_keeps_matching_and_counts_the_rest():
    ctx = context()
    out = run(Filter(is_short), ctx, [{"targets": arr(1)}, {"targets": arr(1, 2, 3)}, {"targets": arr()}])
    assert len(out) == 2 and ctx.counters == {"filter/is_short": 1}


def test_filter_empty_drops_and_counts_and_rejects_unknown_features():
    ctx = context()
    examples = [
        {"inputs": "", "targets": arr(1)},
        {"inputs": "x", "targets": arr()},
        {"inputs": "x", "targets": arr(2)},
    ]
    assert len(run(FilterEmpty(("inputs", "targets")), ctx, examples)) == 1
    assert ctx.counters == {"filter_empty/inputs": 1, "filter_empty/targets": 1}
    with pytest.raises(KeyError, match=r"no 'target' feature .* Fix FilterEmpty\(features=...\)"):
        run(FilterEmpty("target"), ctx, examples)
