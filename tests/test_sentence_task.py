"""The built-in sentence-level prefix LM and its packed variant, built by the command line on a small C4 folder."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from taskdata.cache.format import current_version, load_manifest
from taskdata.define.registry import Registry
from taskdata.preprocessors import SplitSentences
from taskdata.preprocessors.base import ShardContext
from taskdata.tasks import register_builtin_tasks
from tests.cache_helpers import examples_by_id


def test_split_sentences_gives_one_example_per_sentence_and_keeps_the_document_index():
    ctx = ShardContext("t", "train", 0, 0, {}, {})
    documents = [{"targets": 'One. "Two?" Three!  Four (five.)\nSix', "_source_index": 0},
                 {"targets": "   ", "_source_index": 1}]
    out = list(SplitSentences()(iter(documents), ctx))
    assert [e["targets"] for e in out] == ["One.", '"Two?"', "Three!", "Four (five.)", "Six"]
    assert {e["_source_index"] for e in out} == {0}
    assert ctx.counters == {"split_sentences/empty_documents": 1}
    with pytest.raises(TypeError, match="Put SplitSentences before Tokenize"):
        list(SplitSentences()(iter([{"targets": np.zeros(3, np.int32)}]), ctx))


def test_the_sentence_task_and_its_packed_variant_are_built_in():
    registry = Registry()
    register_builtin_tasks(registry)
    plain, packed = registry.get_task("c4_sentence_prefix_lm"), registry.get_task("c4_sentence_prefix_lm_packed")
    assert plain.packing is None and packed.packing_lengths == {"inputs": 256, "targets": 256}
    assert packed.preprocessors == plain.preprocessors


def _cache(folder, vocab, task, *extra):
    from taskdata.cli import main

    root = folder / "caches" / "_".join([task, *(e.strip("-") for e in extra)])
    assert main(["cache", "--task", task, "--c4-dir", str(folder), "--vocab", vocab, "--output", str(root),
                 "--home", str(folder / "home"), "--num-shards", "2", "--split", "train", "--quiet", *extra]) == 0
    return current_version(str(root / task))


@pytest.mark.slow
def test_pack_on_the_command_line_stores_the_same_sentences_in_far_fewer_rows(c4_folder, tiny_sp_model, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parent.parent) + os.pathsep
                       + os.environ.get("PYTHONPATH", ""))
    plain = _cache(c4_folder, tiny_sp_model, "c4_sentence_prefix_lm")
    packed = _cache(c4_folder, tiny_sp_model, "c4_sentence_prefix_lm", "--pack")
    examples = examples_by_id(plain)
    assert examples_by_id(packed) == examples  # sequence lengths: nothing is trimmed
    counters = load_manifest(packed).split("train").counters
    assert counters["packing/examples"] == len(examples) > 200
    assert counters["packing/rows"] * 5 < len(examples)
    tokens = counters["packing/inputs_tokens"] + counters["packing/targets_tokens"]
    # Unpacked, the same tokens would fill ~12% of their rows; packed, most of the rows' tokens are real
    # (the last open rows of each shard's ~160 examples are part-filled).
    assert tokens / (counters["packing/rows"] * 512) > 0.8 > 0.2 > tokens / (len(examples) * 512)
    variant = _cache(c4_folder, tiny_sp_model, "c4_sentence_prefix_lm_packed")
    assert load_manifest(variant).packing == load_manifest(packed).packing
    assert load_manifest(variant).split("train").counters["packing/examples"] == len(examples)
