"""ConcatenateAndChunk: lossless decoder-only rows, checked as properties over random documents."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskdata.cache.shuffle import shuffle_keys
from taskdata.define.features import Feature
from taskdata.define.vocabularies import EOS_ID, ByteVocabulary
from taskdata.preprocessors import ConcatenateAndChunk
from taskdata.preprocessors import concat_chunk as module
from taskdata.preprocessors.base import ShardContext

BYTES = ByteVocabulary()
STAGE = "concatenate_and_chunk"


def context(length: int, seed: int = 0, add_eos: bool = True) -> ShardContext:
    return ShardContext("lm", "train", 3, seed, {"targets": length}, {"targets": Feature(BYTES, add_eos=add_eos)})


def chunk(documents: list[list[int]], length: int, seed: int = 0) -> tuple[list[dict], ShardContext]:
    ctx = context(length, seed)
    records = [{"targets": np.array(d, dtype=np.int32), "_source_index": i} for i, d in enumerate(documents)]
    return list(ConcatenateAndChunk()(iter(records), ctx)), ctx


# Token ids 3..299 (never PAD 0 or EOS 1): a document's EOS is the one the chunker adds.
documents_strategy = st.lists(st.lists(st.integers(3, 299), max_size=40), max_size=30)


@settings(max_examples=80, deadline=None)
@given(documents=documents_strategy, length=st.integers(1, 33))
def test_rows_are_the_documents_joined_with_eos_and_only_the_last_partial_row_is_dropped(documents, length):
    rows, ctx = chunk(documents, length)
    stream = [t for d in documents if d for t in [*d, EOS_ID]]
    kept = len(stream) // length * length
    assert all(row["targets"].shape == (length,) and row["targets"].dtype == np.int32 for row in rows)
    assert [t for row in rows for t in row["targets"].tolist()] == stream[:kept]
    tail = len(stream) - kept
    assert ctx.counters[f"{STAGE}/final_partial_row_tokens_dropped"] == tail
    assert ctx.counters[f"{STAGE}/final_partial_rows_dropped"] == (1 if tail else 0)
    assert ctx.counters[f"{STAGE}/empty_documents_dropped"] == sum(1 for d in documents if not d)
    # The documents the tail would have held: the one it starts in and every one after it.
    assert ctx.counters[f"{STAGE}/final_partial_row_documents"] == (stream[kept:].count(EOS_ID) if tail else 0)


@settings(max_examples=80, deadline=None)
@given(documents=documents_strategy, length=st.integers(1, 33))
def test_concatenating_the_segments_gives_back_every_document_in_order(documents, length):
    rows, _ = chunk(documents, length)
    pieces: list[list[int]] = []  # segments, joined across a row boundary when a document goes on
    for row in rows:
        tokens, segments = row["targets"].tolist(), row["targets_segment_ids"].tolist()
        for segment in range(1, max(segments) + 1):
            piece = [t for t, s in zip(tokens, segments, strict=True) if s == segment]
            if segment == 1 and pieces and pieces[-1][-1] != EOS_ID:
                pieces[-1] += piece  # the previous row's last document goes on here
            else:
                pieces.append(piece)
    whole = [p[:-1] for p in pieces if p[-1] == EOS_ID]
    expected = [d for d in documents if d]
    assert whole == expected[: len(whole)]
    if len(whole) < len(expected) and pieces and pieces[-1][-1] != EOS_ID:  # a document cut by the tail
        assert expected[len(whole)][: len(pieces[-1])] == pieces[-1]


@settings(max_examples=80, deadline=None)
@given(documents=documents_strategy, length=st.integers(1, 33))
def test_segment_ids_positions_and_sources_agree_with_the_document_ends(documents, length):
    rows, _ = chunk(documents, length)
    nonempty = [i for i, d in enumerate(documents) if d]
    document = 0  # index into ``nonempty`` of the document the next token belongs to
    for row in rows:
        tokens = row["targets"].tolist()
        segments = row["targets_segment_ids"].tolist()
        positions = row["targets_positions"].tolist()
        assert segments[0] == 1 and positions[0] == 0
        assert row["_source_first"] == nonempty[document]
        for i in range(1, length):
            new_document = tokens[i - 1] == EOS_ID  # a new segment starts exactly after an EOS
            assert segments[i] == segments[i - 1] + new_document
            assert positions[i] == (0 if new_document else positions[i - 1] + 1)
        document += tokens.count(EOS_ID)
        # The last token is the EOS of the document counted last, or a token of the next one.
        assert row["_source_last"] == nonempty[document - 1 if tokens[-1] == EOS_ID else document]


def test_rows_do_not_depend_on_the_seed_and_the_cache_order_does():
    documents = [list(range(3, 3 + n)) for n in (5, 17, 2, 30, 9, 11, 4, 25)]
    rows_a, _ = chunk(documents, 8, seed=0)
    rows_b, _ = chunk(documents, 8, seed=1)
    assert [r["targets"].tolist() for r in rows_a] == [r["targets"].tolist() for r in rows_b]
    # The rows' order in the cache is their shuffle keys' (taskdata.cache.shuffle): the same seed the same
    # order, another seed another order.
    def order(seed: int) -> list[int]:
        keys = shuffle_keys(seed, "lm", "train", 3, 0, len(rows_a))
        return np.argsort(keys, kind="stable").tolist()

    assert order(0) == order(0)
    assert order(0) != order(1)
    assert sorted(order(0)) == sorted(order(1)) == list(range(len(rows_a)))


@pytest.mark.parametrize("per_cut", [1, 2, 64])
def test_rows_do_not_depend_on_how_many_are_cut_at_once(monkeypatch, per_cut):
    documents = [list(range(3, 3 + n)) for n in (50, 1, 7, 120, 3, 64, 64, 5)] * 3
    expected, _ = chunk(documents, 16)
    monkeypatch.setattr(module, "_ROWS_PER_CUT", per_cut)
    rows, _ = chunk(documents, 16)
    for a, b in zip(rows, expected, strict=True):
        assert a.keys() == b.keys()
        assert all(np.array_equal(a[k], b[k]) for k in a if not k.startswith("_"))
        assert (a["_source_first"], a["_source_last"]) == (b["_source_first"], b["_source_last"])


def test_golden_rows():
    rows, ctx = chunk([[5, 6, 7], [], [8], [9, 10, 11, 12, 13]], 4)
    assert [(r["targets"].tolist(), r["targets_segment_ids"].tolist(), r["targets_positions"].tolist(),
             r["_source_first"], r["_source_last"]) for r in rows] == [
        ([5, 6, 7, 1], [1, 1, 1, 1], [0, 1, 2, 3], 0, 0),
        ([8, 1, 9, 10], [1, 1, 2, 2], [0, 1, 0, 1], 2, 3),
        ([11, 12, 13, 1], [1, 1, 1, 1], [0, 1, 2, 3], 3, 3),
    ]
    assert dict(ctx.counters) == {f"{STAGE}/empty_documents_dropped": 1}


def test_errors_name_the_task_and_the_fix():
    records = [{"targets": np.array([4, 5], dtype=np.int32), "_source_index": 0}]
    with pytest.raises(KeyError, match=r"ConcatenateAndChunk in task 'lm' needs sequence_length\['targets'\]"):
        list(ConcatenateAndChunk()(iter(records), ShardContext("lm", "train", 0, 0, {}, {"targets": Feature(BYTES)})))
    with pytest.raises(ValueError, match=r"declared with add_eos=False. Declare it with add_eos=True"):
        list(ConcatenateAndChunk()(iter(records), context(4, add_eos=False)))
    with pytest.raises(KeyError, match=r"'text' is not an output feature \(they are \['targets'\]\)"):
        ctx = ShardContext("lm", "train", 0, 0, {"text": 4}, {"targets": Feature(BYTES)})
        list(ConcatenateAndChunk("text")(iter(records), ctx))
    with pytest.raises(TypeError, match=r"Put Tokenize\(\) before ConcatenateAndChunk"):
        list(ConcatenateAndChunk()(iter([{"targets": "text", "_source_index": 0}]), context(4)))
    with pytest.raises(ValueError, match=r"feature must be the name of an output feature"):
        ConcatenateAndChunk("_meta")


def test_the_builtin_c4_lm_task_is_bpe_tokenized_documents_in_rows_of_512(tmp_path):
    from taskdata.config import Config
    from taskdata.define.hf_vocabulary import HuggingFaceVocabulary
    from taskdata.define.registry import Registry
    from taskdata.preprocessors import Rekey, Tokenize
    from taskdata.tasks import register_builtin_tasks

    registry = Registry()
    register_builtin_tasks(registry, Config(home=str(tmp_path)))
    task = registry.get_task("c4_lm")
    assert [type(p) for p in task.preprocessors] == [Rekey, Tokenize, ConcatenateAndChunk]
    assert dict(task.sequence_length) == {"targets": 512}
    assert isinstance(task.output_features["targets"].vocabulary, HuggingFaceVocabulary)
    assert task.output_features["targets"].add_eos
    assert not any(tmp_path.iterdir())  # nothing is built before it is used
